// Coordinator: the outer-round state machine.
//   idle -> [resuming ->] inner -> reducing -> outer_step -> [evaluating ->] [saving ->] inner ... -> done
//   ddp: inner runs H synchronous steps (grad -> reduce -> apply), then the same round tail.
//   stop: inner/any -> stopping (snapshot, flush) -> done; any error -> failed.
#include "actors/coordinator.hpp"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "actors/worker.hpp"
#include "models/lr_schedule.hpp"
#include "runtime/caf_errors.hpp"
#include "runtime/json_line.hpp"
#include "runtime/log.hpp"
#include "runtime/snapshot_codec.hpp"
#include "runtime/type_ids.hpp"

namespace longwave::actors {

using namespace longwave::runtime;
using clock = std::chrono::steady_clock;

const char* to_string(phase p) {
  switch (p) {
    case phase::idle: return "idle";
    case phase::resuming: return "resuming";
    case phase::inner: return "inner";
    case phase::reducing: return "reducing";
    case phase::outer_step: return "outer_step";
    case phase::evaluating: return "evaluating";
    case phase::saving: return "saving";
    case phase::stopping: return "stopping";
    case phase::done: return "done";
    case phase::failed: return "failed";
  }
  return "?";
}

bool allowed_transition(phase from, phase to) {
  if (to == phase::failed) return from != phase::done && from != phase::failed;
  if (to == phase::stopping) return from != phase::done && from != phase::failed && from != phase::stopping;
  switch (from) {
    case phase::idle: return to == phase::resuming || to == phase::inner;
    case phase::resuming: return to == phase::inner;
    case phase::inner: return to == phase::reducing || to == phase::outer_step || to == phase::evaluating;
    case phase::reducing: return to == phase::outer_step;
    case phase::outer_step:
      return to == phase::evaluating || to == phase::saving || to == phase::inner || to == phase::done;
    case phase::evaluating: return to == phase::saving || to == phase::inner || to == phase::done;
    case phase::saving: return to == phase::inner || to == phase::done;
    case phase::stopping: return to == phase::done;
    case phase::done:
    case phase::failed: return false;
  }
  return false;
}

namespace {

struct step_agg {
  int64_t count = 0;
  double loss_sum = 0;
};

struct coordinator_state {
  std::shared_ptr<const run_context> ctx;
  coordinator_peers peers;
  std::vector<caf::actor> workers;
  caf::actor main;
  phase ph = phase::idle;
  std::optional<train_snapshot> resume;
  uint64_t round = 0;             // completed outer rounds
  int64_t ddp_step_in_round = 0;  // ddp: steps of the current round done
  bool stop_requested = false;
  bool sync_workers = true;  // single mode: the worker keeps its own weights between rounds
  // Progress and metrics.
  std::map<int64_t, step_agg> steps;
  int64_t last_step = 0, first_step = 0;
  clock::time_point t_start;
  double last_val_loss = std::numeric_limits<double>::quiet_NaN();
  double eval_s = 0;  // wall time spent evaluating (excluded from train_seconds)
  // Per local worker: compute seconds in the current round and since start, tokens since start (the node's
  // totals are their sums).
  std::vector<double> round_compute, run_compute;
  std::vector<int64_t> worker_tokens;
  double total_compute() const { return std::accumulate(run_compute.begin(), run_compute.end(), 0.0); }
  int64_t total_tokens() const {
    return std::accumulate(worker_tokens.begin(), worker_tokens.end(), int64_t{0});
  }
  clock::time_point t_round_start;
  bool ended = false;  // the "end" event is written
  // diloco.outer = "delayed": averages of finished all-reduces not yet applied, all-reduces still running,
  // and what waits for them (the next outer step, a snapshot). See ARCHITECTURE.md, "Outer-step policies".
  bool delayed = false;
  std::map<uint64_t, at::Tensor> arrived;
  std::set<uint64_t> inflight;
  std::multimap<uint64_t, std::function<void(at::Tensor)>> waiting;
  double round_stall_s = 0;  // seconds the workers of the current round waited for a late average
  bool final_applied = false;
  std::ofstream trace;
  caf::timespan round_timeout, request_timeout;
};

using self_ptr = caf::stateful_actor<coordinator_state>*;

caf::timespan seconds(double s) {
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(s));
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

void set_phase(self_ptr self, phase to) {
  auto& s = self->state;
  if (!allowed_transition(s.ph, to)) {
    spdlog::error("coordinator: illegal transition {} -> {} (ignored)", to_string(s.ph), to_string(to));
    return;
  }
  spdlog::debug("coordinator: {} -> {}", to_string(s.ph), to_string(to));
  s.ph = to;
}

void gauge(self_ptr self, const char* name, double v, const std::string& worker = "") {
  self->send(self->state.peers.metrics, gauge_atom_v, std::string(name), worker, v);
}

double since_start(const coordinator_state& s) {
  return std::chrono::duration<double>(clock::now() - s.t_start).count();
}

void record(self_ptr self, const json_line& line) {
  self->send(self->state.peers.metrics, record_atom_v, line.str());
}

void notify_main(self_ptr self, int code) {
  auto& s = self->state;
  if (!s.ended) {
    s.ended = true;
    record(self, json_line("end")
                     .add("exit_code", code)
                     .add("val_loss", s.last_val_loss)
                     .add("val_ppl", std::exp(s.last_val_loss))
                     .add("seconds", since_start(s))
                     .add("steps", s.last_step)
                     .add("rounds", s.round));
  }
  if (s.main) self->send(s.main, done_atom_v, code, s.last_val_loss);
}

void fail(self_ptr self, const caf::error& e) {
  auto& s = self->state;
  if (s.ph == phase::failed || s.ph == phase::done) return;
  spdlog::error("training failed in phase {}: {}", to_string(s.ph), describe(e));
  set_phase(self, phase::failed);
  notify_main(self, 1);
}

/// Sends msg to every worker; calls done with the replies in rank order once all arrived.
template <class T, class... Ts>
void gather(self_ptr self, caf::timespan timeout, std::function<void(std::vector<T>)> done, Ts... msg) {
  const auto n = self->state.workers.size();
  auto results = std::make_shared<std::vector<T>>(n);
  auto left = std::make_shared<size_t>(n);
  auto failed = std::make_shared<bool>(false);
  for (size_t i = 0; i < n; ++i) {
    self->request(self->state.workers[i], timeout, msg...)
        .then(
            [=](T& r) {
              (*results)[i] = std::move(r);
              if (--*left == 0 && !*failed) done(std::move(*results));
            },
            [=](caf::error& e) {
              if (*failed) return;
              *failed = true;
              fail(self, e);
            });
  }
}

void begin_round(self_ptr self);
void after_round(self_ptr self, at::Tensor theta);

// ---- progress -------------------------------------------------------------------------------------------

void on_report(self_ptr self, const step_report& r) {
  auto& s = self->state;
  const auto& cfg = s.ctx->cfg;
  const std::string w = std::to_string(r.rank);
  const auto wi = static_cast<size_t>(r.rank);
  const double wall = since_start(s);
  LW_ASSERT(wi < s.run_compute.size(), "step report from a worker this node does not have");
  s.round_compute[wi] += r.compute_s;
  s.run_compute[wi] += r.compute_s;
  s.worker_tokens[wi] += r.tokens;
  gauge(self, "longwave_worker_tokens_per_second", wall > 0 ? s.worker_tokens[wi] / wall : 0, w);
  gauge(self, "longwave_worker_compute_utilization_run_ratio", wall > 0 ? s.run_compute[wi] / wall : 0, w);
  gauge(self, "longwave_worker_train_loss", r.loss, w);
  self->send(s.peers.metrics, observe_atom_v, std::string("longwave_worker_inner_step_seconds"), w,
             r.compute_s);
  self->send(s.peers.metrics, count_atom_v, std::string("longwave_worker_inner_steps_total"), w, 1.0);
  self->send(s.peers.metrics, count_atom_v, std::string("longwave_worker_tokens_total"), w,
             static_cast<double>(r.tokens));
  auto& agg = s.steps[r.step];
  agg.count++;
  agg.loss_sum += r.loss;
  if (agg.count < s.ctx->n_workers()) return;
  const double loss = agg.loss_sum / static_cast<double>(agg.count);
  s.steps.erase(r.step);
  s.last_step = std::max(s.last_step, r.step);
  if (s.trace)
    s.trace << r.step << '\t' << s.round << '\t' << fmt::format("{:.9g}", loss) << '\n' << std::flush;
  const double tok_s = wall > 0 ? static_cast<double>(s.total_tokens()) / wall : 0;
  const double busy = wall * static_cast<double>(s.ctx->n_workers());
  const int64_t total = s.ctx->total_inner_steps();
  // The rate the step just taken used (step is 1-based, the schedule 0-based).
  const double lr = models::warmup_cosine_lr(cfg.train.lr, r.step - 1, cfg.train.warmup_steps, total,
                                             cfg.train.min_lr_ratio);
  gauge(self, "longwave_train_loss", loss);
  gauge(self, "longwave_train_tokens_per_second", tok_s);
  gauge(self, "longwave_compute_utilization_ratio", busy > 0 ? s.total_compute() / busy : 0);
  gauge(self, "longwave_inner_learning_rate", lr);
  record(self, json_line("step")
                   .add("step", r.step)
                   .add("round", s.round + 1)
                   .add("loss", loss)
                   .add("tokens_per_second", tok_s)
                   .add("lr", lr));
  if (r.step % cfg.runtime.log_every_steps == 0 || r.step == total) {
    const double done = static_cast<double>(r.step - s.first_step);
    const double eta = done > 0 ? wall / done * static_cast<double>(total - r.step) : NAN;
    spdlog::info("round {:>3}/{} | step {:>5}/{} | loss {:.4f} | {:>7.0f} tok/s | eta {}",
                 std::min<uint64_t>(s.round + 1, cfg.train.rounds), cfg.train.rounds, r.step, total, loss,
                 tok_s, format_duration(eta));
  }
}

// ---- snapshots ------------------------------------------------------------------------------------------

/// Gathers a consistent snapshot: outer state and every replica, then hands it to `then`. Boundary snapshots
/// zero steps_in_round. A mid-round DiLoCo snapshot passes `target`: every (paused) replica first runs up to
/// that inner step, so all replicas and the loss trace stop at the same step.
void take_snapshot(self_ptr self, bool boundary, std::function<void(train_snapshot)> then,
                   int64_t target = -1) {
  auto& s = self->state;
  self->request(s.peers.outer, s.request_timeout, state_atom_v)
      .then(
          [=](std::vector<at::Tensor>& outer) {
            auto theta = outer[0], momentum = outer[1];
            auto assemble = [=](std::vector<replica_state> reps) {
              auto& s = self->state;
              train_snapshot snap;
              snap.round = s.round;
              snap.theta = theta;
              snap.momentum = momentum;
              snap.meta = std::string(config_marker) + s.ctx->config_toml;
              snap.step = static_cast<uint64_t>(reps[0].adam_steps);
              for (auto& r : reps) {
                if (boundary) r.steps_in_round = 0;
                if (s.ctx->cfg.run.mode == "ddp") r.steps_in_round = boundary ? 0 : s.ddp_step_in_round;
                LW_ASSERT(static_cast<uint64_t>(r.adam_steps) == snap.step,
                          "replicas of a snapshot differ in step");
              }
              snap.replicas = std::move(reps);
              then(std::move(snap));
            };
            if (target >= 0)
              gather<replica_state>(self, self->state.round_timeout, assemble, state_atom_v, target);
            else
              gather<replica_state>(self, self->state.request_timeout, assemble, state_atom_v);
          },
          [=](caf::error& e) { fail(self, e); });
}

void when_average(self_ptr self, uint64_t round, std::function<void(at::Tensor)> k, bool final);

/// delayed: a snapshot holds the average its next outer step will apply (that of its own round), so a resume
/// continues exactly. If that all-reduce is still running, the snapshot (already cloned) waits for it while
/// training goes on.
void with_pending(self_ptr self, train_snapshot snap, std::function<void(train_snapshot)> k) {
  auto& s = self->state;
  const auto r = snap.round;
  if (!s.delayed || (s.arrived.count(r) == 0 && s.inflight.count(r) == 0)) return k(std::move(snap));
  auto holder = std::make_shared<train_snapshot>(std::move(snap));
  auto attach = [holder, k, r](at::Tensor avg) {
    holder->pending = std::move(avg);
    holder->pending_round = r;
    k(std::move(*holder));
  };
  if (s.arrived.count(r)) return attach(s.arrived.at(r));
  s.waiting.emplace(r, attach);
}

void save_now(self_ptr self, train_snapshot snap, std::function<void()> then);

void save(self_ptr self, train_snapshot snap, std::function<void()> then) {
  with_pending(self, std::move(snap), [=](train_snapshot full) { save_now(self, std::move(full), then); });
}

void save_now(self_ptr self, train_snapshot snap, std::function<void()> then) {
  auto& s = self->state;
  const auto round = snap.round;
  self->request(s.peers.checkpointer, s.request_timeout, save_atom_v, std::move(snap))
      .then(
          [=](const std::string& path) {
            spdlog::debug("checkpoint of round {} on disk: {}", round, path);
            if (then) then();
          },
          [=](caf::error& e) {
            // A failed write never stops training: the previous checkpoints are intact.
            spdlog::warn("checkpoint of round {} not written: {}", round, describe(e));
            if (then) then();
          });
}

void flush_then(self_ptr self, std::function<void()> then) {
  self->request(self->state.peers.checkpointer, self->state.request_timeout, flush_atom_v)
      .then([=](bool) { then(); },
            [=](caf::error& e) {
              spdlog::warn("checkpointer flush: {}", describe(e));
              then();
            });
}

void stop_now(self_ptr self, bool boundary) {
  set_phase(self, phase::stopping);
  spdlog::info("stopping: saving a checkpoint of round {} ({})", self->state.round,
               boundary ? "round boundary" : "mid-round");
  auto save_and_exit = [=](train_snapshot snap) {
    const auto step = snap.step;
    save(self, std::move(snap), [=] {
      flush_then(self, [=] {
        spdlog::info("stopped at inner step {}; run the same command again to resume", step);
        set_phase(self, phase::done);
        notify_main(self, 130);
      });
    });
  };
  if (boundary || self->state.ctx->cfg.run.mode == "ddp") return take_snapshot(self, boundary, save_and_exit);
  // DiLoCo mid-round: replicas run independently, so pause them, then bring all to the furthest step.
  gather<int64_t>(
      self, self->state.request_timeout,
      [=](std::vector<int64_t> steps) {
        const int64_t target = *std::max_element(steps.begin(), steps.end());
        take_snapshot(self, false, save_and_exit, target);
      },
      pause_atom_v);
}

/// Ctrl-C while the cluster all-reduce of `round` was running: the replicas are already past the round's
/// inner steps, so no consistent snapshot of this round exists. The last round-boundary checkpoint stays
/// the newest; a resume redoes this round's inner steps.
void stop_in_allreduce(self_ptr self, uint64_t round) {
  if (self->state.ph == phase::done || self->state.ph == phase::failed) return;
  if (self->state.ph != phase::stopping) set_phase(self, phase::stopping);
  spdlog::info(
      "stopped during the all-reduce of round {}; the checkpoint of round {} stays the newest (a "
      "resume redoes round {})",
      round, round - 1, round);
  flush_then(self, [=] {
    set_phase(self, phase::done);
    notify_main(self, 130);
  });
}

// ---- the round ------------------------------------------------------------------------------------------

// result.json in out_dir: the numbers a sweep or a test reads back.
void write_result(const coordinator_state& s, double wall) {
  const auto& c = s.ctx->cfg;
  std::ofstream out(c.run.out_dir + "/result.json", std::ios::trunc);
  out << fmt::format(
      "{{\"mode\": \"{}\", \"workers\": {}, \"rounds\": {}, \"inner_steps\": {}, \"inner_steps_per_worker\": "
      "{}, "
      "\"val_loss\": {:.9g}, \"val_ppl\": {:.9g}, \"tokens\": {}, \"seconds\": {:.3f}, \"train_seconds\": "
      "{:.3f}}}\n",
      c.run.mode, c.train.workers, s.round, c.train.inner_steps, s.last_step, s.last_val_loss,
      std::exp(s.last_val_loss), s.total_tokens(), wall, wall - s.eval_s);
}

void finish(self_ptr self) {
  auto& s = self->state;
  flush_then(self, [=] {
    auto& s = self->state;
    const double wall = std::chrono::duration<double>(clock::now() - s.t_start).count();
    spdlog::info(
        "final: val loss {:.4f} | val perplexity {:.3f} | {} rounds x {} inner steps x {} workers | {}",
        s.last_val_loss, std::exp(s.last_val_loss), s.round, s.ctx->cfg.train.inner_steps, s.ctx->n_workers(),
        format_duration(wall));
    write_result(s, wall);
    set_phase(self, phase::done);
    notify_main(self, 0);
  });
  (void)s;
}

void save_then_continue(self_ptr self) {
  auto& s = self->state;
  const auto& ck = s.ctx->cfg.checkpoint;
  const bool last = s.round >= static_cast<uint64_t>(s.ctx->cfg.train.rounds);
  const bool due = last || (ck.every_rounds > 0 && s.round % static_cast<uint64_t>(ck.every_rounds) == 0);
  auto next = [=] {
    if (self->state.round >= static_cast<uint64_t>(self->state.ctx->cfg.train.rounds))
      finish(self);
    else
      begin_round(self);
  };
  if (!due) return next();
  set_phase(self, phase::saving);
  // Saving is asynchronous: the snapshot is a set of clones, and training continues while it is written.
  take_snapshot(self, /*boundary=*/true, [=](train_snapshot snap) {
    save(self, std::move(snap), {});
    next();
  });
}

/// Per-worker accounting of the round that just ended: its wall time runs from the previous round's end, so
/// the all-reduce, the outer step, evaluation and checkpoint hand-off all count as idle.
void account_round(self_ptr self) {
  auto& s = self->state;
  const auto now = clock::now();
  const double wall = std::chrono::duration<double>(now - s.t_round_start).count();
  s.t_round_start = now;
  for (size_t i = 0; i < s.round_compute.size(); ++i) {
    const std::string w = std::to_string(i);
    const double compute = s.round_compute[i];
    const double idle = std::max(0.0, wall - compute);
    const double util = wall > 0 ? std::min(1.0, compute / wall) : 0;
    // delayed: the next round starts from a theta that lacks this round's average (one round stale).
    const int64_t staleness = s.delayed ? 1 : 0;
    gauge(self, "longwave_worker_compute_utilization_ratio", util, w);
    gauge(self, "longwave_worker_staleness_rounds", static_cast<double>(staleness), w);
    self->send(s.peers.metrics, count_atom_v, std::string("longwave_worker_idle_seconds_total"), w, idle);
    self->send(s.peers.metrics, count_atom_v, std::string("longwave_worker_stall_seconds_total"), w,
               s.round_stall_s);
    record(self, json_line("worker")
                     .add("round", s.round)
                     .add("worker", static_cast<int64_t>(i))
                     .add("compute_s", compute)
                     .add("wall_s", wall)
                     .add("idle_s", idle)
                     .add("stall_s", s.round_stall_s)
                     .add("utilization", util)
                     .add("staleness", staleness)
                     .add("tokens", s.worker_tokens[i]));
    s.round_compute[i] = 0;
  }
  s.round_stall_s = 0;
}

void eval_then_continue(self_ptr self, at::Tensor theta);

void after_round(self_ptr self, at::Tensor theta) {
  auto& s = self->state;
  const auto& cfg = s.ctx->cfg;
  ++s.round;
  account_round(self);
  gauge(self, "longwave_outer_round", static_cast<double>(s.round));
  const bool last = s.round >= static_cast<uint64_t>(cfg.train.rounds);
  if (s.delayed && last && !s.final_applied && (s.inflight.count(s.round) || s.arrived.count(s.round))) {
    // The last round's average would otherwise be computed and dropped: apply it before the final evaluation,
    // so the result holds every round's work.
    s.final_applied = true;
    spdlog::info("delayed: applying the average of the last round ({}) before the final evaluation", s.round);
    const auto r = s.round;
    return when_average(
        self, r,
        [=](at::Tensor avg) {
          self->state.arrived.erase(r);  // applied: the final snapshot must not carry it as pending
          self->request(self->state.peers.outer, self->state.request_timeout, outer_atom_v, r, avg)
              .then([=](at::Tensor& final_theta) { eval_then_continue(self, final_theta); },
                    [=](caf::error& e) { fail(self, e); });
        },
        /*final=*/true);
  }
  eval_then_continue(self, theta);
}

void eval_then_continue(self_ptr self, at::Tensor theta) {
  auto& s = self->state;
  const auto& cfg = s.ctx->cfg;
  const bool last = s.round >= static_cast<uint64_t>(cfg.train.rounds);
  const bool eval_due =
      last || (cfg.eval.every_rounds > 0 && s.round % static_cast<uint64_t>(cfg.eval.every_rounds) == 0);
  if (!eval_due) return save_then_continue(self);
  set_phase(self, phase::evaluating);
  const auto t0 = clock::now();
  self->request(s.workers[0], s.round_timeout, eval_atom_v, theta, cfg.eval.batches)
      .then(
          [=](double loss) {
            auto& s = self->state;
            s.eval_s += std::chrono::duration<double>(clock::now() - t0).count();
            s.last_val_loss = loss;
            gauge(self, "longwave_val_loss", loss);
            gauge(self, "longwave_val_perplexity", std::exp(loss));
            record(self, json_line("eval")
                             .add("round", s.round)
                             .add("step", s.last_step)
                             .add("val_loss", loss)
                             .add("val_ppl", std::exp(loss)));
            spdlog::info("eval  {:>3}/{} | val loss {:.4f} | val ppl {:.3f}", s.round,
                         s.ctx->cfg.train.rounds, loss, std::exp(loss));
            save_then_continue(self);
          },
          [=](caf::error& e) { fail(self, e); });
}

// ---- delayed outer steps ---------------------------------------------------------------------------------

/// Starts the all-reduce of round r in the background; its average lands in `arrived` (and wakes waiters).
void start_reduce(self_ptr self, uint64_t r, std::vector<at::Tensor> parts) {
  auto& s = self->state;
  s.inflight.insert(r);
  self->request(s.peers.communicator, s.round_timeout, reduce_atom_v, r, std::move(parts))
      .then(
          [=](at::Tensor& avg) {
            auto& s = self->state;
            s.inflight.erase(r);
            s.arrived[r] = avg;
            auto range = s.waiting.equal_range(r);
            std::vector<std::function<void(at::Tensor)>> ks;
            for (auto it = range.first; it != range.second; ++it) ks.push_back(std::move(it->second));
            s.waiting.erase(range.first, range.second);
            for (auto& k : ks) k(avg);
          },
          [=](caf::error& e) {
            auto& s = self->state;
            s.inflight.erase(r);
            if (s.stop_requested && e.category() == caf::atom("longwave") &&
                static_cast<errc>(e.code()) == errc::cancelled)
              return stop_in_allreduce(self, r);
            fail(self, e);
          });
}

/// Calls k with round r's average now if it arrived, else when it arrives. Between rounds the wait is the
/// workers' stall; after the last round (final = true) nothing computes any more, so it is only logged.
void when_average(self_ptr self, uint64_t round, std::function<void(at::Tensor)> k, bool final = false) {
  auto& s = self->state;
  if (s.arrived.count(round)) return k(s.arrived.at(round));
  const auto t0 = clock::now();
  s.waiting.emplace(round, [=](at::Tensor avg) {
    const double waited = std::chrono::duration<double>(clock::now() - t0).count();
    if (final) {
      spdlog::info("delayed: waited {:.2f} s for the all-reduce of the last round ({})", waited, round);
    } else {
      self->state.round_stall_s += waited;
      spdlog::info(
          "delayed: the all-reduce of round {} came {:.2f} s later than needed (the workers stalled)", round,
          waited);
    }
    k(std::move(avg));
  });
}

/// End of round r under "delayed": start r's all-reduce, then apply r-1's average (which ran during round r)
/// and let the workers continue at once. Round 1 (or a resume without a pending average) applies nothing.
void delayed_round_end(self_ptr self, uint64_t r, std::vector<at::Tensor> parts) {
  auto& s = self->state;
  const bool have_previous = r > 1 && (s.arrived.count(r - 1) || s.inflight.count(r - 1));
  start_reduce(self, r, std::move(parts));
  if (!have_previous) {
    spdlog::info(
        "delayed: round {} applies no outer step (no earlier average); its own is applied after "
        "round {}",
        r, r + 1);
    set_phase(self, phase::outer_step);
    return self->request(s.peers.outer, s.request_timeout, theta_atom_v)
        .then([=](at::Tensor& theta) { after_round(self, theta); }, [=](caf::error& e) { fail(self, e); });
  }
  set_phase(self, phase::reducing);
  when_average(self, r - 1, [=](at::Tensor avg) {
    auto& s = self->state;
    if (s.ph != phase::reducing) return;  // stopped meanwhile
    s.arrived.erase(r - 1);
    set_phase(self, phase::outer_step);
    self->request(s.peers.outer, s.request_timeout, outer_atom_v, r - 1, avg)
        .then([=](at::Tensor& theta) { after_round(self, theta); }, [=](caf::error& e) { fail(self, e); });
  });
}

void diloco_round(self_ptr self, at::Tensor theta) {
  auto& s = self->state;
  const auto& cfg = s.ctx->cfg;
  const uint64_t round = s.round + 1;
  gather<round_result>(
      self, s.round_timeout,
      [=](std::vector<round_result> results) {
        auto& s = self->state;
        if (s.ph != phase::inner) return;  // stopped meanwhile
        std::vector<at::Tensor> parts;
        for (auto& r : results) parts.push_back(std::move(r.delta));
        if (s.delayed) return delayed_round_end(self, round, std::move(parts));
        set_phase(self, phase::reducing);
        // The communicator's deadline is comm.timeout_s (the ring's own); this one only guards against a
        // communicator that never answers.
        self->request(s.peers.communicator, s.round_timeout, reduce_atom_v, round, std::move(parts))
            .then(
                [=](at::Tensor& avg) {
                  set_phase(self, phase::outer_step);
                  self->request(self->state.peers.outer, self->state.request_timeout, outer_atom_v, round,
                                avg)
                      .then([=](at::Tensor& new_theta) { after_round(self, new_theta); },
                            [=](caf::error& e) { fail(self, e); });
                },
                [=](caf::error& e) {
                  if (self->state.stop_requested && e.category() == caf::atom("longwave") &&
                      static_cast<errc>(e.code()) == errc::cancelled)
                    return stop_in_allreduce(self, round);
                  fail(self, e);
                });
      },
      run_atom_v, round, theta, cfg.train.inner_steps, s.sync_workers);
}

void ddp_step(self_ptr self);

void ddp_finish_round(self_ptr self) {
  auto& s = self->state;
  // theta_global of ddp is the (identical) replica weights; mirror it into the outer optimizer for
  // evaluation and checkpoints.
  self->request(s.workers[0], s.request_timeout, state_atom_v)
      .then(
          [=](replica_state& r) {
            self->request(self->state.peers.outer, self->state.request_timeout, load_atom_v, r.master,
                          at::Tensor())
                .then(
                    [=](bool) {
                      self->state.ddp_step_in_round = 0;
                      set_phase(self, phase::outer_step);
                      after_round(self, r.master);
                    },
                    [=](caf::error& e) { fail(self, e); });
          },
          [=](caf::error& e) { fail(self, e); });
}

void ddp_step(self_ptr self) {
  auto& s = self->state;
  if (s.stop_requested) return stop_now(self, /*boundary=*/false);
  if (s.ddp_step_in_round >= s.ctx->cfg.train.inner_steps) return ddp_finish_round(self);
  gather<round_result>(
      self, s.round_timeout,
      [=](std::vector<round_result> grads) {
        auto& s = self->state;
        std::vector<at::Tensor> parts;
        std::vector<step_report> reps;
        for (auto& g : grads) {
          reps.push_back(
              {g.rank, 0, g.mean_loss, g.compute_s, s.ctx->inner.batch_size * s.ctx->spec.seq_len});
          parts.push_back(std::move(g.delta));
        }
        self->request(s.peers.communicator, s.request_timeout, reduce_atom_v, s.round + 1, std::move(parts))
            .then(
                [=](at::Tensor& avg) {
                  gather<double>(
                      self, self->state.request_timeout,
                      [=](std::vector<double> apply_s) {
                        auto& s = self->state;
                        ++s.ddp_step_in_round;
                        const int64_t step = static_cast<int64_t>(s.round) * s.ctx->cfg.train.inner_steps +
                                             s.ddp_step_in_round;
                        for (size_t i = 0; i < reps.size(); ++i) {
                          auto r = reps[i];
                          r.step = step;
                          r.compute_s += apply_s[i];
                          on_report(self, r);
                        }
                        ddp_step(self);
                      },
                      apply_atom_v, avg);
                },
                [=](caf::error& e) { fail(self, e); });
      },
      grad_atom_v);
}

void begin_round(self_ptr self) {
  auto& s = self->state;
  if (s.stop_requested) return stop_now(self, /*boundary=*/true);
  set_phase(self, phase::inner);
  if (s.ctx->cfg.run.mode == "ddp") return ddp_step(self);
  self->request(s.peers.outer, s.request_timeout, theta_atom_v)
      .then([=](at::Tensor& theta) { diloco_round(self, theta); }, [=](caf::error& e) { fail(self, e); });
}

void install_resume(self_ptr self) {
  auto& s = self->state;
  set_phase(self, phase::resuming);
  auto snap = std::move(*s.resume);
  s.resume.reset();
  s.round = snap.round;
  s.first_step = s.last_step = static_cast<int64_t>(snap.step);
  if (s.ctx->cfg.run.mode == "ddp") s.ddp_step_in_round = snap.replicas[0].steps_in_round;
  spdlog::info("resuming from round {}, inner step {}", snap.round, snap.step);
  if (s.delayed && snap.pending.defined()) s.arrived[snap.pending_round] = snap.pending;
  if (!s.delayed && snap.pending.defined())
    spdlog::warn(
        "the checkpoint holds the unapplied average of round {} from a diloco.outer = \"delayed\" run; "
        "this run is \"{}\" and will not apply it",
        snap.pending_round, s.ctx->cfg.diloco.outer);
  self->request(s.peers.outer, s.request_timeout, load_atom_v, snap.theta, snap.momentum)
      .then(
          [=](bool) {
            auto left = std::make_shared<size_t>(snap.replicas.size());
            for (size_t i = 0; i < snap.replicas.size(); ++i) {
              self->request(self->state.workers[i], self->state.request_timeout, load_atom_v,
                            snap.replicas[i])
                  .then(
                      [=](bool) {
                        if (--*left == 0) begin_round(self);
                      },
                      [=](caf::error& e) { fail(self, e); });
            }
          },
          [=](caf::error& e) { fail(self, e); });
}

caf::behavior coordinator_fun(self_ptr self, std::shared_ptr<const run_context> ctx, coordinator_peers peers,
                              std::optional<train_snapshot> resume, std::string trace_path) {
  auto& s = self->state;
  s.ctx = ctx;
  s.peers = std::move(peers);
  s.resume = std::move(resume);
  s.sync_workers = ctx->cfg.run.mode != "single";
  s.delayed = ctx->cfg.run.mode == "diloco" && ctx->cfg.diloco.outer == "delayed";
  s.round_timeout = seconds(ctx->cfg.runtime.round_timeout_s);
  s.round_compute.assign(static_cast<size_t>(ctx->n_workers()), 0.0);
  s.run_compute = s.round_compute;
  s.worker_tokens.assign(static_cast<size_t>(ctx->n_workers()), 0);
  s.request_timeout = seconds(ctx->cfg.runtime.request_timeout_s);
  for (int64_t r = 0; r < ctx->n_workers(); ++r)
    s.workers.push_back(spawn_worker(self->system(), ctx, r, caf::actor_cast<caf::actor>(self)));
  if (!trace_path.empty()) s.trace.open(trace_path, std::ios::app);
  self->set_down_handler([=](caf::down_msg& dm) {
    fail(self, make_error(errc::peer_lost, "an actor went down: " + caf::to_string(dm.reason)));
  });
  for (auto& w : s.workers) self->monitor(w);
  self->set_exit_handler([=](caf::exit_msg& em) {
    for (auto& w : self->state.workers) self->send_exit(w, em.reason);
    self->quit(em.reason);
  });
  self->monitor(s.peers.outer);
  self->monitor(s.peers.communicator);
  self->monitor(s.peers.checkpointer);
  return {
      [=](start_atom) {
        auto& s = self->state;
        s.main = caf::actor_cast<caf::actor>(self->current_sender());
        s.t_start = s.t_round_start = clock::now();
        const auto& c = s.ctx->cfg;
        record(self, json_line("start")
                         .add("node", c.run.name)
                         .add("mode", c.run.mode)
                         .add("preset", s.ctx->spec.preset)
                         .add("params", models::closed_form_param_count(s.ctx->spec))
                         .add("workers", s.ctx->n_workers())
                         .add("cluster_workers", s.ctx->global_workers())
                         .add("rounds", c.train.rounds)
                         .add("inner_steps", c.train.inner_steps)
                         .add("batch_size", c.train.batch_size)
                         .add("seq_len", s.ctx->spec.seq_len)
                         .add("inner_lr", c.train.lr)
                         .add("outer_lr", c.outer.lr)
                         .add("outer_momentum", c.outer.momentum)
                         .add("comm_dtype", c.comm.dtype)
                         .add("resumed_step", s.resume ? static_cast<int64_t>(s.resume->step) : int64_t{0}));
        if (s.resume) return install_resume(self);
        // Fresh run: every replica starts from theta_0.
        self->request(s.peers.outer, s.request_timeout, theta_atom_v)
            .then(
                [=](at::Tensor& theta) {
                  gather<bool>(
                      self, self->state.request_timeout, [=](std::vector<bool>) { begin_round(self); },
                      theta_atom_v, theta);
                },
                [=](caf::error& e) { fail(self, e); });
      },
      [=](report_atom, const step_report& r) {
        if (self->state.ph == phase::inner || self->state.ph == phase::stopping) on_report(self, r);
      },
      [=](stop_atom) {
        auto& s = self->state;
        if (s.ph == phase::done || s.ph == phase::failed || s.ph == phase::stopping) return;
        if (s.ph == phase::idle) {
          set_phase(self, phase::stopping);
          set_phase(self, phase::done);
          return notify_main(self, 130);
        }
        // DiLoCo mid-round: workers answer (state) between two inner steps, so stop at once.
        // ddp and the round tail: stop at the next step or round boundary.
        if (s.ph == phase::inner && s.ctx->cfg.run.mode != "ddp") return stop_now(self, /*boundary=*/false);
        s.stop_requested = true;
      },
  };
}

}  // namespace

caf::actor spawn_coordinator(caf::actor_system& sys, std::shared_ptr<const run_context> ctx,
                             coordinator_peers peers, std::optional<train_snapshot> resume,
                             std::string trace_path) {
  return sys.spawn(coordinator_fun, std::move(ctx), std::move(peers), std::move(resume),
                   std::move(trace_path));
}

}  // namespace longwave::actors
