#pragma once
// What a round policy may ask of the coordinator: the narrow interface between actors/round/ and the actor
// that owns the state machine. Every call is asynchronous: the continuation runs on the coordinator when the
// answer comes; a failed request fails the run (the continuation is never called).
#include <ATen/core/Tensor.h>

#include <caf/error.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "actors/round/inflight.hpp"
#include "actors/round/phase.hpp"
#include "actors/run_context.hpp"
#include "runtime/json/json_line.hpp"
#include "runtime/messages/messages.hpp"

namespace longwave::actors {

class round_engine {
 public:
  template <class T>
  using then = std::function<void(T)>;
  using results = std::vector<runtime::round_result>;

  virtual ~round_engine() = default;

  // ---- the run -------------------------------------------------------------------------------------------
  virtual const run_context& context() const = 0;
  /// Completed outer rounds: the round being trained is rounds_done() + 1.
  virtual uint64_t rounds_done() const = 0;
  /// Ctrl-C came and waits for a point where the policy can stop (stop_rule::at_next_boundary).
  virtual bool stop_requested() const = 0;
  virtual phase current_phase() const = 0;
  /// Moves the state machine; false if the move was refused (the run has failed or ended): return at once.
  virtual bool set_phase(phase to) = 0;
  virtual void fail(const caf::error& e) = 0;
  /// Stops here: saves a snapshot (of a round boundary, or mid-round) and ends with exit code 130.
  virtual void stop_now(bool boundary) = 0;
  /// The round's outer step is done and theta is the new theta_global: evaluation, checkpoint, next round
  /// (or the policy's finish_run after the last round).
  virtual void round_done(at::Tensor theta) = 0;
  /// After finish_run: theta is the run's final theta_global (the final evaluation, checkpoint, exit 0).
  virtual void run_trained(at::Tensor theta) = 0;

  // ---- workers -------------------------------------------------------------------------------------------
  /// Worker i runs steps[i] inner steps of `round` (one count: the same for all), its pseudo-gradient
  /// measured from thetas[i] (one tensor: the same for all; undefined: none needed). reset: the replica
  /// first loads thetas[i]; false: it goes on from its own weights (single mode, streaming). fragment >= 0:
  /// each pseudo-gradient is that streaming fragment's only, its ranges packed in order (a GPU copies no
  /// more). Answers in rank order.
  virtual void run_workers(uint64_t round, std::vector<at::Tensor> thetas, std::vector<int64_t> steps,
                           bool reset, int64_t fragment, then<results> k) = 0;
  void run_workers(uint64_t round, std::vector<at::Tensor> thetas, std::vector<int64_t> steps, bool reset,
                   then<results> k) {
    run_workers(round, std::move(thetas), std::move(steps), reset, -1, std::move(k));
  }
  /// Mixes the synced fragment of theta into every replica (streaming, weight alpha on the replica).
  virtual void mix(at::Tensor theta, uint32_t fragment, double alpha, then<bool> k) = 0;
  /// ddp: every worker's gradient of one batch; then apply the averaged gradient (seconds each took).
  virtual void gradients(then<results> k) = 0;
  virtual void apply_gradient(at::Tensor avg, then<std::vector<double>> k) = 0;
  /// ddp: worker 0's live state (lent: the worker steps nothing until the next round starts).
  virtual void lend_replica(then<runtime::replica_state> k) = 0;
  /// Progress of one inner step (ddp reports its steps itself: the workers only compute).
  virtual void report(const runtime::step_report& r) = 0;

  // ---- outer optimizer -----------------------------------------------------------------------------------
  virtual void theta(then<at::Tensor> k) = 0;
  /// One starting theta per local worker (eager: each replica's own outer parameters).
  virtual void thetas(then<std::vector<at::Tensor>> k) = 0;
  virtual void set_theta(at::Tensor theta, then<bool> k) = 0;
  /// ddp: theta_global becomes the replicas' weights (copied, no momentum).
  virtual void mirror_theta(at::Tensor weights, then<bool> k) = 0;
  /// Applies the average of `round` (fragment 0: the whole of theta; j > 0: streaming's j-th sync).
  virtual void outer_step(uint64_t round, uint32_t fragment, at::Tensor avg, then<at::Tensor> k) = 0;
  /// The whole-theta outer step of `round`'s average, computed ahead (while the inner steps run); the
  /// outer_step of the same round and average then takes no time. Nothing else changes.
  virtual void prepare_outer_step(uint64_t round, at::Tensor avg) = 0;
  /// diloco.outer = "async": version's merge, the mean of `arrivals` contributions (Delayed Nesterov).
  virtual void merge_step(uint64_t version, at::Tensor avg, int64_t arrivals, then<at::Tensor> k) = 0;
  /// eager: each replica's proxy step from avg_prev and its own pseudo-gradient.
  virtual void eager_step(uint64_t round, at::Tensor avg_prev, std::vector<at::Tensor> deltas,
                          then<runtime::eager_thetas> k) = 0;

  // ---- communicator --------------------------------------------------------------------------------------
  /// The all-reduce of `label` now, while the workers wait. A failure ends as a stop, waits for this node's
  /// own interrupt after a lost peer, or fails the run. weight: this node's weight, the workers behind
  /// parts (-1: parts.size(), or under adaptive steps their share of tokens; 0: parts is one zero tensor, and
  /// the node only relays). empty_ok (client sampling): every node may weigh 0, and k then gets an undefined
  /// tensor (nothing to average) instead of the run failing.
  virtual void reduce_now(ring_label label, std::vector<at::Tensor> parts, then<at::Tensor> k,
                          double weight = -1, bool empty_ok = false) = 0;
  /// ddp: one gradient all-reduce (any failure fails the run). step: the run's step it is for, counted from
  /// 1 (the all-reduce's label, which increases from call to call).
  virtual void reduce_gradients(uint64_t step, std::vector<at::Tensor> parts, then<at::Tensor> k) = 0;
  /// Starts the all-reduce of `label` in the background (exact: fp32 on the wire; weight as reduce_now's).
  virtual void start_reduce(ring_label label, std::vector<at::Tensor> parts, bool exact = false,
                            double weight = -1) = 0;
  /// Calls k with label's average now if it arrived, else when it arrives. During training the wait counts
  /// as the workers' stall; after the last round (final) it is only logged.
  virtual void when_average(ring_label label, then<at::Tensor> k, bool final = false) = 0;
  virtual inflight_reduces& reduces() = 0;

  // ---- the cluster (diloco.outer = "async") --------------------------------------------------------------
  /// This node's name in its cluster ("" for one process alone).
  virtual std::string node_name() const = 0;
  /// This node's rank in its ring and the ring's size ({0, 1} alone).
  virtual std::pair<int64_t, int64_t> ring_rank() const = 0;
  /// The outer optimizer's state (clones), and installing one.
  virtual void outer_state(then<runtime::outer_snapshot> k) = 0;
  virtual void load_outer(runtime::outer_snapshot state, then<bool> k) = 0;
  /// Tells the master this node's pseudo-gradient from version v_start (`tokens` trained) is ready to merge.
  virtual void contribute(uint64_t v_start, uint64_t tokens) = 0;
  /// theta is version `version`: adds theta's CRC-32C to `line` (a "version" record of metrics.jsonl), writes
  /// it, and reports the CRC to the master.
  virtual void version_done(uint64_t version, const at::Tensor& theta, runtime::json_line line) = 0;
  /// A line of metrics.jsonl.
  virtual void record(runtime::json_line line) = 0;
  /// A metric of the catalogue (runtime/metrics/metric_catalogue.cpp): a histogram observation, or an
  /// addition to a counter.
  virtual void observe(const char* name, double value) = 0;
  virtual void count(const char* name, double value) = 0;
};

}  // namespace longwave::actors
