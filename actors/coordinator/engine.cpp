// The coordinator's side of round_engine: each call a policy makes becomes a request to a worker, the outer
// optimizer or the communicator, answered on the coordinator.
#include <ATen/ATen.h>

#include <algorithm>

#include "actors/cluster_link.hpp"
#include "actors/coordinator/state.hpp"
#include "actors/round/adaptive_steps.hpp"
#include "runtime/log/log.hpp"

namespace longwave::actors::coordinator_parts {

using namespace longwave::runtime;

template <class T, class Handle, class... Ts>
void coordinator_engine::ask(const Handle& to, caf::timespan timeout, then<T> k, Ts&&... xs) {
  auto self = self_;
  self->request(to, timeout, std::forward<Ts>(xs)...)
      .then([k](T& answer) { k(std::move(answer)); },
            [self](caf::error& e) { coordinator_parts::fail(self, e); });
}

const run_context& coordinator_engine::context() const {
  return *self_->state.ctx;
}
uint64_t coordinator_engine::rounds_done() const {
  return self_->state.round;
}
bool coordinator_engine::stop_requested() const {
  return self_->state.stop_requested;
}
phase coordinator_engine::current_phase() const {
  return self_->state.ph;
}
bool coordinator_engine::set_phase(phase to) {
  return coordinator_parts::set_phase(self_, to);
}
void coordinator_engine::fail(const caf::error& e) {
  coordinator_parts::fail(self_, e);
}
void coordinator_engine::stop_now(bool boundary) {
  coordinator_parts::stop_now(self_, boundary);
}
void coordinator_engine::round_done(at::Tensor theta) {
  after_round(self_, std::move(theta));
}
void coordinator_engine::run_trained(at::Tensor theta) {
  eval_then_continue(self_, std::move(theta));
}
inflight_reduces& coordinator_engine::reduces() {
  return self_->state.reduces;
}

// ---- workers ---------------------------------------------------------------------------------------------

namespace {

/// diloco.adaptive_steps: the round's inner steps for this node, from its own step time and the fastest
/// node's (the notes of the last all-reduce); a change is logged.
int64_t choose_steps(self_ptr self, uint64_t round) {
  auto& s = self->state;
  const auto& cfg = s.ctx->cfg;
  const int64_t H = cfg.train.inner_steps;
  const auto notes = s.peers.collective ? s.peers.collective->notes() : std::vector<comm::rank_note>{};
  const double fastest = fastest_step(notes, s.step_seconds);
  const int64_t h = adaptive_steps(H, cfg.diloco.step_floor(H), s.step_seconds, fastest);
  if (h != (s.round_steps > 0 ? s.round_steps : H))
    spdlog::info(
        "adaptive steps: round {} runs {} of {} inner steps on this node (its step {:.3g} s, the fastest "
        "node's {:.3g} s)",
        round, h, H, s.step_seconds, fastest);
  return h;
}

/// diloco.adaptive_steps: this node's seconds per inner step in the round just run, and its note for the
/// round's all-reduce (its workers and that time), which tells the other nodes.
void measure_round(self_ptr self, int64_t h, clock::time_point began) {
  auto& s = self->state;
  if (h > 0)
    s.step_seconds = std::chrono::duration<double>(clock::now() - began).count() / static_cast<double>(h);
  if (s.peers.collective)
    s.peers.collective->set_note(
        {h > 0 ? static_cast<float>(s.workers.size()) : 0.0f, static_cast<float>(s.step_seconds)});
}

}  // namespace

void coordinator_engine::run_workers(uint64_t round, std::vector<at::Tensor> thetas,
                                     std::vector<int64_t> steps, bool reset, int64_t fragment,
                                     then<results> k) {
  auto self = self_;
  const auto timeout = self->state.round_timeout;
  const bool adaptive = self->state.ctx->cfg.diloco.adaptive_steps;
  if (round == self->state.ctx->observe_round)
    steps = {0};  // a joiner's first round: it only observes
  else if (adaptive && steps.size() == 1)
    steps = {choose_steps(self, round)};
  const auto n = static_cast<int64_t>(self->state.workers.size());
  self->state.reporting_workers =
      steps.size() == 1 ? n : std::count_if(steps.begin(), steps.end(), [](int64_t k) { return k > 0; });
  if (adaptive && steps.size() == 1) {
    const int64_t h = steps[0];
    self->state.round_steps = h;
    k = [self, h, began = clock::now(), k](results r) {
      measure_round(self, h, began);
      k(std::move(r));
    };
  }
  k = [self, k = std::move(k)](results r) {
    for (const auto& w : r)
      if (auto& h = self->state.round_host; static_cast<size_t>(w.rank) < h.size()) {
        h[w.rank].load += w.load_s, h[w.rank].delta += w.delta_s, h[w.rank].round += w.round_s;
      }
    k(std::move(r));
  };
  gather_each<round_result>(self, std::move(k), [=](size_t i) {
    return self->request(self->state.workers[i], timeout, run_atom_v, round,
                         thetas.size() == 1 ? thetas[0] : thetas[i], steps.size() == 1 ? steps[0] : steps[i],
                         reset, fragment);
  });
}

void coordinator_engine::mix(at::Tensor theta, uint32_t fragment, double alpha, then<bool> k) {
  gather<bool>(
      self_, self_->state.request_timeout, [k](std::vector<bool>) { k(true); }, mix_atom_v, std::move(theta),
      fragment, alpha);
}

void coordinator_engine::gradients(then<results> k) {
  gather<round_result>(self_, self_->state.round_timeout, std::move(k), grad_atom_v);
}

void coordinator_engine::apply_gradient(at::Tensor avg, then<std::vector<double>> k) {
  gather<double>(self_, self_->state.request_timeout, std::move(k), apply_atom_v, std::move(avg));
}

void coordinator_engine::lend_replica(then<replica_state> k) {
  ask(self_->state.workers[0], self_->state.request_timeout, std::move(k), state_atom_v, true);
}

void coordinator_engine::report(const step_report& r) {
  on_report(self_, r);
}

// ---- outer optimizer -------------------------------------------------------------------------------------

void coordinator_engine::theta(then<at::Tensor> k) {
  ask(self_->state.peers.outer, self_->state.request_timeout, std::move(k), theta_atom_v);
}

void coordinator_engine::thetas(then<std::vector<at::Tensor>> k) {
  ask(self_->state.peers.outer, self_->state.request_timeout, std::move(k), replicas_atom_v,
      self_->state.ctx->n_workers());
}

void coordinator_engine::set_theta(at::Tensor theta, then<bool> k) {
  ask(self_->state.peers.outer, self_->state.request_timeout, std::move(k), set_atom_v, std::move(theta));
}

void coordinator_engine::mirror_theta(at::Tensor weights, then<bool> k) {
  ask(self_->state.peers.outer, self_->state.request_timeout, std::move(k), load_atom_v,
      outer_snapshot{std::move(weights), at::Tensor(), {}, 0, {}, 0});
}

void coordinator_engine::outer_step(uint64_t round, uint32_t fragment, at::Tensor avg, then<at::Tensor> k) {
  ask(self_->state.peers.outer, self_->state.request_timeout, std::move(k), outer_atom_v,
      ring_label{round, fragment}, std::move(avg));
}

void coordinator_engine::prepare_outer_step(uint64_t round, at::Tensor avg) {
  self_->send(self_->state.peers.outer, prepare_atom_v, ring_label{round, 0}, std::move(avg));
}

void coordinator_engine::merge_step(uint64_t version, at::Tensor avg, int64_t arrivals, then<at::Tensor> k) {
  ask(self_->state.peers.outer, self_->state.request_timeout, std::move(k), merge_atom_v, version,
      std::move(avg), arrivals);
}

void coordinator_engine::eager_step(uint64_t round, at::Tensor avg_prev, std::vector<at::Tensor> deltas,
                                    then<eager_thetas> k) {
  ask(self_->state.peers.outer, self_->state.request_timeout, std::move(k), eager_atom_v, round,
      std::move(avg_prev), std::move(deltas));
}

// ---- communicator ----------------------------------------------------------------------------------------

double coordinator_engine::weight_of(const ring_label& label, bool exact, double weight) const {
  const auto& s = self_->state;
  if (!s.ctx->cfg.diloco.adaptive_steps || exact || label.second != 0 || weight >= 0 || s.round_steps <= 0)
    return weight;
  // The round's reduce starts right after its inner steps: round_steps are still that round's.
  return round_weight(static_cast<int64_t>(s.workers.size()), s.round_steps, s.ctx->cfg.train.inner_steps);
}

void coordinator_engine::reduce_now(ring_label label, std::vector<at::Tensor> parts, then<at::Tensor> k,
                                    double weight, bool empty_ok) {
  auto self = self_;
  // The communicator's deadline is comm.timeout_s (the ring's own); this one only guards against a
  // communicator that never answers.
  self->request(self->state.peers.communicator, self->state.round_timeout, reduce_atom_v,
                reduce_request{label, std::move(parts), false, weight_of(label, false, weight), empty_ok})
      .then([k](reduced& r) { k(r.empty ? at::Tensor() : std::move(r.avg)); },
            [self, label](caf::error& e) { allreduce_failed(self, label, std::move(e)); });
}

void coordinator_engine::reduce_gradients(uint64_t step, std::vector<at::Tensor> parts, then<at::Tensor> k) {
  ask<reduced>(
      self_->state.peers.communicator, self_->state.request_timeout,
      [k = std::move(k)](reduced r) { k(std::move(r.avg)); }, reduce_atom_v,
      reduce_request{{step, 0}, std::move(parts), false});
}

void coordinator_engine::start_reduce(ring_label label, std::vector<at::Tensor> parts, bool exact,
                                      double weight) {
  auto self = self_;
  self->state.reduces.started(label);
  self->request(self->state.peers.communicator, self->state.round_timeout, reduce_atom_v,
                reduce_request{label, std::move(parts), exact, weight_of(label, exact, weight)})
      .then([self, label](reduced& r) { self->state.reduces.arrived(label, r.avg, std::move(r.members)); },
            [self, label](caf::error& e) { allreduce_failed(self, label, std::move(e)); });
}

void coordinator_engine::when_average(ring_label label, then<at::Tensor> k, bool final) {
  auto self = self_;
  auto& s = self->state;
  if (s.reduces.has_average(label)) return k(s.reduces.average(label));
  const auto t0 = clock::now();
  s.reduces.when(label, [self, label, k, final, t0](at::Tensor avg) {
    auto& s = self->state;
    const double waited = std::chrono::duration<double>(clock::now() - t0).count();
    const auto& policy = s.ctx->cfg.diloco.outer;
    const std::string what = s.policy->describe(label);
    if (final) {
      spdlog::info("{}: waited {:.2f} s for the all-reduce of {} after the last round", policy, waited, what);
    } else {
      s.round_stall_s += waited;
      // Counted always; logged when it matters (tau = 0 makes every streaming sync a short wait).
      if (waited >= 0.05)
        spdlog::info("{}: the all-reduce of {} came {:.2f} s later than needed (the workers stalled)", policy,
                     what, waited);
    }
    k(std::move(avg));
  });
}

// ---- failed all-reduces ----------------------------------------------------------------------------------

namespace {

/// How long a lost ring peer waits for this node's own Ctrl-C before it counts as a failure. launch
/// interrupts every role at once, but the main loop forwards a signal only every 100 ms, so a neighbour
/// that stopped first can close its ring before this node has heard of its own interrupt.
constexpr auto lost_peer_grace = std::chrono::milliseconds(600);

/// Whether an all-reduce that failed with `e` was ended by a stop: after Ctrl-C the ring is cancelled, or,
/// when every node was interrupted at once (launch), a neighbour stopped first and this node's ring lost it.
/// Either way the round's average is dropped and the previous checkpoint stays the newest. delayed and eager
/// stop mid-round at once (stop_now) without setting stop_requested, so there the phase says a stop is
/// underway.
bool ended_by_stop(self_ptr self, const caf::error& e) {
  const auto& s = self->state;
  return (s.stop_requested || s.ph == phase::stopping) &&
         (has_code(e, errc::cancelled) || has_code(e, errc::peer_lost));
}

/// Ctrl-C while the cluster all-reduce of `label` (its round) was running: the replicas are already past the
/// round's inner steps, so no consistent snapshot of this round exists. The newest checkpoint written stays
/// the newest; a resume redoes the rounds after it.
void stop_in_allreduce(self_ptr self, ring_label label) {
  if (is_terminal(self->state.ph)) return;
  if (self->state.ph != phase::stopping) set_phase(self, phase::stopping);
  const uint64_t round = label.first;
  if (!self->state.policy->shares_rounds())  // async: a merge's all-reduce, named by its version
    spdlog::info(
        "stopped during the all-reduce of {}; this node's newest checkpoint stays (a resume goes on "
        "from it)",
        self->state.policy->describe(label));
  else  // the newest checkpoint is as old as checkpoint.every_rounds makes it, not always round - 1
    spdlog::info(
        "stopped during the all-reduce of round {}, of which no checkpoint exists; the newest stays: {}",
        round,
        self->state.newest_on_disk.empty() ? "none yet (a rerun starts over)"
                                           : self->state.newest_on_disk + " (a resume goes on from it)");
  flush_then(self, [=] {
    if (!set_phase(self, phase::done)) return;
    notify_main(self, 130);
  });
}

}  // namespace

/// After a stop the failure ends as one. A lost peer with no stop yet waits lost_peer_grace for this node's
/// own interrupt (lost_atom), then fails the run. Through that wait the label stays in flight, so a snapshot
/// taken meanwhile (delayed, eager) waits for its average instead of being saved without it; none is saved,
/// since the average never comes.
void allreduce_failed(self_ptr self, ring_label label, caf::error e, bool waited) {
  const bool stop = ended_by_stop(self, e);
  if (!stop && !waited && has_code(e, errc::peer_lost)) {
    spdlog::debug("round {}: a ring peer left; failing in {} ms unless this node is stopping too",
                  label.first, lost_peer_grace.count());
    self->delayed_send(self, lost_peer_grace, lost_atom_v, label, std::move(e));
    return;
  }
  self->state.reduces.failed(label);  // no-op for sync's all-reduce, which is never in flight
  if (stop) return stop_in_allreduce(self, label);
  fail(self, e);
}

// ---- the cluster (diloco.outer = "async") ----------------------------------------------------------------

std::string coordinator_engine::node_name() const {
  const auto* place = self_->state.ctx->cluster->place();
  return place ? place->name() : std::string();
}

void coordinator_engine::record(runtime::json_line line) {
  coordinator_parts::record(self_, line);
}

void coordinator_engine::observe(const char* name, double value) {
  self_->send(self_->state.peers.metrics, observe_atom_v, std::string(name), std::string(), value);
}

void coordinator_engine::count(const char* name, double value) {
  self_->send(self_->state.peers.metrics, count_atom_v, std::string(name), std::string(), value);
}

std::pair<int64_t, int64_t> coordinator_engine::ring_rank() const {
  const auto* place = self_->state.ctx->cluster->place();
  if (!place) return {0, 1};
  return {place->rank, static_cast<int64_t>(place->names.size())};
}

void coordinator_engine::outer_state(then<runtime::outer_snapshot> k) {
  ask(self_->state.peers.outer, self_->state.request_timeout, std::move(k), state_atom_v, false);
}

void coordinator_engine::load_outer(runtime::outer_snapshot state, then<bool> k) {
  ask(self_->state.peers.outer, self_->state.request_timeout, std::move(k), load_atom_v, std::move(state));
}

void coordinator_engine::contribute(uint64_t v_start, uint64_t tokens) {
  self_->state.ctx->cluster->contribute(v_start, tokens);
}

void coordinator_engine::version_done(uint64_t version, const at::Tensor& theta, runtime::json_line line) {
  const uint32_t crc = theta_crc(theta);
  line.add("theta_crc32c", fmt::format("{:08x}", crc));
  coordinator_parts::record(self_, line);
  gauge(self_, "longwave_outer_version", static_cast<double>(version));
  self_->state.version = std::max(self_->state.version, version);
  self_->state.ctx->cluster->version_committed(version, crc);
}

}  // namespace longwave::actors::coordinator_parts
