// Snapshots, checkpoint writes and stops: a consistent snapshot of the outer state and every replica, what
// it must wait for (residuals, a pending average), its write, and a Ctrl-C that ends in one.
#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <memory>

#include "actors/cluster_link.hpp"
#include "actors/coordinator/state.hpp"
#include "actors/run_setup.hpp"
#include "runtime/checkpoint/snapshot_codec.hpp"
#include "runtime/log/log.hpp"

namespace longwave::actors::coordinator_parts {

using namespace longwave::runtime;

struct caught_average {
  ring_label label;
  at::Tensor average;                       ///< once it came
  std::function<void(at::Tensor)> waiting;  ///< the save or publication that waits for it
};

namespace {

/// A snapshot of `round` with the outer state, at inner step `step`; no replicas yet.
train_snapshot outer_part(const coordinator_state& s, uint64_t round, const outer_snapshot& outer,
                          int64_t step) {
  train_snapshot snap;
  snap.round = round;
  snap.theta = outer.theta;
  snap.momentum = outer.momentum;
  snap.meta = std::string(config_marker) + s.ctx->config_toml;
  snap.step = static_cast<uint64_t>(step);
  return snap;
}

/// A replica's inner steps as this node counts them (coordinator_state::step_offset).
int64_t own_steps(self_ptr self, const replica_state& r) {
  return r.adam_steps - self->state.step_offset;
}

using state_parts = std::pair<outer_snapshot, std::vector<replica_state>>;

/// Catches the average a snapshot of `round` holds as pending, when the snapshot is asked for: the next round
/// may start before the snapshot is complete (its answers, the residuals), and its outer step applies and
/// forgets that average.
pending_catch catch_pending(self_ptr self, uint64_t round) {
  auto& s = self->state;
  const auto pending = s.policy->pending_average(round);
  if (!pending || !s.reduces.known(*pending)) return nullptr;
  auto caught = std::make_shared<caught_average>();
  caught->label = *pending;
  s.reduces.when(*pending, [caught](at::Tensor avg) {
    caught->average = avg;
    auto waiting = std::move(caught->waiting);
    caught->waiting = nullptr;
    if (waiting) waiting(std::move(avg));
  });
  return caught;
}

/// Calls k with the snapshot holding its pending average: at once when there is none or it came, else when it
/// comes (a running all-reduce is not forgotten; training goes on meanwhile). If that all-reduce failed (a
/// stop cancelled it), no exact snapshot of the round exists and k is not called: none is saved or served.
void with_pending(self_ptr self, train_snapshot snap, const pending_catch& caught,
                  std::function<void(train_snapshot)> k) {
  if (!caught) return k(std::move(snap));
  const auto r = snap.round;
  auto attach = [r](train_snapshot& into, at::Tensor avg) {
    into.pending = std::move(avg);
    into.pending_round = r;
  };
  if (caught->average.defined()) {
    attach(snap, caught->average);
    return k(std::move(snap));
  }
  if (self->state.reduces.has_failed(caught->label)) {
    spdlog::info("the snapshot of round {} is not saved: the all-reduce of its average failed", r);
    return;
  }
  auto holder = std::make_shared<train_snapshot>(std::move(snap));
  caught->waiting = [holder, attach, k](at::Tensor avg) {
    attach(*holder, std::move(avg));
    k(std::move(*holder));
  };
}

/// Asks the first `workers` workers (msg), then the outer optimizer (state_atom, lend) for their state, and
/// calls k with every answer. The first error fails the run. between, if given, runs in between: the next
/// round may start there. Its workers' requests queue behind these, and the outer optimizer answers the
/// round's theta before it copies its state, which nothing the start of a round sends changes.
template <class... Ts>
void ask_state(self_ptr self, bool lend, size_t workers, caf::timespan timeout,
               std::function<void(state_parts)> k, const std::function<void()>& between, Ts... msg) {
  auto got = std::make_shared<state_parts>();
  auto left = std::make_shared<int>(2);
  auto one_more = [got, left, k] {
    if (--*left == 0) k(std::move(*got));
  };
  gather_each<replica_state>(
      self,
      [=](std::vector<replica_state> reps) {
        got->second = std::move(reps);
        one_more();
      },
      [=](size_t i) { return self->request(self->state.workers[i], timeout, msg...); }, workers);
  if (between) between();
  self->request(self->state.peers.outer, self->state.request_timeout, state_atom_v, lend)
      .then(
          [=](outer_snapshot& outer) {
            got->first = std::move(outer);
            one_more();
          },
          [=](caf::error& e) { fail(self, e); });
}

}  // namespace

/// Gathers a consistent snapshot: outer state and every replica, then hands it to `then`. Boundary snapshots
/// zero steps_in_round. A mid-round DiLoCo snapshot passes `target`: every (paused) replica first runs up to
/// that inner step, so all replicas and the loss trace stop at the same step. lend: the snapshot holds the
/// live buffers instead of clones (a boundary snapshot that training waits for).
void take_snapshot(self_ptr self, bool boundary, std::function<void(train_snapshot, pending_catch)> then,
                   int64_t target, bool lend, std::function<void()> sent) {
  auto& s = self->state;
  // The run's step: the policy's, or (adaptive steps, where a node's own count lags) the schedule's step the
  // workers reported last, else the replicas' count (this node's own). Read now: training may go on (sent).
  auto schedule = s.policy->schedule_step();
  if (!schedule && s.ctx->cfg.diloco.adaptive_steps) schedule = static_cast<uint64_t>(s.last_step);
  const uint64_t round = s.round;
  const auto caught = catch_pending(self, round);
  auto assemble = [=](state_parts got) {
    auto& [outer, reps] = got;
    train_snapshot snap = outer_part(self->state, round, outer,
                                     schedule ? static_cast<int64_t>(*schedule) : own_steps(self, reps[0]));
    // Replicas that differ (a resumed checkpoint whose counters were altered): no snapshot of them.
    for (const auto& r : reps)
      if (!schedule && r.adam_steps != reps[0].adam_steps)
        return fail(self, make_error(errc::corrupt_checkpoint,
                                     fmt::format("worker {} has taken {} inner steps and worker {} {}: the "
                                                 "state this run resumed from is inconsistent (altered by "
                                                 "hand?); move that checkpoint aside to resume from the one "
                                                 "before",
                                                 r.rank, r.adam_steps, reps[0].rank, reps[0].adam_steps)));
    snap.replicas = std::move(reps);
    self->state.policy->fill_snapshot(snap, outer, boundary);
    then(std::move(snap), caught);
  };
  const size_t all = s.workers.size();
  if (target >= 0)
    ask_state(self, lend, all, s.round_timeout, assemble, nullptr, state_atom_v, target);
  else if (lend)
    ask_state(self, lend, all, s.request_timeout, assemble, nullptr, state_atom_v, true);
  else
    ask_state(self, lend, all, s.request_timeout, assemble, sent, state_atom_v);
}

namespace {

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

/// A failed write keeps training while fewer than checkpoint.max_failed_writes failed in a row (the previous
/// checkpoints are intact), then stops the run with exit code 3. Non-finite state is never written: the run
/// fails, naming the round. A lost directory lock stops the run at once (exit 3). The write is waited for
/// however long it takes (the checkpointer says so once a minute): a write given up on could still land,
/// and a lent snapshot's tensors must not change under it.
void save_now(self_ptr self, train_snapshot snap, std::function<void()> then) {
  auto& s = self->state;
  const auto round = snap.round;
  const auto step = snap.step;
  self->request(s.peers.checkpointer, caf::infinite, save_atom_v, std::move(snap))
      .then(
          [=](const std::string& path) {
            auto& s = self->state;
            spdlog::debug("checkpoint of round {} on disk: {}", round, path);
            if (s.failed_writes > 0) spdlog::info("checkpoint: writing works again ({})", path);
            s.failed_writes = 0;
            s.write_error.clear();
            s.newest_on_disk = fmt::format("round {}, inner step {} ({})", round, step, path);
            s.newest_path = path;
            if (then) then();
          },
          [=](caf::error& e) {
            auto& s = self->state;
            if (has_code(e, errc::diverged)) return fail(self, e);
            ++s.failed_writes;
            s.write_error = describe(e);
            if (has_code(e, errc::dir_lost))
              return fail_unsaved(self,
                                  "stopping: this run no longer holds its directory, which another run "
                                  "may use now, so it writes nothing more there");
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

}  // namespace

void publish_boundary(self_ptr self, std::function<void()> then) {
  auto& s = self->state;
  if (!s.ctx->cluster->serves_state()) return then();
  const uint64_t round = s.round;
  const auto schedule = s.policy->schedule_step();  // read now: training goes on before the answers
  const auto caught = catch_pending(self, round);
  ask_state(
      self, false, 1, s.request_timeout,
      [=](state_parts got) {
        auto& [outer, reps] = got;
        train_snapshot snap = outer_part(
            self->state, round, outer, schedule ? static_cast<int64_t>(*schedule) : own_steps(self, reps[0]));
        snap.replicas.push_back(std::move(reps[0]));
        self->state.policy->fill_snapshot(snap, outer, /*boundary=*/true);
        // delayed, eager: served once its round's average is there.
        with_pending(self, std::move(snap), caught, [self](train_snapshot full) {
          const auto& ctx = *self->state.ctx;
          const bool versions = !self->state.policy->shares_rounds();  // async
          ctx.cluster->publish(to_checkpoint(full, shape_of(ctx)),
                               versions ? std::optional<uint64_t>(full.version) : std::nullopt);
        });
      },
      then, state_atom_v, false);  // the next round starts in between: the copies are of this boundary
}

void save(self_ptr self, train_snapshot snap, pending_catch pending, std::function<void()> then) {
  with_residuals(self, std::move(snap), [=](train_snapshot with_ef) {
    with_pending(self, std::move(with_ef), pending,
                 [=](train_snapshot full) { save_now(self, std::move(full), then); });
  });
}

void flush_then(self_ptr self, std::function<void()> then) {
  auto& s = self->state;
  if (s.residual_waits > 0) return s.after_residuals.push_back([=] { flush_then(self, then); });
  self->request(self->state.peers.checkpointer, caf::infinite, flush_atom_v)  // as long as the writes take
      .then([=](bool) { then(); },
            [=](caf::error& e) {
              spdlog::warn("checkpointer flush: {}", describe(e));
              then();
            });
}

void stop_now(self_ptr self, bool boundary) {
  if (!set_phase(self, phase::stopping)) return;
  // The round tail already saved this boundary (a stop during the outer step or the save): wait for that
  // write instead of writing the same checkpoint again. Not for a cloned boundary snapshot (delayed, eager),
  // whose save may still wait for its pending average (a flush now could overtake it).
  const auto& s = self->state;
  const bool saved =
      boundary && s.policy->lends_boundary_snapshot() && s.round > 0 && s.boundary_saved == s.round;
  spdlog::info("stopping: {} checkpoint of round {} ({})", saved ? "waiting for the" : "saving a", s.round,
               boundary ? "round boundary" : "mid-round");
  // The evaluator cannot be interrupted mid-batch: the process ends once its evaluation in flight has.
  if (s.eval_running)
    spdlog::info(
        "stopping: the evaluation of round {} ([eval] async) is in flight; the process ends when it does",
        s.eval_round);
  auto exit_after = [=](uint64_t step) {
    std::function<void()> finish = [=] {
      flush_then(self, [=] {
        if (self->state.ph == phase::failed) return;
        if (self->state.failed_writes > 0)
          return fail_unsaved(self, fmt::format("interrupted at inner step {}, but its checkpoint could not "
                                                "be written",
                                                step));
        spdlog::info("stopped at inner step {}; run the same command {} to resume", step,
                     self->state.ctx->started_fresh ? "without --fresh (which starts over)" : "again");
        if (!set_phase(self, phase::done)) return;
        notify_main(self, 130);
      });
    };
    // An evaluation in flight is waited for, so that its record is in metrics.jsonl before the flush.
    return [=] {
      if (self->state.eval_running)
        self->state.after_eval = finish;
      else
        finish();
    };
  };
  if (saved) return exit_after(static_cast<uint64_t>(s.last_step))();
  auto save_and_exit = [=](train_snapshot snap, pending_catch pending) {
    const auto step = snap.step;
    save(self, std::move(snap), std::move(pending), exit_after(step));
  };
  // ddp and streaming stop between two steps or segments, where every replica is at the same step.
  if (boundary || s.policy->stops() == stop_rule::at_next_boundary)
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

}  // namespace longwave::actors::coordinator_parts
