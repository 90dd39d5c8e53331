#pragma once
// A round policy: how one outer round runs (which workers compute what, which all-reduces run when, when
// the outer step applies them) and what that means for stops, snapshots and resumes. The coordinator owns
// the state machine and the round tail (evaluation, checkpoints); the policy drives the rest through
// round_engine. One policy per file; make_round_policy (policy_factory.cpp) picks it from the config.
#include <ATen/core/Tensor.h>

#include <caf/error.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/round/round_engine.hpp"

namespace longwave::actors {

/// Where a Ctrl-C may land.
enum class stop_rule {
  /// At once: the replicas run independently, so they are paused and brought to the furthest step.
  pause_and_align,
  /// At the policy's next stop point (a step or segment boundary), where every replica is at the same step.
  at_next_boundary,
};

class round_policy {
 public:
  explicit round_policy(round_engine& engine) : engine_(engine) {}
  virtual ~round_policy() = default;
  round_policy(const round_policy&) = delete;
  round_policy& operator=(const round_policy&) = delete;

  /// Runs round rounds_done() + 1 from phase inner; ends in engine.round_done(theta), a stop or a failure.
  virtual void begin_round() = 0;
  /// After the last round's outer step: what finishes the run (an average still to apply, a final mean),
  /// then engine.run_trained(theta).
  virtual void finish_run(at::Tensor theta) { engine_.run_trained(std::move(theta)); }

  /// Whether the run is over after `rounds_done` rounds (the round tail's evaluation and checkpoint are the
  /// last, then finish_run): train.rounds, or for async the final version.
  virtual bool run_over(uint64_t rounds_done) const;
  /// diloco.outer = "async": the master announced a merge (or drops). Other policies never get one.
  virtual void on_merge(const runtime::merge_order& order);

  virtual stop_rule stops() const { return stop_rule::pause_and_align; }
  /// Whether the run stands at a round boundary between rounds (streaming may stand between segments).
  virtual bool at_round_boundary() const { return true; }
  /// Whether the nodes of a cluster count the same rounds (a cluster stop names one round for all); async's
  /// rounds are each node's own phases, so it stops at its own next boundary.
  virtual bool shares_rounds() const { return true; }
  /// Fills in what the policy keeps in a snapshot: the replicas' position in the round (boundary: 0), and
  /// its part of the outer optimizer's state (eager's per-replica outer state).
  virtual void fill_snapshot(runtime::train_snapshot& snap, const runtime::outer_snapshot& outer,
                             bool boundary) const;
  /// The all-reduce whose average a snapshot of `round` must carry (delayed, eager: its own round's).
  virtual std::optional<ring_label> pending_average(uint64_t /*round*/) const { return std::nullopt; }
  /// A boundary snapshot lends the live state and training waits for the write; false: it is cloned and
  /// training goes on (it may wait for its pending average).
  virtual bool lends_boundary_snapshot() const { return true; }
  /// The run's inner step at a round boundary when the replicas' step counts differ (client sampling: each
  /// trained only in its drawn rounds); nullopt: every replica is at the run's step.
  virtual std::optional<uint64_t> schedule_step() const { return std::nullopt; }
  /// How many rounds behind the average the next round's theta is (metrics).
  virtual double staleness() const { return 0; }
  /// Takes what the policy needs from a resume snapshot (and adjusts it); an error refuses the resume.
  virtual caf::error resume_from(runtime::train_snapshot& snap);
  /// eager: the per-replica outer state to load into the outer optimizer on resume; empty otherwise.
  virtual std::vector<runtime::eager_outer> replica_outer_state(
      const runtime::train_snapshot& /*snap*/) const {
    return {};
  }
  /// How a stall log names the all-reduce of `label`.
  virtual std::string describe(const ring_label& label) const;

 protected:
  /// What a checkpoint of another policy holds that this one drops, said once: a boundary checkpoint of a
  /// streaming run holds, per worker, inner steps of fragments not yet synchronized (a policy that starts
  /// every round from theta_global drops them); an eager run's, each worker's own outer state (any other
  /// policy keeps one theta_global).
  void warn_dropped_state(const runtime::train_snapshot& snap) const;

  /// A whole DiLoCo round: every worker runs H inner steps from its starting theta (reset: loaded first);
  /// then k gets the round and the workers' pseudo-gradients in rank order, unless a stop came meanwhile.
  /// started: called once the starting thetas came, as the workers are asked to run.
  void run_inner_round(bool reset, std::function<void(uint64_t, std::vector<at::Tensor>)> k,
                       std::function<void()> started = {});

  round_engine& engine_;
};

/// The policy of run.mode and diloco.outer.
std::unique_ptr<round_policy> make_round_policy(round_engine& engine, const run_context& ctx);

}  // namespace longwave::actors
