// Coordinator: the outer-round state machine (actors/round/phase.hpp) and the actor's wiring.
//   idle -> [resuming ->] inner -> reducing -> outer_step -> [evaluating ->] [saving ->] inner ... -> done
//   The round policy (actors/round/) runs inner .. outer_step; this file owns the round tail (evaluation,
//   checkpoint, next round or the end) and stops: inner/any -> stopping (snapshot, flush) -> done; any
//   error -> failed. Its parts: actors/coordinator/ (engine, progress, snapshots, resume).
#include "actors/coordinator.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <utility>

#include "actors/coordinator/state.hpp"
#include "actors/worker.hpp"
#include "comm/collective.hpp"
#include "runtime/log/log.hpp"

namespace longwave::actors {

namespace coordinator_parts {

using namespace longwave::runtime;

namespace {

caf::timespan seconds(double s) {
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(s));
}

/// Where a resume would start from: the newest checkpoint this run wrote or resumed from, if it is still
/// there.
std::string newest_on_disk(const coordinator_state& s) {
  if (s.ctx->lock_lost)
    if (const auto why = s.ctx->lock_lost(); !why.empty())
      return "unknown: this run no longer holds its directory (" + why + ")";
  if (s.newest_on_disk.empty()) return "none: a rerun starts over";
  if (!s.newest_path.empty() && !std::filesystem::exists(s.newest_path))
    return s.newest_path + " is gone (was the checkpoint directory moved or deleted?)";
  return s.newest_on_disk;
}

}  // namespace

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
  s.count_phase_time();
  s.ph = to;
  return true;
}

void notify_main(self_ptr self, int code) {
  auto& s = self->state;
  if (!s.ended) {
    s.ended = true;
    auto end = end_record(code, s.last_val_loss, since_start(s), s.last_step, s.round);
    if (code == 130 && s.stopped_by) end.add("stopped_by", s.stopped_by);  // the node then exits 0
    record(self, end);
  }
  if (s.main) caf::anon_send(s.main, done_atom_v, code, s.last_val_loss);  // main is not a typed actor
}

void fail(self_ptr self, const caf::error& e) {
  auto& s = self->state;
  if (s.ph == phase::failed || s.ph == phase::done) return;
  std::string hint;
  if (e == caf::sec::request_timeout)  // a worker or actor silent past its deadline
    hint = fmt::format(
        " (no answer within runtime.round_timeout_s = {} s for a round, an evaluation or an all-reduce, or "
        "runtime.request_timeout_s = {} s for any other request: was the process suspended "
        "or the machine overloaded? Raise them for such runs)",
        s.ctx->cfg.runtime.round_timeout_s, s.ctx->cfg.runtime.request_timeout_s);
  spdlog::error("training failed in phase {}: {}{}", to_string(s.ph), describe(e), hint);
  set_phase(self, phase::failed);
  notify_main(self, 1);
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

bool has_code(const caf::error& e, errc code) {
  return e.category() == caf::atom("longwave") && static_cast<errc>(e.code()) == code;
}

/// Ctrl-C (at_boundary false: mid-round where the policy allows it) or a node leaving its cluster (at the
/// next round boundary, or the policy's next boundary).
void request_stop(self_ptr self, bool at_boundary) {
  auto& s = self->state;
  if (s.ph == phase::done || s.ph == phase::failed || s.ph == phase::stopping) return;
  if (s.ph == phase::idle) {
    spdlog::info(
        "stopping before training began (theta_0 not yet set): nothing to save; newest checkpoint: {}",
        newest_on_disk(s));
    if (!set_phase(self, phase::stopping)) return;
    if (!set_phase(self, phase::done)) return;
    return notify_main(self, 130);
  }
  if (!at_boundary && s.ph == phase::evaluating && s.policy->run_over(s.round))
    spdlog::info(
        "interrupt: the last round is trained and its checkpoint saved; the run ends (exit 0) once its final "
        "evaluation is done (Ctrl-C again aborts the evaluation; the checkpoint stays)");
  // Mid-round, the policy says where a stop lands; the round tail stops at the next round boundary.
  if (!at_boundary && s.ph == phase::inner && s.policy->stops() == stop_rule::pause_and_align)
    return stop_now(self, /*boundary=*/false);
  s.stop_requested = true;
  s.stopped_by = at_boundary ? "longwave node --leave" : nullptr;
  if (s.holding) {  // held at a boundary for a cluster stop: stop there
    s.holding = false;
    begin_round(self);
  }
}

/// A cluster stop or a pin asks where this node can hold: at the boundary after the round it is in (it holds
/// there until stop_after, hold_until or release). Asked again, the same answer.
uint64_t hold_at_next_boundary(self_ptr self) {
  auto& s = self->state;
  if (!s.hold_after) s.hold_after = s.round + 1;
  return *s.hold_after;
}

/// A cluster stop: stop at the boundary after `round` (every node of the cluster stops there).
void stop_after(self_ptr self, uint64_t round) {
  auto& s = self->state;
  if (s.stop_after) return;
  // Rounds of its own (async): the boundary this node said it would hold at.
  if (!s.policy->shares_rounds()) round = s.hold_after.value_or(s.round + 1);
  s.stop_after = round;
  if (s.round > round)
    spdlog::warn("the cluster stops after round {}, which this node has passed: it stops after round {}",
                 round, s.round + 1);
  if (s.holding) {
    s.holding = false;
    begin_round(self);
  }
}

/// A pin: hold at the boundary after `round` instead (training on to it if held before it). A stop wins.
void hold_until(self_ptr self, uint64_t round) {
  auto& s = self->state;
  if (s.stop_after) return;
  s.hold_after = round;
  if (s.holding && s.round < round) {
    s.holding = false;
    begin_round(self);
  }
}

/// A pin is over: go on from the boundary. A stop wins.
void release_hold(self_ptr self) {
  auto& s = self->state;
  if (s.stop_after) return;
  s.hold_after.reset();
  if (s.holding) {
    s.holding = false;
    begin_round(self);
  }
}

void begin_round(self_ptr self) {
  auto& s = self->state;
  if (s.stop_after && s.round >= *s.stop_after) {
    s.stop_requested = true;
    s.stopped_by = "longwave stop";
  }
  if (s.stop_requested) return stop_now(self, /*boundary=*/s.policy->at_round_boundary());
  if (s.hold_after && !s.stop_after && s.round >= *s.hold_after) {
    s.holding = true;
    spdlog::info("round {} done: holding at this boundary until the cluster says to go on or where to stop",
                 s.round);
    return;
  }
  if (!set_phase(self, phase::inner)) return;
  s.policy->begin_round();
}

void after_round(self_ptr self, at::Tensor theta) {
  auto& s = self->state;
  ++s.round;
  // A node none of whose workers was drawn reported no steps this round.
  if (const auto step = s.policy->schedule_step())
    s.last_step = std::max(s.last_step, static_cast<int64_t>(*step));
  account_round(self);
  record_round(self, theta);
  gauge(self, "longwave_outer_round", static_cast<double>(s.round));
  if (s.policy->run_over(s.round)) return s.policy->finish_run(std::move(theta));
  eval_then_continue(self, std::move(theta));
}

namespace {

void finish(self_ptr self) {
  auto& s = self->state;
  flush_then(self, [=] {
    auto& s = self->state;
    if (s.ph == phase::failed) return;  // e.g. the last checkpoint writes failed: already reported
    const double wall = std::chrono::duration<double>(clock::now() - s.t_start).count();
    const bool phases = !s.policy->shares_rounds();  // async: a node's rounds are its own phases
    spdlog::info("final: val loss {:.4f} | val perplexity {} | {} {} x {} inner steps x {} workers{} | {}",
                 s.last_val_loss, readable(std::exp(s.last_val_loss), 3), s.round,
                 phases ? "phases" : "rounds", s.ctx->cfg.train.inner_steps, s.ctx->n_workers(),
                 phases ? fmt::format(", to version {}", s.version) : std::string(), format_duration(wall));
    // An async node that resumed at the run's last version and adopted no newer one trained nothing: the
    // earlier session's result.json (its time, its tokens) stays.
    std::error_code ec;
    const bool same = s.resumed_version && *s.resumed_version == s.version && s.session_tokens() == 0 &&
                      std::filesystem::exists(s.ctx->cfg.run.out_dir + "/result.json", ec);
    const std::string unwritten = same ? std::string() : write_result(s, wall);
    if (s.failed_writes > 0)
      return fail_unsaved(self, fmt::format("training finished, but the checkpoint of round {} could not be "
                                            "written",
                                            s.round));
    if (!unwritten.empty()) {
      spdlog::error("training finished and its checkpoint is saved, but result.json could not be written: {}",
                    unwritten);
      set_phase(self, phase::failed);
      return notify_main(self, 1);  // its state is on disk (3 says it is not)
    }
    if (!set_phase(self, phase::done)) return;
    notify_main(self, 0);
  });
  (void)s;
}

/// Evaluates theta on the training path (phase evaluating), records it, then k.
void evaluate(self_ptr self, at::Tensor theta, std::function<void()> k) {
  auto& s = self->state;
  if (!set_phase(self, phase::evaluating)) return;
  const uint64_t round = s.round, version = s.version;  // async: theta's version now, not at the result
  const int64_t step = s.last_step;
  const auto t0 = clock::now();
  const evaluator_actor by = s.peers.evaluator ? s.peers.evaluator : evaluator_actor{s.workers[0]};
  self->request(by, s.round_timeout, eval_atom_v, std::move(theta), s.ctx->cfg.eval.batches)
      .then(
          [=](double loss) {
            self->state.eval_s += std::chrono::duration<double>(clock::now() - t0).count();
            on_eval(self, round, version, step, loss);
            k();
          },
          [=](caf::error& e) { fail(self, e); });
}

/// The run's last round is trained: once its checkpoint is written, its final evaluation, then the end.
void final_eval(self_ptr self) {
  auto theta = std::exchange(self->state.final_theta, at::Tensor{});
  if (!theta.defined()) return finish(self);
  flush_then(self, [self, theta] {
    if (self->state.ph != phase::failed) evaluate(self, theta, [self] { finish(self); });
  });
}

void save_then_continue(self_ptr self) {
  auto& s = self->state;
  const auto& ck = s.ctx->cfg.checkpoint;
  const bool last = s.policy->run_over(s.round);
  const bool due = last || (ck.every_rounds > 0 && s.round % static_cast<uint64_t>(ck.every_rounds) == 0);
  auto next = [=] {
    if (self->state.policy->run_over(self->state.round))
      final_eval(self);
    else
      publish_boundary(self, [=] { begin_round(self); });
  };
  if (!due) return next();
  if (!set_phase(self, phase::saving)) return;
  s.boundary_saved = s.round;
  // sync, streaming, single, ddp: the snapshot lends the live state (no model-sized clones) and training
  // waits for the write. delayed, eager: copies, and training continues once they are asked for (a snapshot
  // may wait for its round's average); but the last round's, and a snapshot with residuals (asked for when
  // it arrives), first arrive (final_eval waits for the last one's write).
  const bool lend = s.policy->lends_boundary_snapshot();
  const bool early = !lend && !last && !s.has_residuals;
  take_snapshot(
      self, /*boundary=*/true,
      [=](train_snapshot snap, pending_catch pending) {
        if (lend) return save(self, std::move(snap), std::move(pending), next);
        save(self, std::move(snap), std::move(pending), {});
        if (!early) next();
      },
      -1, lend, early ? std::function<void()>(next) : nullptr);
}

}  // namespace

void eval_then_continue(self_ptr self, at::Tensor theta) {
  auto& s = self->state;
  const auto& cfg = s.ctx->cfg;
  const bool last = s.policy->run_over(s.round);
  const bool eval_due =
      last || (cfg.eval.every_rounds > 0 && s.round % static_cast<uint64_t>(cfg.eval.every_rounds) == 0);
  if (!eval_due) return save_then_continue(self);
  // The final evaluation comes after the last round's checkpoint: an interrupt or a crash in it (a long
  // eval) keeps the trained run. (async: a node that resumed at the run's last version ends from its inner
  // phase, which goes to evaluating, and trained nothing to save first.)
  if (last && allowed_transition(s.ph, phase::saving)) {
    s.final_theta = std::move(theta);
    return save_then_continue(self);
  }
  const uint64_t round = s.round, version = s.version;  // async: theta's version now, not at the result
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
    s.eval_round = round;
    // The next round starts first; the clone is the outer optimizer's, on its thread, after it answered
    // the round's theta and before any later step changes theta.
    save_then_continue(self);
    if (is_terminal(self->state.ph)) {
      self->state.eval_running = false;
      return;
    }
    auto not_done = [=](const caf::error& e) {
      self->state.eval_running = false;
      spdlog::warn("evaluation of round {} not done: {}", round, describe(e));
      if (auto k = std::exchange(self->state.after_eval, {})) k();
    };
    self->request(self->state.peers.outer, self->state.request_timeout, theta_atom_v, true)
        .then(
            [=](at::Tensor copy) {
              self->request(self->state.peers.evaluator, self->state.round_timeout, eval_atom_v,
                            std::move(copy), self->state.ctx->cfg.eval.batches)
                  .then(
                      [=](double loss) {
                        self->state.eval_running = false;
                        on_eval(self, round, version, step, loss);
                        if (auto k = std::exchange(self->state.after_eval, {})) k();
                      },
                      [=](caf::error& e) { not_done(e); });
            },
            [=](caf::error& e) { not_done(e); });
    return;
  }
  evaluate(self, std::move(theta), [self] { save_then_continue(self); });
}

namespace {

/// A cluster's fresh start: theta_0 depends on the CPU kernels that draw it (ATen's vector and scalar normal
/// samplers differ), so every node takes the ring's rank 0's, as an exact all-reduce (label 0/1, before any
/// round's) to which only rank 0 contributes weight (the next epoch's rank 0 if it is lost). One process:
/// its own.
void adopt_initial_theta(self_ptr self, at::Tensor theta, std::function<void(at::Tensor)> k) {
  auto& s = self->state;
  if (s.ctx->cluster_workers == 0) return k(std::move(theta));
  const ring_label label{0, 1};
  self->request(s.peers.communicator, s.round_timeout, reduce_atom_v,
                reduce_request{label, {theta.clone()}, /*exact=*/true, comm::rank0_weight})
      .then(
          [=](reduced& r) {
            auto& theta0 = r.avg;
            spdlog::info("theta_0: the ring's rank 0's, as every node starts");
            self->state.engine->set_theta(theta0, [=](bool) { k(theta0); });
          },
          [=](caf::error& e) { allreduce_failed(self, label, std::move(e)); });
}

coordinator_actor::behavior_type coordinator_fun(self_ptr self, std::shared_ptr<const run_context> ctx,
                                                 coordinator_peers peers,
                                                 std::optional<train_snapshot> resume,
                                                 std::string trace_path) {
  auto& s = self->state;
  s.ctx = ctx;
  s.peers = std::move(peers);
  s.resume = std::move(resume);
  s.engine = std::make_unique<coordinator_engine>(self);
  s.policy = make_round_policy(*s.engine, *ctx);
  // Sparse always carries residuals, a dense lossy dtype with comm.error_feedback (a single process too,
  // which is one node).
  s.has_residuals = ctx->cfg.comm.dtype == config::wire_dtype::sparse ||
                    (ctx->cfg.comm.error_feedback && ctx->cfg.comm.dtype != config::wire_dtype::fp32);
  s.round_timeout = seconds(ctx->cfg.runtime.round_timeout_s);
  s.round_compute.assign(static_cast<size_t>(ctx->n_workers()), 0.0);
  s.run_compute = s.round_compute;
  s.worker_tokens.assign(static_cast<size_t>(ctx->n_workers()), 0);
  s.tokens_before = s.worker_tokens;
  s.round_gpu_s.assign(static_cast<size_t>(ctx->n_workers()), -1.0);
  s.gpu_peak.assign(static_cast<size_t>(ctx->n_workers()), 0);
  s.round_host.assign(static_cast<size_t>(ctx->n_workers()), {});
  s.request_timeout = seconds(ctx->cfg.runtime.request_timeout_s);
  for (int64_t r = 0; r < ctx->n_workers(); ++r)
    s.workers.push_back(
        s.peers.worker_factory
            ? s.peers.worker_factory(self->system(), r, caf::actor_cast<coordinator_actor>(self))
            : spawn_worker(self->system(), ctx, r, caf::actor_cast<coordinator_actor>(self)));
  if (!trace_path.empty()) {
    s.trace_path = trace_path;
    s.trace.open(trace_path, std::ios::app);
    if (!s.trace)
      spdlog::warn("cannot open {} for appending: this run's loss trace is not written", trace_path);
  }
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
        record_start(self);
        if (s.resume) return install_resume(self);
        // Fresh run: every replica starts from theta_0 (in a cluster, the ring's rank 0's).
        self->request(s.peers.outer, s.request_timeout, theta_atom_v)
            .then(
                [=](at::Tensor& theta) {
                  adopt_initial_theta(self, theta, [=](at::Tensor theta) {
                    gather<bool>(
                        self, self->state.request_timeout, [=](std::vector<bool>) { begin_round(self); },
                        set_atom_v, theta);
                  });
                },
                [=](caf::error& e) { fail(self, e); });
      },
      [=](report_atom, const step_report& r) {
        if (self->state.ph == phase::inner || self->state.ph == phase::stopping) on_report(self, r);
      },
      [=](lost_atom, ring_label label, caf::error& e) { allreduce_failed(self, label, std::move(e), true); },
      [=](lost_atom, caf::error& e) {
        if (!is_terminal(self->state.ph) && self->state.ph != phase::stopping) fail(self, e);
      },
      [=](stop_atom) { request_stop(self, /*at_boundary=*/false); },
      [=](stop_atom, done_atom) { request_stop(self, /*at_boundary=*/true); },
      [=](hold_atom) { return hold_at_next_boundary(self); },
      [=](stop_atom, uint64_t round) { stop_after(self, round); },
      [=](hold_atom, uint64_t round) { hold_until(self, round); },
      [=](hold_atom, done_atom) { release_hold(self); },
      [=](merge_atom, const merge_order& order) {
        if (!is_terminal(self->state.ph)) self->state.policy->on_merge(order);
      },
  };
}

}  // namespace

}  // namespace coordinator_parts

runtime::coordinator_actor spawn_coordinator(caf::actor_system& sys, std::shared_ptr<const run_context> ctx,
                                             coordinator_peers peers,
                                             std::optional<runtime::train_snapshot> resume,
                                             std::string trace_path) {
  return sys.spawn(coordinator_parts::coordinator_fun, std::move(ctx), std::move(peers), std::move(resume),
                   std::move(trace_path));
}

}  // namespace longwave::actors
