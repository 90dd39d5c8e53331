// Coordinator: the outer-round state machine.
//   idle -> [resuming ->] inner -> reducing -> outer_step -> [evaluating ->] [saving ->] inner ... -> done
//   ddp: inner runs H synchronous steps (grad -> reduce -> apply), then the same round tail.
//   stop: inner/any -> stopping (snapshot, flush) -> done; any error -> failed.
#include "actors/coordinator.hpp"

#include <ATen/ATen.h>
#include <rapidjson/prettywriter.h>
#include <rapidjson/stringbuffer.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <numeric>

#include "actors/round/inflight.hpp"
#include "actors/round/streaming_schedule.hpp"
#include "actors/worker.hpp"
#include "models/lr_schedule.hpp"
#include "runtime/checkpoint/snapshot_codec.hpp"
#include "runtime/json/json_line.hpp"
#include "runtime/log/log.hpp"
#include "runtime/messages/caf_errors.hpp"
#include "runtime/messages/type_ids.hpp"

namespace longwave::actors {

using namespace longwave::runtime;
using clock = std::chrono::steady_clock;

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
  // Overlap policies (ARCHITECTURE.md, "Outer-step policies"): averages of finished all-reduces not yet
  // applied, all-reduces still running, and what waits for them (an outer step, a snapshot). Keyed by
  // (round, fragment position): delayed/eager use (t, 0), streaming (t, j) for its j-th sync of round t.
  bool one_late = false;  // delayed or eager: round t applies round t-1's average
  bool eager = false, streaming = false;
  inflight_reduces reduces;
  int64_t stream_pos = 0;    // streaming: inner steps of the current round done (at a segment boundary)
  double round_stall_s = 0;  // seconds the workers of the current round waited for a late average
  bool final_applied = false;
  bool eval_running = false;  // [eval] async: an evaluation is in flight
  // Checkpoints on disk: the newest written ("" before any), the consecutive failed writes and the last
  // failure's reason. A failed latest write means the run's current state is not on disk.
  std::string newest_on_disk;
  int64_t failed_writes = 0;
  std::string write_error;
  uint64_t boundary_saved = 0;  // the last round whose boundary snapshot the round tail saved
  bool has_residuals = false;   // cluster with error feedback: snapshots hold the communicator's residuals
  // Snapshots waiting for their residuals, and what waits for them to reach the checkpointer (a flush must
  // not overtake a save).
  int64_t residual_waits = 0;
  std::vector<std::function<void()>> after_residuals;
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

void fail(self_ptr self, const caf::error& e);

/// The only place the phase changes. An illegal move fails the run naming both phases; after the run ended
/// (a late reply), it is refused quietly. Returns whether the move was made.
bool set_phase(self_ptr self, phase to) {
  auto& s = self->state;
  if (!allowed_transition(s.ph, to)) {
    if (is_terminal(s.ph)) {
      spdlog::debug("coordinator: {} -> {} refused: the run has ended", to_string(s.ph), to_string(to));
      return false;
    }
    fail(self, make_error(errc::illegal_transition, fmt::format("the coordinator cannot go from {} to {}",
                                                                to_string(s.ph), to_string(to))));
    return false;
  }
  spdlog::debug("coordinator: {} -> {}", to_string(s.ph), to_string(to));
  s.ph = to;
  return true;
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

bool has_code(const caf::error& e, errc code) {
  return e.category() == caf::atom("longwave") && static_cast<errc>(e.code()) == code;
}

void fail(self_ptr self, const caf::error& e) {
  auto& s = self->state;
  if (s.ph == phase::failed || s.ph == phase::done) return;
  spdlog::error("training failed in phase {}: {}", to_string(s.ph), describe(e));
  set_phase(self, phase::failed);
  notify_main(self, 1);
}

/// Where a resume would start from: the newest checkpoint this run wrote or resumed from.
std::string newest_on_disk(const coordinator_state& s) {
  return s.newest_on_disk.empty() ? std::string("none: a rerun starts over") : s.newest_on_disk;
}

/// The run's state is not on disk: checkpoint writes failed. Ends the run with exit code 3 and a last line
/// that says so.
void fail_unsaved(self_ptr self, const std::string& what) {
  auto& s = self->state;
  if (s.ph == phase::failed || s.ph == phase::done) return;
  spdlog::error("{}: the run's state is NOT on disk (last write error: {}); newest checkpoint on disk: {}",
                what, s.write_error, newest_on_disk(s));
  set_phase(self, phase::failed);
  notify_main(self, 3);
}

/// Sends msg_of(i) to worker i; calls done with the replies in rank order once all arrived.
template <class T>
void gather_each(self_ptr self, caf::timespan timeout, std::function<void(std::vector<T>)> done,
                 std::function<caf::message(size_t)> msg_of) {
  const auto n = self->state.workers.size();
  auto results = std::make_shared<std::vector<T>>(n);
  auto left = std::make_shared<size_t>(n);
  auto failed = std::make_shared<bool>(false);
  for (size_t i = 0; i < n; ++i) {
    self->request(self->state.workers[i], timeout, msg_of(i))
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

/// Sends the same msg to every worker (gather_each).
template <class T, class... Ts>
void gather(self_ptr self, caf::timespan timeout, std::function<void(std::vector<T>)> done, Ts... msg) {
  auto m = caf::make_message(std::move(msg)...);
  gather_each<T>(self, timeout, std::move(done), [m](size_t) { return m; });
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
/// that inner step, so all replicas and the loss trace stop at the same step. lend: the snapshot holds the
/// live buffers instead of clones (a boundary snapshot that training waits for).
void take_snapshot(self_ptr self, bool boundary, std::function<void(train_snapshot)> then,
                   int64_t target = -1, bool lend = false) {
  auto& s = self->state;
  self->request(s.peers.outer, s.request_timeout, state_atom_v, lend)
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
              for (size_t i = 0; i < reps.size(); ++i) {
                auto& r = reps[i];
                if (boundary) r.steps_in_round = 0;
                if (s.ctx->cfg.run.mode == config::run_mode::ddp)
                  r.steps_in_round = boundary ? 0 : s.ddp_step_in_round;
                if (s.streaming) r.steps_in_round = boundary ? 0 : s.stream_pos;
                if (s.eager && outer.size() >= 2 + 3 * (i + 1)) {
                  r.outer_theta = outer[2 + 3 * i];
                  r.outer_momentum = outer[3 + 3 * i];
                  r.prev_delta = outer[4 + 3 * i];
                }
                LW_ASSERT(static_cast<uint64_t>(r.adam_steps) == snap.step,
                          "replicas of a snapshot differ in step");
              }
              snap.replicas = std::move(reps);
              then(std::move(snap));
            };
            if (target >= 0)
              gather<replica_state>(self, self->state.round_timeout, assemble, state_atom_v, target);
            else if (lend)
              gather<replica_state>(self, self->state.request_timeout, assemble, state_atom_v, true);
            else
              gather<replica_state>(self, self->state.request_timeout, assemble, state_atom_v);
          },
          [=](caf::error& e) { fail(self, e); });
}

void when_average(self_ptr self, ring_label key, std::function<void(at::Tensor)> k, bool final);

/// delayed, eager: a snapshot holds the average its next outer step will apply (that of its own round), so a
/// resume continues exactly. If that all-reduce is still running, the snapshot (already cloned) waits for it
/// while training goes on; if it failed (a stop cancelled it), no exact snapshot of the round exists and
/// none is saved (the previous checkpoint stays the newest).
void with_pending(self_ptr self, train_snapshot snap, std::function<void(train_snapshot)> k) {
  auto& s = self->state;
  const auto r = snap.round;
  const ring_label key{r, 0};
  if (s.one_late && s.reduces.has_failed(key)) {
    spdlog::info("the snapshot of round {} is not saved: the all-reduce of its average failed", r);
    return;
  }
  if (!s.one_late || !s.reduces.known(key)) return k(std::move(snap));
  auto holder = std::make_shared<train_snapshot>(std::move(snap));
  auto attach = [holder, k, r](at::Tensor avg) {
    holder->pending = std::move(avg);
    holder->pending_round = r;
    k(std::move(*holder));
  };
  s.reduces.when(key, attach);
}

/// Error feedback in a cluster: a snapshot also holds the communicator's residuals. Asked for when the
/// snapshot is taken, the answer comes after the all-reduces already queued (delayed, eager: the snapshot's
/// own round) and before any later one, off the training path like with_pending (which runs after it).
void with_residuals(self_ptr self, train_snapshot snap, std::function<void(train_snapshot)> k) {
  auto& s = self->state;
  if (!s.has_residuals) return k(std::move(snap));
  auto holder = std::make_shared<train_snapshot>(std::move(snap));
  ++s.residual_waits;
  self->request(s.peers.communicator, s.round_timeout, state_atom_v)
      .then(
          [=](residual_map& r) {
            holder->residuals = std::move(r);
            k(std::move(*holder));  // sends the save, unless it waits for a pending average (with_pending)
            auto& s = self->state;
            if (--s.residual_waits > 0) return;
            auto waiting = std::move(s.after_residuals);
            s.after_residuals.clear();
            for (auto& w : waiting) w();
          },
          [=](caf::error& e) { fail(self, e); });
}

void save_now(self_ptr self, train_snapshot snap, std::function<void()> then);

void save(self_ptr self, train_snapshot snap, std::function<void()> then) {
  with_residuals(self, std::move(snap), [=](train_snapshot with_ef) {
    with_pending(self, std::move(with_ef),
                 [=](train_snapshot full) { save_now(self, std::move(full), then); });
  });
}

/// A failed write keeps training while fewer than checkpoint.max_failed_writes failed in a row (the previous
/// checkpoints are intact), then stops the run with exit code 3. Non-finite state is never written: the run
/// fails, naming the round.
void save_now(self_ptr self, train_snapshot snap, std::function<void()> then) {
  auto& s = self->state;
  const auto round = snap.round;
  const auto step = snap.step;
  self->request(s.peers.checkpointer, s.request_timeout, save_atom_v, std::move(snap))
      .then(
          [=](const std::string& path) {
            auto& s = self->state;
            spdlog::debug("checkpoint of round {} on disk: {}", round, path);
            if (s.failed_writes > 0) spdlog::info("checkpoint: writing works again ({})", path);
            s.failed_writes = 0;
            s.write_error.clear();
            s.newest_on_disk = fmt::format("round {}, inner step {} ({})", round, step, path);
            if (then) then();
          },
          [=](caf::error& e) {
            auto& s = self->state;
            if (has_code(e, errc::diverged)) return fail(self, e);
            ++s.failed_writes;
            s.write_error = describe(e);
            const auto limit = s.ctx->cfg.checkpoint.max_failed_writes;
            spdlog::warn("checkpoint of round {} not written ({} in a row): {}", round, s.failed_writes,
                         s.write_error);
            if (limit > 0 && s.failed_writes >= limit)
              return fail_unsaved(self, fmt::format("stopping after {} failed checkpoint writes in a row "
                                                    "(checkpoint.max_failed_writes)",
                                                    s.failed_writes));
            if (then) then();
          });
}

void flush_then(self_ptr self, std::function<void()> then) {
  auto& s = self->state;
  if (s.residual_waits > 0) return s.after_residuals.push_back([=] { flush_then(self, then); });
  self->request(self->state.peers.checkpointer, self->state.request_timeout, flush_atom_v)
      .then([=](bool) { then(); },
            [=](caf::error& e) {
              spdlog::warn("checkpointer flush: {}", describe(e));
              then();
            });
}

void stop_now(self_ptr self, bool boundary) {
  if (!set_phase(self, phase::stopping)) return;
  // The round tail already saved this boundary (a stop during the outer step or the save): wait for that
  // write instead of writing the same checkpoint again. Not under delayed/eager, whose boundary save may
  // still wait for its pending average (a flush now could overtake it).
  const auto& s = self->state;
  const bool saved = boundary && !s.one_late && s.round > 0 && s.boundary_saved == s.round;
  spdlog::info("stopping: {} checkpoint of round {} ({})", saved ? "waiting for the" : "saving a", s.round,
               boundary ? "round boundary" : "mid-round");
  auto exit_after = [=](uint64_t step) {
    return [=] {
      flush_then(self, [=] {
        if (self->state.ph == phase::failed) return;
        if (self->state.failed_writes > 0)
          return fail_unsaved(self, fmt::format("interrupted at inner step {}, but its checkpoint could not "
                                                "be written",
                                                step));
        spdlog::info("stopped at inner step {}; run the same command again to resume", step);
        if (!set_phase(self, phase::done)) return;
        notify_main(self, 130);
      });
    };
  };
  if (saved) return exit_after(static_cast<uint64_t>(s.last_step))();
  auto save_and_exit = [=](train_snapshot snap) {
    const auto step = snap.step;
    save(self, std::move(snap), exit_after(step));
  };
  // ddp and streaming stop between two steps or segments, where every replica is at the same step.
  if (boundary || self->state.ctx->cfg.run.mode == config::run_mode::ddp || self->state.streaming)
    return take_snapshot(self, boundary, save_and_exit);
  // DiLoCo mid-round: replicas run independently, so pause them, then bring all to the furthest step.
  gather<int64_t>(
      self, self->state.request_timeout,
      [=](std::vector<int64_t> steps) {
        const int64_t target = *std::max_element(steps.begin(), steps.end());
        take_snapshot(self, false, save_and_exit, target);
      },
      pause_atom_v);
}

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
    if (!set_phase(self, phase::done)) return;
    notify_main(self, 130);
  });
}

/// How long a lost ring peer waits for this node's own Ctrl-C before it counts as a failure. launch
/// interrupts every role at once, but the main loop forwards a signal only every 100 ms, so a neighbour
/// that stopped first can close its ring before this node has heard of its own interrupt.
constexpr auto lost_peer_grace = std::chrono::milliseconds(600);

/// The all-reduce `key` failed with `e`. After a stop it ends as one. A lost peer with no stop yet waits
/// lost_peer_grace for this node's own interrupt (lost_atom), then fails the run. Through that wait the key
/// stays in flight, so a snapshot taken meanwhile (delayed, eager) waits for its average instead of being
/// saved without it; none is saved, since the average never comes.
void allreduce_failed(self_ptr self, ring_label key, caf::error e, bool waited = false) {
  const bool stop = ended_by_stop(self, e);
  if (!stop && !waited && has_code(e, errc::peer_lost)) {
    spdlog::debug("round {}: a ring peer left; failing in {} ms unless this node is stopping too", key.first,
                  lost_peer_grace.count());
    self->delayed_send(self, lost_peer_grace, lost_atom_v, key.first, key.second, std::move(e));
    return;
  }
  self->state.reduces.failed(key);  // no-op for sync's all-reduce, which is never in flight
  if (stop) return stop_in_allreduce(self, key.first);
  fail(self, e);
}

// ---- the round ------------------------------------------------------------------------------------------

// result.json in out_dir: the numbers a sweep or a test reads back, one "key": value per line. A loss or
// perplexity that is not finite (no evaluation, or a diverged one) is null: JSON has no NaN, and
// metrics.jsonl writes null too.
void write_result(const coordinator_state& s, double wall) {
  const auto& c = s.ctx->cfg;
  rapidjson::StringBuffer text;
  rapidjson::PrettyWriter<rapidjson::StringBuffer> w(text);
  w.SetIndent(' ', 2);
  auto integer = [&](const char* key, int64_t v) {
    w.Key(key);
    w.Int64(v);
  };
  auto number = [&](const char* key, double v) {
    w.Key(key);
    if (std::isfinite(v))
      w.Double(v);
    else
      w.Null();
  };
  w.StartObject();
  w.Key("mode");
  const std::string mode = config::to_string(c.run.mode);
  w.String(mode.data(), static_cast<rapidjson::SizeType>(mode.size()));
  integer("workers", c.train.workers);
  integer("rounds", static_cast<int64_t>(s.round));
  integer("inner_steps", c.train.inner_steps);
  integer("inner_steps_per_worker", s.last_step);
  number("val_loss", s.last_val_loss);
  number("val_ppl", std::exp(s.last_val_loss));
  integer("tokens", s.total_tokens());
  number("seconds", std::round(wall * 1e3) / 1e3);  // milliseconds
  number("train_seconds", std::round((wall - s.eval_s) * 1e3) / 1e3);
  w.EndObject();
  std::ofstream out(c.run.out_dir + "/result.json", std::ios::trunc);
  out << text.GetString() << '\n';
}

void finish(self_ptr self) {
  auto& s = self->state;
  flush_then(self, [=] {
    auto& s = self->state;
    if (s.ph == phase::failed) return;  // e.g. the last checkpoint writes failed: already reported
    const double wall = std::chrono::duration<double>(clock::now() - s.t_start).count();
    spdlog::info(
        "final: val loss {:.4f} | val perplexity {:.3f} | {} rounds x {} inner steps x {} workers | {}",
        s.last_val_loss, std::exp(s.last_val_loss), s.round, s.ctx->cfg.train.inner_steps, s.ctx->n_workers(),
        format_duration(wall));
    write_result(s, wall);
    if (s.failed_writes > 0)
      return fail_unsaved(self, fmt::format("training finished, but the checkpoint of round {} could not be "
                                            "written",
                                            s.round));
    if (!set_phase(self, phase::done)) return;
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
  if (!set_phase(self, phase::saving)) return;
  s.boundary_saved = s.round;
  // sync, streaming, single, ddp: the snapshot lends the live state (no model-sized clones) and training
  // waits for the write. delayed, eager: clones, and training continues while they are written (a snapshot
  // may wait for its round's average).
  const bool lend = !s.one_late;
  take_snapshot(
      self, /*boundary=*/true,
      [=](train_snapshot snap) {
        if (lend) return save(self, std::move(snap), next);
        save(self, std::move(snap), {});
        next();
      },
      -1, lend);
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
    // delayed, eager: the next round starts from a theta that lacks (most of) this round's average: one
    // round stale. streaming: each fragment's average is applied tau inner steps after its snapshot.
    const double staleness = s.one_late ? 1.0
                                        : (s.streaming ? static_cast<double>(s.ctx->cfg.diloco.tau) /
                                                             static_cast<double>(s.ctx->cfg.train.inner_steps)
                                                       : 0.0);
    gauge(self, "longwave_worker_compute_utilization_ratio", util, w);
    gauge(self, "longwave_worker_staleness_rounds", staleness, w);
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
void eager_finish(self_ptr self);
void streaming_finish(self_ptr self, size_t i);

void after_round(self_ptr self, at::Tensor theta) {
  auto& s = self->state;
  const auto& cfg = s.ctx->cfg;
  ++s.round;
  account_round(self);
  gauge(self, "longwave_outer_round", static_cast<double>(s.round));
  const bool last = s.round >= static_cast<uint64_t>(cfg.train.rounds);
  if (last && !s.final_applied && s.eager) return eager_finish(self);
  if (last && !s.final_applied && s.streaming) return streaming_finish(self, 0);
  const ring_label key{s.round, 0};
  if (s.one_late && last && !s.final_applied && s.reduces.known(key)) {
    // The last round's average would otherwise be computed and dropped: apply it before the final evaluation,
    // so the result holds every round's work.
    s.final_applied = true;
    spdlog::info("delayed: applying the average of the last round ({}) before the final evaluation", s.round);
    const auto r = s.round;
    return when_average(
        self, key,
        [=](at::Tensor avg) {
          self->state.reduces.take(key);  // applied: the final snapshot must not carry it as pending
          self->request(self->state.peers.outer, self->state.request_timeout, outer_atom_v, r, avg)
              .then([=](at::Tensor& final_theta) { eval_then_continue(self, final_theta); },
                    [=](caf::error& e) { fail(self, e); });
        },
        /*final=*/true);
  }
  eval_then_continue(self, theta);
}

/// One evaluation's result, for theta as it was after `round` (inner step `step`).
void on_eval(self_ptr self, uint64_t round, int64_t step, double loss) {
  auto& s = self->state;
  s.last_val_loss = loss;
  gauge(self, "longwave_val_loss", loss);
  gauge(self, "longwave_val_perplexity", std::exp(loss));
  record(self, json_line("eval")
                   .add("round", round)
                   .add("step", step)
                   .add("val_loss", loss)
                   .add("val_ppl", std::exp(loss)));
  spdlog::info("eval  {:>3}/{} | val loss {:.4f} | val ppl {:.3f}", round, s.ctx->cfg.train.rounds, loss,
               std::exp(loss));
}

void eval_then_continue(self_ptr self, at::Tensor theta) {
  auto& s = self->state;
  const auto& cfg = s.ctx->cfg;
  const bool last = s.round >= static_cast<uint64_t>(cfg.train.rounds);
  const bool eval_due =
      last || (cfg.eval.every_rounds > 0 && s.round % static_cast<uint64_t>(cfg.eval.every_rounds) == 0);
  if (!eval_due) return save_then_continue(self);
  const uint64_t round = s.round;
  const int64_t step = s.last_step;
  if (s.peers.evaluator && !last) {
    // Off the training path, on a clone (the next outer step changes theta in place), at most one at a time:
    // if the previous one still runs, this round's is skipped (memory stays one clone, and the last,
    // waited-for evaluation queues behind at most one).
    if (s.eval_running) {
      spdlog::info("eval  {:>3}/{} skipped: the evaluation of an earlier round is still running", round,
                   cfg.train.rounds);
      return save_then_continue(self);
    }
    s.eval_running = true;
    self->request(s.peers.evaluator, s.round_timeout, eval_atom_v, theta.clone(), cfg.eval.batches)
        .then(
            [=](double loss) {
              self->state.eval_running = false;
              on_eval(self, round, step, loss);
            },
            [=](caf::error& e) {
              self->state.eval_running = false;
              spdlog::warn("evaluation of round {} not done: {}", round, describe(e));
            });
    return save_then_continue(self);
  }
  if (!set_phase(self, phase::evaluating)) return;
  const auto t0 = clock::now();
  const auto& by = s.peers.evaluator ? s.peers.evaluator : s.workers[0];
  self->request(by, s.round_timeout, eval_atom_v, theta, cfg.eval.batches)
      .then(
          [=](double loss) {
            self->state.eval_s += std::chrono::duration<double>(clock::now() - t0).count();
            on_eval(self, round, step, loss);
            save_then_continue(self);
          },
          [=](caf::error& e) { fail(self, e); });
}

// ---- overlap policies: delayed, eager, streaming ---------------------------------------------------------

/// Starts the all-reduce of `key` in the background; its average lands in `arrived` (and wakes waiters).
/// Streaming passes the fragment's slices and its position j as the ring's fragment.
void start_reduce(self_ptr self, ring_label key, std::vector<at::Tensor> parts, bool exact = false) {
  auto& s = self->state;
  s.reduces.started(key);
  self->request(s.peers.communicator, s.round_timeout, reduce_atom_v, key.first, key.second, std::move(parts),
                exact)
      .then([=](at::Tensor& avg) { self->state.reduces.arrived(key, avg); },
            [=](caf::error& e) { allreduce_failed(self, key, std::move(e)); });
}

/// Calls k with key's average now if it arrived, else when it arrives. While training, the wait is the
/// workers' stall; after the last round (final = true) nothing computes any more, so it is only logged.
void when_average(self_ptr self, ring_label key, std::function<void(at::Tensor)> k, bool final = false) {
  auto& s = self->state;
  if (s.reduces.has_average(key)) return k(s.reduces.average(key));
  const auto t0 = clock::now();
  s.reduces.when(key, [=](at::Tensor avg) {
    const double waited = std::chrono::duration<double>(clock::now() - t0).count();
    const auto& policy = self->state.ctx->cfg.diloco.outer;
    const std::string what = key.second == 0 ? fmt::format("round {}", key.first)
                             : self->state.streaming
                                 ? fmt::format("round {} fragment sync {}", key.first, key.second)
                                 : std::string("the workers' final parameters");
    if (final) {
      spdlog::info("{}: waited {:.2f} s for the all-reduce of {} after the last round", policy, waited, what);
    } else {
      self->state.round_stall_s += waited;
      // Counted always; logged when it matters (tau = 0 makes every streaming sync a short wait).
      if (waited >= 0.05)
        spdlog::info("{}: the all-reduce of {} came {:.2f} s later than needed (the workers stalled)", policy,
                     what, waited);
    }
    k(std::move(avg));
  });
}

/// The outer step of round r under delayed (the average of r-1) or eager (each replica's proxy from the
/// average of r-1 and its own fresh pseudo-gradient); avg_prev is undefined when there is no earlier average.
void one_late_step(self_ptr self, uint64_t r, at::Tensor avg_prev, std::vector<at::Tensor> deltas) {
  auto& s = self->state;
  if (!set_phase(self, phase::outer_step)) return;
  if (s.eager)
    return self->request(s.peers.outer, s.request_timeout, eager_atom_v, r, avg_prev, std::move(deltas))
        .then([=](std::vector<at::Tensor>& thetas) { after_round(self, thetas[0]); },
              [=](caf::error& e) { fail(self, e); });
  if (!avg_prev.defined())
    return self->request(s.peers.outer, s.request_timeout, theta_atom_v)
        .then([=](at::Tensor& theta) { after_round(self, theta); }, [=](caf::error& e) { fail(self, e); });
  self->request(s.peers.outer, s.request_timeout, outer_atom_v, r - 1, avg_prev)
      .then([=](at::Tensor& theta) { after_round(self, theta); }, [=](caf::error& e) { fail(self, e); });
}

/// End of round r under delayed or eager: start r's all-reduce, then step with r-1's average (which ran
/// during round r) and let the workers continue at once. Round 1 (or a resume without a pending average) has
/// none.
void one_late_round_end(self_ptr self, uint64_t r, std::vector<at::Tensor> parts) {
  auto& s = self->state;
  const ring_label prev{r - 1, 0};
  const bool have_previous = r > 1 && s.reduces.known(prev);
  start_reduce(self, {r, 0}, parts);
  if (!have_previous) {
    spdlog::info("{}: round {} has no earlier average to apply{}", s.ctx->cfg.diloco.outer, r,
                 s.eager ? " (each worker steps with its own pseudo-gradient / M)" : "");
    return one_late_step(self, r, at::Tensor(), std::move(parts));
  }
  if (!set_phase(self, phase::reducing)) return;
  when_average(self, prev, [=](at::Tensor avg) {
    auto& s = self->state;
    if (s.ph != phase::reducing) return;  // stopped meanwhile
    s.reduces.take(prev);
    one_late_step(self, r, avg, parts);
  });
}

/// eager, after the last round: the last average Δ^(T) is applied through one more eager step with no fresh
/// pseudo-gradient (proxy Δ^(T) − Δ_m^(T)/M: the rest of round T's work), then the final parameters are the
/// mean of every worker's outer parameters (one more all-reduce, ring label (T, 1)).
void eager_finish(self_ptr self) {
  auto& s = self->state;
  s.final_applied = true;
  const uint64_t r = s.round;
  spdlog::info("eager: applying the rest of the last round's ({}) average before the final evaluation", r);
  when_average(
      self, {r, 0},
      [=](at::Tensor avg) {
        auto& s = self->state;
        s.reduces.take({r, 0});
        const std::vector<at::Tensor> none(static_cast<size_t>(s.ctx->n_workers()), at::zeros_like(avg));
        self->request(s.peers.outer, s.request_timeout, eager_atom_v, r + 1, avg, none)
            .then(
                [=](std::vector<at::Tensor>& out) {
                  // Ring label (r, 1): after the round's own (r, 0), before anything of a later round.
                  start_reduce(self, {r, 1}, std::vector<at::Tensor>(out.begin() + 1, out.end()),
                               /*exact=*/true);  // parameters: fp32 on the wire
                  when_average(
                      self, {r, 1},
                      [=](at::Tensor mean) {
                        self->state.reduces.take({r, 1});
                        spdlog::info("eager: final parameters = the mean of all {} workers' outer parameters",
                                     self->state.ctx->global_workers());
                        self->request(self->state.peers.outer, self->state.request_timeout, theta_atom_v,
                                      mean)
                            .then([=](bool) { eval_then_continue(self, mean); },
                                  [=](caf::error& e) { fail(self, e); });
                      },
                      /*final=*/true);
                },
                [=](caf::error& e) { fail(self, e); });
      },
      /*final=*/true);
}

// ---- streaming --------------------------------------------------------------------------------------------
// Round t's inner steps are cut into segments at the fragment events: for j = 1..P, fragment j mod P takes
// its snapshot and starts its all-reduce at inner step j*H/P - tau, and is synced at j*H/P (outer step on its
// ranges, then mixed into every replica). Between two events the workers run freely.

/// Concatenates the slices of x that make up a fragment.
at::Tensor fragment_of(const at::Tensor& x, const models::flat_ranges& ranges) {
  std::vector<at::Tensor> slices;
  for (const auto& [off, len] : ranges) slices.push_back(x.narrow(0, off, len));
  return at::cat(slices);
}

/// Starts the all-reduce of one fragment of the workers' pseudo-gradients under ring label `key`.
void reduce_fragment(self_ptr self, ring_label key, const models::flat_ranges& ranges,
                     const std::vector<round_result>& results) {
  std::vector<at::Tensor> parts;
  for (const auto& r : results) parts.push_back(fragment_of(r.delta, ranges));
  start_reduce(self, key, std::move(parts));
}

void streaming_segment(self_ptr self);

streaming_shape streaming_shape_of(const run_context& ctx) {
  return {ctx.cfg.train.inner_steps, ctx.cfg.diloco.fragments, ctx.cfg.diloco.tau};
}

/// Sync point j of the current round: wait for its average, step the fragment, mix it into the replicas.
void streaming_sync(self_ptr self, uint32_t j) {
  auto& s = self->state;
  const uint64_t round = s.round + 1;
  const auto p = static_cast<uint32_t>(s.ctx->fragments.size());
  if (!set_phase(self, phase::reducing)) return;
  when_average(self, {round, j}, [=](at::Tensor avg) {
    auto& s = self->state;
    if (s.ph != phase::reducing) return;
    s.reduces.take({round, j});
    if (!set_phase(self, phase::outer_step)) return;
    self->request(s.peers.outer, s.request_timeout, outer_atom_v, round, j, avg)
        .then(
            [=](at::Tensor& theta) {
              gather<bool>(
                  self, self->state.request_timeout,
                  [=](std::vector<bool>) {
                    if (j == p) return after_round(self, theta);  // the round's last event
                    if (!set_phase(self, phase::inner)) return;
                    streaming_segment(self);
                  },
                  mix_atom_v, theta, j % p, self->state.ctx->cfg.diloco.alpha);
            },
            [=](caf::error& e) { fail(self, e); });
  });
}

/// Runs the workers up to the next event of the round (a snapshot point or a sync point), then handles it.
void streaming_segment(self_ptr self) {
  auto& s = self->state;
  // Ctrl-C: stop where every replica is at the same step and no fragment is in flight.
  if (s.stop_requested && !s.reduces.any_running()) return stop_now(self, /*boundary=*/s.stream_pos == 0);
  const auto e = next_streaming_event(streaming_shape_of(*s.ctx), s.stream_pos);
  const uint64_t round = s.round + 1;
  auto run = [=](at::Tensor theta) {
    gather<round_result>(
        self, self->state.round_timeout,
        [=](std::vector<round_result> results) {
          auto& s = self->state;
          if (s.ph != phase::inner) return;  // stopped meanwhile
          s.stream_pos = e.next_pos();
          if (e.snapshot) reduce_fragment(self, {round, e.j}, s.ctx->fragments[e.fragment], results);
          if (!e.sync) return streaming_segment(self);
          streaming_sync(self, e.j);
        },
        run_atom_v, round, theta, e.steps, false);
  };
  if (!e.snapshot) return run(at::Tensor());  // no pseudo-gradient needed at a sync point
  self->request(s.peers.outer, s.request_timeout, theta_atom_v)
      .then([=](at::Tensor& theta) { run(theta); }, [=](caf::error& e) { fail(self, e); });
}

/// After the last round: fragments 1..P-1 were last synced part-way through it. Their remaining work is
/// all-reduced and applied one by one (ring labels (T, P+f)), so the final parameters hold every step.
void streaming_finish(self_ptr self, size_t i) {
  auto& s = self->state;
  const auto p = static_cast<uint32_t>(s.ctx->fragments.size());
  const auto finals = streaming_final_fragments(streaming_shape_of(*s.ctx));
  if (i >= finals.size()) {
    s.final_applied = true;
    return self->request(s.peers.outer, s.request_timeout, theta_atom_v)
        .then([=](at::Tensor& theta) { eval_then_continue(self, theta); },
              [=](caf::error& e) { fail(self, e); });
  }
  if (i == 0) spdlog::info("streaming: syncing fragments 1..{} once more after the last round", p - 1);
  const uint32_t f = finals[i];
  const uint64_t r = s.round;
  const ring_label key{r, p + f};
  self->request(s.peers.outer, s.request_timeout, theta_atom_v)
      .then(
          [=](at::Tensor& theta) {
            gather<round_result>(
                self, self->state.round_timeout,
                [=](std::vector<round_result> results) {
                  reduce_fragment(self, key, self->state.ctx->fragments[f], results);
                  when_average(
                      self, key,
                      [=](at::Tensor avg) {
                        self->state.reduces.take(key);
                        self->request(self->state.peers.outer, self->state.request_timeout, outer_atom_v, r,
                                      key.second, avg)
                            .then([=](at::Tensor&) { streaming_finish(self, i + 1); },
                                  [=](caf::error& e) { fail(self, e); });
                      },
                      /*final=*/true);
                },
                run_atom_v, r, theta, int64_t{0}, false);
          },
          [=](caf::error& e) { fail(self, e); });
}

// ---- sync, delayed, eager rounds -------------------------------------------------------------------------

/// Round t from each worker's starting parameters (one theta for all, or eager's per-replica ones).
void diloco_round(self_ptr self, std::vector<at::Tensor> thetas) {
  auto& s = self->state;
  const auto& cfg = s.ctx->cfg;
  const uint64_t round = s.round + 1;
  const int64_t h = cfg.train.inner_steps;
  const bool sync = s.sync_workers;
  gather_each<round_result>(
      self, s.round_timeout,
      [=](std::vector<round_result> results) {
        auto& s = self->state;
        if (s.ph != phase::inner) return;  // stopped meanwhile
        std::vector<at::Tensor> parts;
        for (auto& r : results) parts.push_back(std::move(r.delta));
        if (s.one_late) return one_late_round_end(self, round, std::move(parts));
        if (!set_phase(self, phase::reducing)) return;
        // The communicator's deadline is comm.timeout_s (the ring's own); this one only guards against a
        // communicator that never answers.
        self->request(s.peers.communicator, s.round_timeout, reduce_atom_v, round, std::move(parts))
            .then(
                [=](at::Tensor& avg) {
                  if (!set_phase(self, phase::outer_step)) return;
                  self->request(self->state.peers.outer, self->state.request_timeout, outer_atom_v, round,
                                avg)
                      .then([=](at::Tensor& new_theta) { after_round(self, new_theta); },
                            [=](caf::error& e) { fail(self, e); });
                },
                [=](caf::error& e) {
                  allreduce_failed(self, ring_label{round, 0}, std::move(e));
                });
      },
      [=](size_t i) { return caf::make_message(run_atom_v, round, thetas[i], h, sync); });
}

void ddp_step(self_ptr self);

void ddp_finish_round(self_ptr self) {
  auto& s = self->state;
  // theta_global of ddp is the (identical) replica weights; mirror it into the outer optimizer for
  // evaluation and checkpoints. Lent, not cloned: the worker does nothing until the outer optimizer has
  // copied it and the next round starts.
  self->request(s.workers[0], s.request_timeout, state_atom_v, true)
      .then(
          [=](replica_state& r) {
            self->request(self->state.peers.outer, self->state.request_timeout, load_atom_v, r.master,
                          at::Tensor())
                .then(
                    [=](bool) {
                      self->state.ddp_step_in_round = 0;
                      if (!set_phase(self, phase::outer_step)) return;
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
  if (s.stop_requested) return stop_now(self, /*boundary=*/!(s.streaming && s.stream_pos != 0));
  if (!set_phase(self, phase::inner)) return;
  if (s.ctx->cfg.run.mode == config::run_mode::ddp) return ddp_step(self);
  if (s.streaming) return streaming_segment(self);
  self->request(s.peers.outer, s.request_timeout, theta_atom_v, s.ctx->n_workers())
      .then([=](std::vector<at::Tensor>& thetas) { diloco_round(self, thetas); },
            [=](caf::error& e) { fail(self, e); });
}

void install_resume(self_ptr self) {
  auto& s = self->state;
  if (!set_phase(self, phase::resuming)) return;
  auto snap = std::move(*s.resume);
  s.resume.reset();
  s.round = snap.round;
  s.first_step = s.last_step = static_cast<int64_t>(snap.step);
  if (s.ctx->cfg.run.mode == config::run_mode::ddp) s.ddp_step_in_round = snap.replicas[0].steps_in_round;
  spdlog::info("resuming from round {}, inner step {}", snap.round, snap.step);
  s.newest_on_disk =
      fmt::format("round {}, inner step {} (the checkpoint this run resumed from)", snap.round, snap.step);
  if (s.one_late && snap.pending.defined()) s.reduces.restore({snap.pending_round, 0}, snap.pending);
  if (!s.one_late && snap.pending.defined())
    spdlog::warn(
        "the checkpoint holds the unapplied average of round {} from a delayed or eager run; this run is "
        "diloco.outer = \"{}\" and will not apply it",
        snap.pending_round, s.ctx->cfg.diloco.outer);
  if (s.streaming) {
    // The workers count segments themselves; the coordinator continues the round's schedule from here.
    s.stream_pos = snap.replicas[0].steps_in_round;
    const int64_t len = streaming_shape_of(*s.ctx).period();
    if (!streaming_resumable_at(streaming_shape_of(*s.ctx), s.stream_pos))
      return fail(self,
                  make_error(errc::invalid_config,
                             fmt::format("the checkpoint stopped at inner step {} of its round, which is not "
                                         "a fragment sync point of diloco.outer = \"streaming\" (every {} "
                                         "steps); resume with the policy it was written with, or start over "
                                         "with --fresh",
                                         s.stream_pos, len)));
    for (auto& r : snap.replicas) r.steps_in_round = 0;
  }
  // eager: each replica's outer state (a checkpoint of another policy has none: start them from theta).
  std::vector<at::Tensor> eager_state;
  if (s.eager) {
    bool missing = false;
    for (auto& r : snap.replicas) {
      missing = missing || !r.outer_theta.defined();
      eager_state.push_back(r.outer_theta.defined() ? r.outer_theta : snap.theta);
      eager_state.push_back(r.outer_theta.defined() ? r.outer_momentum : snap.momentum);
      eager_state.push_back(r.prev_delta);
    }
    if (missing)
      spdlog::warn(
          "the checkpoint has no per-worker outer state (it is not from an eager run); every worker's "
          "outer state starts from theta_global and its momentum");
  }
  self->request(s.peers.outer, s.request_timeout, load_atom_v, snap.theta, snap.momentum)
      .then(
          [=](bool) {
            auto load_workers = [=] {
              auto left = std::make_shared<size_t>(snap.replicas.size());
              for (size_t i = 0; i < snap.replicas.size(); ++i) {
                self->request(self->state.workers[i], self->state.request_timeout, load_atom_v,
                              snap.replicas[i])
                    .then(
                        [=](bool) {
                          if (--*left == 0 && self->state.ph == phase::resuming) begin_round(self);
                        },
                        [=](caf::error& e) { fail(self, e); });
              }
            };
            auto load_eager = [=] {
              if (eager_state.empty()) return load_workers();
              self->request(self->state.peers.outer, self->state.request_timeout, load_atom_v, eager_state)
                  .then([=](bool) { load_workers(); }, [=](caf::error& e) { fail(self, e); });
            };
            if (!self->state.has_residuals) return load_eager();
            if (snap.residuals.empty() && snap.round > 0)
              spdlog::warn(
                  "the checkpoint holds no error-feedback residuals (written without error feedback or by an "
                  "older version); they start from zero, so this resume is not exact");
            self->request(self->state.peers.communicator, self->state.request_timeout, load_atom_v,
                          snap.residuals)
                .then([=](bool) { load_eager(); }, [=](caf::error& e) { fail(self, e); });
          },
          [=](caf::error& e) { fail(self, e); });
}

caf::behavior coordinator_fun(self_ptr self, std::shared_ptr<const run_context> ctx, coordinator_peers peers,
                              std::optional<train_snapshot> resume, std::string trace_path) {
  auto& s = self->state;
  s.ctx = ctx;
  s.peers = std::move(peers);
  s.resume = std::move(resume);
  using config::outer_policy_kind;
  s.sync_workers = ctx->cfg.run.mode != config::run_mode::single;
  const bool diloco = ctx->cfg.run.mode == config::run_mode::diloco;
  s.eager = diloco && ctx->cfg.diloco.outer == outer_policy_kind::eager;
  s.one_late = diloco && (ctx->cfg.diloco.outer == outer_policy_kind::delayed || s.eager);
  s.streaming = diloco && ctx->cfg.diloco.outer == outer_policy_kind::streaming;
  s.has_residuals = ctx->cluster_workers > 0 && ctx->cfg.comm.error_feedback &&
                    ctx->cfg.comm.dtype != config::wire_dtype::fp32;
  s.round_timeout = seconds(ctx->cfg.runtime.round_timeout_s);
  s.round_compute.assign(static_cast<size_t>(ctx->n_workers()), 0.0);
  s.run_compute = s.round_compute;
  s.worker_tokens.assign(static_cast<size_t>(ctx->n_workers()), 0);
  s.request_timeout = seconds(ctx->cfg.runtime.request_timeout_s);
  for (int64_t r = 0; r < ctx->n_workers(); ++r)
    s.workers.push_back(s.peers.worker_factory
                            ? s.peers.worker_factory(self->system(), r, caf::actor_cast<caf::actor>(self))
                            : spawn_worker(self->system(), ctx, r, caf::actor_cast<caf::actor>(self)));
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
                         .add("mode", config::to_string(c.run.mode))
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
                         .add("comm_dtype", config::to_string(c.comm.dtype))
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
      [=](lost_atom, uint64_t round, uint32_t fragment, caf::error& e) {
        allreduce_failed(self, ring_label{round, fragment}, std::move(e), true);
      },
      [=](stop_atom) {
        auto& s = self->state;
        if (s.ph == phase::done || s.ph == phase::failed || s.ph == phase::stopping) return;
        if (s.ph == phase::idle) {
          if (!set_phase(self, phase::stopping)) return;
          if (!set_phase(self, phase::done)) return;
          return notify_main(self, 130);
        }
        // DiLoCo mid-round: workers answer (state) between two inner steps, so stop at once.
        // ddp and the round tail: stop at the next step or round boundary.
        // streaming: at the next segment boundary with no fragment in flight.
        if (s.ph == phase::inner && s.ctx->cfg.run.mode != config::run_mode::ddp && !s.streaming)
          return stop_now(self, /*boundary=*/false);
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
