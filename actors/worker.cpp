// Worker actor (runtime::worker_actor). Notes beyond the interface:
//   run: delta = theta - local (none if theta is undefined)
//   mix: local <- (1-alpha) theta + alpha local on the fragment's ranges
//   (state, lend = true): the live buffers; the caller sends nothing that changes them until the snapshot is
//   written
//   (pause) -> steps done; (state, target) -> replica_state once the paused replica reached step target
//   (state) -> replica_state of that moment, answered once its copies are done: steps poll for them, and
//   between rounds (copied) does every millisecond
#include "actors/worker.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <optional>

#include "models/lr_schedule.hpp"
#include "runtime/clock/clock.hpp"
#include "runtime/log/log.hpp"
#include "runtime/messages/caf_errors.hpp"
#include "runtime/messages/interfaces.hpp"

namespace longwave::actors {

using namespace longwave::runtime;

namespace {

struct worker_state {
  std::shared_ptr<const run_context> ctx;
  std::unique_ptr<models::inner_trainer> trainer;
  int64_t rank = 0;
  coordinator_actor coordinator;
  // The current inner round.
  bool busy = false;
  uint64_t round = 0;
  at::Tensor theta_ref;   // theta_global at the start of the round; read-only until we reply
  int64_t fragment = -1;  // the pseudo-gradient of this streaming fragment only (-1: the whole)
  int64_t steps_in_round = 0, steps_target = 0;
  int64_t resume_steps = 0;  // loaded from a mid-round checkpoint
  // Stopping mid-round: paused replicas step only up to pause_target, then answer the state request.
  bool paused = false;
  int64_t pause_target = -1;
  caf::typed_response_promise<replica_state> state_rp;
  int64_t steps_run = 0;  // steps executed by this process in this round
  double loss_sum = 0;
  // train.pace_step_s: when the last step began, and the steps that took longer than paced (named).
  std::chrono::steady_clock::time_point step_began;
  int64_t paced_steps = 0, late_steps = 0;
  caf::typed_response_promise<round_result> rp;
  // The round's host time outside its steps (round_result's load_s, delta_s and round_s).
  std::chrono::steady_clock::time_point round_began;
  double load_s = 0;
  // The last step's report, sent once its loss is read: during the next step, or at the round's end and
  // before a snapshot (on a GPU the host so never waits for the step it has just queued).
  std::optional<step_report> held;
  // A state asked for (state) whose copies are still in flight (a GPU's), answered once they are done.
  struct in_flight {
    replica_state state;
    std::shared_ptr<models::device_event> done;
    caf::typed_response_promise<replica_state> rp;
  };
  std::optional<in_flight> copying;
  bool copy_polled = false;  // a copied message is on its way (one at a time)
};

using worker_self = worker_actor::stateful_pointer<worker_state>;

std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

// Runs f; converts foreign exceptions into a caf::error (tier 3 -> tier 1).
template <class F>
caf::error guarded(const worker_state& s, F&& f) {
  const int64_t rank = s.rank;
  try {
    f();
    return {};
  } catch (const c10::OutOfMemoryError& e) {
    // The worker's device is full: one line naming what to change (the checkpoints stay as they are).
    return make_error(errc::torch_error,
                      "worker " + std::to_string(rank) + ": out of memory on its device; " +
                          memory_advice(s.ctx->cfg, s.ctx->spec.seq_len, s.ctx->devices.any_cuda()) + " (" +
                          first_line(e.what_without_backtrace()) + ")");
  } catch (const c10::Error& e) {
    return make_error(errc::torch_error,
                      "worker " + std::to_string(rank) + ": " + e.what_without_backtrace());
  } catch (const lw_error& e) {
    return make_error(e.code(), "worker " + std::to_string(rank) + ": " + e.what());
  } catch (const std::exception& e) {
    return make_error(errc::torch_error, "worker " + std::to_string(rank) + ": " + describe(e));
  }
}

/// Sends the held step report with its loss.
void send_held(worker_self self, float loss) {
  auto& s = self->state;
  auto rep = std::move(*s.held);
  s.held.reset();
  rep.loss = loss;
  if (s.trainer->device().is_cuda()) rep.gpu_s = s.trainer->last_gpu_seconds();
  s.loss_sum += rep.loss;
  self->send(s.coordinator, report_atom_v, rep);
}

/// Reads the last step's loss and sends its report; an error of that step's device work surfaces here. The
/// wait is that step's device time still running (on a GPU), so it counts as the step's compute, not idle.
caf::error flush_held(worker_self self) {
  auto& s = self->state;
  if (!s.held) return {};
  std::optional<float> loss;
  const auto t0 = std::chrono::steady_clock::now();
  if (auto err = guarded(s, [&] { loss = s.trainer->take_pending_loss(); })) {
    s.held.reset();
    return err;
  }
  s.held->compute_s += seconds_since(t0);
  send_held(self, loss.value_or(0.0F));
  return {};
}

void answer_copy(worker_self self, bool wait);

/// The round failed (a step, or the read of its loss): its reply carries the error, nothing stays held.
void fail_round(worker_self self, const caf::error& err) {
  auto& s = self->state;
  s.held.reset();
  s.busy = false;
  s.theta_ref = at::Tensor();
  s.rp.deliver(err);
  answer_copy(self, /*wait=*/false);  // between rounds now: a copy in flight is looked at on a timer
}

void finish_round(worker_self self) {
  auto& s = self->state;
  if (auto err = flush_held(self)) return fail_round(self, err);
  round_result r;
  r.rank = s.rank;
  r.round = s.round;
  const auto t_delta = std::chrono::steady_clock::now();
  // On a GPU the first one allocates the pinned host buffer it goes out through: a failure fails the round.
  if (auto err = guarded(s, [&] {
        if (s.theta_ref.defined() && s.fragment >= 0)
          r.delta = s.trainer->node_delta(s.theta_ref, s.ctx->fragments.at(static_cast<size_t>(s.fragment)));
        else if (s.theta_ref.defined())
          r.delta = s.trainer->node_delta(s.theta_ref, {{0, s.theta_ref.numel()}});
      }))
    return fail_round(self, err);
  r.delta_s = seconds_since(t_delta);
  r.load_s = s.load_s;
  r.round_s = seconds_since(s.round_began);
  r.mean_loss = s.steps_run > 0 ? s.loss_sum / static_cast<double>(s.steps_run) : 0.0;
  s.busy = false;
  s.theta_ref = at::Tensor();
  s.rp.deliver(std::move(r));
  answer_copy(self, /*wait=*/false);
}

replica_state replica_from(worker_self self, models::inner_state is) {
  auto& s = self->state;
  replica_state r;
  r.rank = s.rank;
  r.master = std::move(is.master);
  r.exp_avg = std::move(is.exp_avg);
  r.exp_avg_sq = std::move(is.exp_avg_sq);
  r.adam_steps = is.adam_steps;
  r.sampler_position = is.sampler_position;
  // Steps of the current (or last) round; the coordinator zeroes it for round-boundary snapshots.
  r.steps_in_round = s.steps_in_round;
  return r;
}

/// The state of this moment (lend: the live buffers), or the error of its copies (a failed side stream's).
caf::expected<replica_state> replica_of(worker_self self, bool lend = false) {
  models::inner_state is;
  if (auto err = guarded(self->state, [&] { is = self->state.trainer->state(lend); })) return err;
  return replica_from(self, std::move(is));
}

caf::result<replica_state> answer(caf::expected<replica_state> r) {
  if (!r) return std::move(r.error());
  return std::move(*r);
}

/// Answers the state in flight once its copies are done (wait: now), or with their device error. While no
/// step runs to look (between rounds, paused) a copy still running is looked at again in a millisecond.
void answer_copy(worker_self self, bool wait) {
  auto& s = self->state;
  if (!s.copying) return;
  auto& c = *s.copying;
  bool done = wait;
  auto err = wait ? caf::error{} : guarded(s, [&] { done = c.done->query(); });  // CUDA: may throw
  if (!err && !done) {
    if ((!s.busy || s.paused) && !s.copy_polled) {
      s.copy_polled = true;
      self->delayed_send(self, std::chrono::milliseconds(1), copied_atom_v);
    }
    return;
  }
  auto rp = std::move(c.rp);
  auto r = std::move(c.state);
  auto event = std::move(c.done);
  s.copying.reset();
  if (!err) err = guarded(s, [&] { event->synchronize(); });  // a failed copy's error is the answer
  if (err)
    rp.deliver(err);
  else
    rp.deliver(std::move(r));
}

/// (state): the state of this moment; a copy in flight is answered later (answer_copy), the worker free to
/// run meanwhile. A state asked for before is answered first.
caf::result<replica_state> copy_state(worker_self self) {
  auto& s = self->state;
  answer_copy(self, /*wait=*/true);
  if (auto err = flush_held(self)) return err;
  models::inner_state_copy c;
  if (auto err = guarded(s, [&] { c = s.trainer->state_copy(); })) return err;
  auto r = replica_from(self, std::move(c.state));
  if (!c.done) return r;  // no copies (a trainer without a stage)
  s.copying =
      worker_state::in_flight{std::move(r), std::move(c.done), self->make_response_promise<replica_state>()};
  auto rp = s.copying->rp;
  answer_copy(self, /*wait=*/false);
  return rp;
}

/// (run): starts a round of h inner steps from theta (reset: loaded first, unless a checkpoint interrupted
/// the round); the reply comes from finish_round, or the error of a failed inner step.
caf::result<round_result> begin_round(worker_self self, uint64_t round, at::Tensor theta, int64_t h,
                                      bool reset, int64_t fragment) {
  auto& s = self->state;
  if (s.busy) return make_error(errc::stale_round, "worker already in a round");
  if (fragment >= static_cast<int64_t>(s.ctx->fragments.size()))
    return make_error(errc::invalid_config, "worker " + std::to_string(s.rank) + ": streaming fragment " +
                                                std::to_string(fragment) + " does not exist");
  s.round_began = std::chrono::steady_clock::now();
  s.load_s = 0;
  s.round = round;
  s.fragment = fragment;
  s.theta_ref = std::move(theta);
  s.steps_target = h;
  s.loss_sum = 0;
  s.steps_run = 0;
  if (s.resume_steps > 0) {  // continue a round that a checkpoint interrupted
    s.steps_in_round = s.resume_steps;
    s.resume_steps = 0;
  } else {
    s.steps_in_round = 0;
    if (reset && s.theta_ref.defined()) {
      if (auto err = guarded(s, [&] { s.trainer->set_params(s.theta_ref); })) {
        s.theta_ref = at::Tensor();
        return err;
      }
      s.load_s = seconds_since(s.round_began);
    }
  }
  s.busy = true;
  s.rp = self->make_response_promise<round_result>();
  if (s.steps_in_round >= s.steps_target) {
    finish_round(self);
  } else {
    self->send(self, step_atom_v);
  }
  return s.rp;
}

/// train.pace_step_s: a step that began later than 5 % past its paced time after the one before it (the
/// device, not the pace, sets the rate) is named, at the first and then every 100th.
void check_pace(worker_self self, std::chrono::steady_clock::time_point began, double paced) {
  auto& s = self->state;
  if (s.steps_run > 0) {
    const double took = std::chrono::duration<double>(began - s.step_began).count();
    ++s.paced_steps;
    if (took > paced * 1.05 && ++s.late_steps % 100 == 1)
      spdlog::warn(
          "worker {}: an inner step took {:.3g} s against its paced {:.3g} s (train.pace_step_s / speed); "
          "{} of {} paced steps so far were slower: this device, not the pace, sets the rate",
          s.rank, took, paced, s.late_steps, s.paced_steps);
  }
  s.step_began = began;
}

/// Sends `what` to this worker at once, or (train.pace_step_s) once the current step has taken its paced
/// time.
template <class Atom>
void after_paced(worker_self self, Atom what) {
  auto& s = self->state;
  const double paced = s.ctx->cfg.train.paced_step_s();
  const double left = paced - seconds_since(s.step_began);
  if (paced > 0 && left > 0)
    self->delayed_send(
        self, std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(left)),
        what);
  else
    self->send(self, what);
}

/// (step): one inner step, reported to the coordinator; then the next step, the round's end, or (paused) the
/// state that was asked for. A paced round ends once its last step has taken its paced time.
void inner_step(worker_self self) {
  auto& s = self->state;
  if (!s.busy) return;
  if (s.paused && (s.pause_target < 0 || s.trainer->steps_done() >= s.pause_target)) return;
  if (s.steps_in_round >= s.steps_target) return finish_round(self);  // a paced round's last wait is over
  step_report rep;
  auto t0 = std::chrono::steady_clock::now();
  if (const double paced = s.ctx->cfg.train.paced_step_s(); paced > 0) check_pace(self, t0, paced);
  // Under client sampling or adaptive steps the replicas' own step counts differ: the step's place in the
  // run is its round's (adaptive: each step advances the schedule by its share of the round).
  const auto& cfg = s.ctx->cfg;
  const bool by_round = cfg.federated.clients_per_round > 0 || cfg.diloco.adaptive_steps;
  const auto at = [&](int64_t k) {
    return models::schedule_step(s.round, k, s.steps_target, cfg.train.inner_steps);
  };
  std::optional<float> previous;  // the loss of the step before, read while this one runs
  auto err = guarded(
      s, [&] { previous = s.trainer->step_async(cfg.diloco.adaptive_steps ? at(s.steps_in_round) : -1); });
  if (err) return fail_round(self, err);
  if (previous && s.held) send_held(self, *previous);
  answer_copy(self, /*wait=*/false);
  rep.compute_s = seconds_since(t0);
  rep.rank = s.rank;
  rep.step = by_round ? at(s.steps_in_round + 1) : s.trainer->steps_done();  // the round's last: round * H
  rep.tokens = s.trainer->tokens_per_step();
  if (s.trainer->device().is_cuda()) {
    const auto mem = s.trainer->gpu_memory_now();
    rep.gpu_allocated = mem.allocated, rep.gpu_reserved = mem.reserved, rep.gpu_peak = mem.peak;
  }
  ++s.steps_run;
  ++s.steps_in_round;
  s.held = rep;
  if (s.paused && s.trainer->steps_done() >= s.pause_target) {
    if (auto e = flush_held(self)) {
      s.state_rp.deliver(e);
      return fail_round(self, e);
    }
    auto r = replica_of(self);
    if (!r) {  // as a failed flush above: the round fails with it
      s.state_rp.deliver(r.error());
      return fail_round(self, r.error());
    }
    s.state_rp.deliver(std::move(*r));
    return;
  }
  if (s.steps_in_round >= s.steps_target && s.ctx->cfg.train.paced_step_s() <= 0)
    finish_round(self);
  else
    after_paced(self, step_atom_v);
}

/// (mix): streaming's local <- (1 - alpha) theta + alpha local on one fragment, between rounds only.
caf::result<bool> mix_fragment(worker_self self, const at::Tensor& theta, uint32_t fragment, double alpha) {
  auto& s = self->state;
  const auto& frags = s.ctx->fragments;
  if (s.busy || fragment >= frags.size())
    return make_error(errc::stale_round, "worker: mix of fragment " + std::to_string(fragment) +
                                             (s.busy ? " during a round" : " that does not exist"));
  if (auto err = guarded(s, [&] { s.trainer->mix(theta, frags[fragment], alpha); })) return err;
  return true;
}

worker_actor::behavior_type worker_fun(worker_self self, std::shared_ptr<const run_context> ctx, int64_t rank,
                                       coordinator_actor coordinator) {
  auto& st = self->state;
  st.ctx = ctx;
  st.rank = rank;
  st.coordinator = std::move(coordinator);
  at::set_num_threads(static_cast<int>(ctx->threads_per_worker));
  st.trainer = std::make_unique<models::inner_trainer>(ctx->spec, ctx->inner_of(rank), ctx->train_tokens,
                                                       ctx->data_spans(ctx->rank_offset + rank),
                                                       ctx->rank_offset + rank, ctx->cfg.run.seed);
  return {
      [=](run_atom, uint64_t round, at::Tensor theta, int64_t h, bool reset, int64_t fragment) {
        return begin_round(self, round, std::move(theta), h, reset, fragment);
      },
      [=](step_atom) { inner_step(self); },
      [=](grad_atom) -> caf::result<round_result> {
        auto& s = self->state;
        round_result r;
        r.rank = s.rank;
        auto t0 = std::chrono::steady_clock::now();
        if (auto err = guarded(s, [&] { r.mean_loss = s.trainer->compute_grad(); })) return err;
        r.compute_s = seconds_since(t0);
        if (auto err = guarded(s, [&] { r.delta = s.trainer->grad(); }))  // read-only until our next (apply)
          return err;
        return r;
      },
      [=](apply_atom, at::Tensor avg) -> caf::result<double> {
        auto& s = self->state;
        auto t0 = std::chrono::steady_clock::now();
        if (auto err = guarded(s, [&] { s.trainer->apply_grad(avg); })) return err;
        return seconds_since(t0);
      },
      [=](eval_atom, at::Tensor theta, int64_t n_batches) -> caf::result<double> {
        auto& s = self->state;
        double loss = 0;
        if (auto err = guarded(s, [&] { loss = s.trainer->evaluate(theta, *s.ctx->val_tokens, n_batches); }))
          return err;
        return loss;
      },
      [=](set_atom, at::Tensor theta) -> caf::result<bool> {
        auto& s = self->state;
        if (auto err = guarded(s, [&] { s.trainer->set_params(theta); })) return err;
        return true;
      },
      [=](mix_atom, at::Tensor theta, uint32_t fragment, double alpha) {
        return mix_fragment(self, theta, fragment, alpha);
      },
      [=](state_atom) { return copy_state(self); },
      [=](copied_atom) {
        self->state.copy_polled = false;
        answer_copy(self, /*wait=*/false);
      },
      [=](state_atom, bool lend) -> caf::result<replica_state> {
        if (self->state.busy) return make_error(errc::stale_round, "worker: state lent during a round");
        answer_copy(self, /*wait=*/true);
        return answer(replica_of(self, lend));
      },
      [=](pause_atom) -> caf::result<int64_t> {
        auto& s = self->state;
        s.paused = true;
        answer_copy(self, /*wait=*/true);             // no step is left to look for it
        if (auto err = flush_held(self)) return err;  // every step done is reported before the snapshot
        return s.trainer->steps_done();
      },
      [=](state_atom, int64_t target) -> caf::result<replica_state> {
        auto& s = self->state;
        answer_copy(self, /*wait=*/true);
        s.pause_target = target;
        if (!s.busy || s.trainer->steps_done() >= target) {
          if (auto err = flush_held(self)) return err;
          return answer(replica_of(self));
        }
        s.state_rp = self->make_response_promise<replica_state>();
        self->send(self, step_atom_v);  // restart the paused step chain
        return s.state_rp;
      },
      [=](load_atom, replica_state r) -> caf::result<bool> {
        auto& s = self->state;
        models::inner_state is{r.master, r.exp_avg, r.exp_avg_sq, r.adam_steps, r.sampler_position};
        if (auto err = guarded(s, [&] { s.trainer->load_state(is); })) return err;
        s.resume_steps = r.steps_in_round;
        return true;
      },
  };
}

}  // namespace

worker_actor spawn_worker(caf::actor_system& sys, std::shared_ptr<const run_context> ctx, int64_t rank,
                          const coordinator_actor& coordinator) {
  return sys.spawn<caf::detached>(worker_fun, std::move(ctx), rank, coordinator);
}

}  // namespace longwave::actors
