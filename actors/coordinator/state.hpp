#pragma once
// The coordinator's state and the functions its files share (actors/coordinator.cpp holds the state machine
// and the actor; this folder its parts). Internal to the coordinator: nothing outside it includes this.
#include <caf/all.hpp>

#include <algorithm>
#include <array>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "actors/coordinator.hpp"
#include "actors/round/inflight.hpp"
#include "actors/round/round_engine.hpp"
#include "actors/round/round_policy.hpp"
#include "runtime/json/json_line.hpp"
#include "runtime/messages/caf_errors.hpp"
#include "runtime/messages/interfaces.hpp"

namespace longwave::actors::coordinator_parts {

using clock = std::chrono::steady_clock;
using runtime::train_snapshot;

struct coordinator_state;
using self_ptr = runtime::coordinator_actor::stateful_pointer<coordinator_state>;

/// round_engine for the policies: each call is a request to a peer actor made by the coordinator.
class coordinator_engine final : public round_engine {
 public:
  explicit coordinator_engine(self_ptr self) : self_(self) {}

  const run_context& context() const override;
  uint64_t rounds_done() const override;
  bool stop_requested() const override;
  phase current_phase() const override;
  bool set_phase(phase to) override;
  void fail(const caf::error& e) override;
  void stop_now(bool boundary) override;
  void round_done(at::Tensor theta) override;
  void run_trained(at::Tensor theta) override;

  using round_engine::run_workers;
  void run_workers(uint64_t round, std::vector<at::Tensor> thetas, std::vector<int64_t> steps, bool reset,
                   int64_t fragment, then<results> k) override;
  void mix(at::Tensor theta, uint32_t fragment, double alpha, then<bool> k) override;
  void gradients(then<results> k) override;
  void apply_gradient(at::Tensor avg, then<std::vector<double>> k) override;
  void lend_replica(then<runtime::replica_state> k) override;
  void report(const runtime::step_report& r) override;

  void theta(then<at::Tensor> k) override;
  void thetas(then<std::vector<at::Tensor>> k) override;
  void set_theta(at::Tensor theta, then<bool> k) override;
  void mirror_theta(at::Tensor weights, then<bool> k) override;
  void outer_step(uint64_t round, uint32_t fragment, at::Tensor avg, then<at::Tensor> k) override;
  void prepare_outer_step(uint64_t round, at::Tensor avg) override;
  void merge_step(uint64_t version, at::Tensor avg, int64_t arrivals, then<at::Tensor> k) override;
  void eager_step(uint64_t round, at::Tensor avg_prev, std::vector<at::Tensor> deltas,
                  then<runtime::eager_thetas> k) override;

  void reduce_now(ring_label label, std::vector<at::Tensor> parts, then<at::Tensor> k, double weight,
                  bool empty_ok) override;
  void reduce_gradients(uint64_t step, std::vector<at::Tensor> parts, then<at::Tensor> k) override;
  void start_reduce(ring_label label, std::vector<at::Tensor> parts, bool exact, double weight) override;
  void when_average(ring_label label, then<at::Tensor> k, bool final) override;
  inflight_reduces& reduces() override;

  std::string node_name() const override;
  std::pair<int64_t, int64_t> ring_rank() const override;
  void outer_state(then<runtime::outer_snapshot> k) override;
  void load_outer(runtime::outer_snapshot state, then<bool> k) override;
  void contribute(uint64_t v_start, uint64_t tokens) override;
  void version_done(uint64_t version, const at::Tensor& theta, runtime::json_line line) override;
  void record(runtime::json_line line) override;
  void observe(const char* name, double value) override;
  void count(const char* name, double value) override;

 private:
  /// The weight of a node's average for `label` (-1: its parts' count): adaptive steps weigh a round's
  /// pseudo-gradients by the steps trained.
  double weight_of(const ring_label& label, bool exact, double weight) const;
  /// A request to `to` whose answer goes to k and whose error fails the run.
  template <class T, class Handle, class... Ts>
  void ask(const Handle& to, caf::timespan timeout, then<T> k, Ts&&... xs);

  self_ptr self_;
};

struct step_agg {
  int64_t count = 0;
  double loss_sum = 0;
};

struct coordinator_state {
  std::shared_ptr<const run_context> ctx;
  coordinator_peers peers;
  std::vector<runtime::worker_actor> workers;
  caf::actor main;
  phase ph = phase::idle;
  // Seconds in each phase since the last round record (its <phase>_s keys), and when this phase began.
  std::array<double, phase_count> phase_secs{};
  clock::time_point phase_began = clock::now();
  /// Adds the current phase's time so far to phase_secs (at a phase change, and at a round record).
  void count_phase_time() {
    const auto now = clock::now();
    phase_secs[static_cast<size_t>(ph)] += std::chrono::duration<double>(now - phase_began).count();
    phase_began = now;
  }
  std::unique_ptr<coordinator_engine> engine;
  std::unique_ptr<round_policy> policy;
  std::optional<train_snapshot> resume;
  uint64_t round = 0;    // completed outer rounds
  uint64_t version = 0;  // async: the newest version of theta applied here (its rounds are local phases)
  std::optional<uint64_t> resumed_version;  // the version of the checkpoint this session resumed from
  bool stop_requested = false;
  const char* stopped_by = nullptr;  // a stop at a boundary: "longwave stop" or "longwave node --leave"
  // A cluster stop (longwave stop), or a pin (holding while a joiner fetches): hold at the boundary after
  // hold_after until stop_after is known (then stop at the boundary after it), a pin moves hold_after, or a
  // pin is released.
  std::optional<uint64_t> hold_after, stop_after;
  bool holding = false;  // waiting at a boundary for stop_after, or a pin's release
  // Progress and metrics.
  std::map<int64_t, step_agg> steps;
  int64_t last_step = 0, first_step = 0;  // this node's own inner steps
  /// Adam's step count (the replicas') less this node's own inner steps: async, a node that rejoined keeps
  /// its donor's count with its donor's moments (bias correction), but reports and saves its own steps.
  int64_t step_offset = 0;
  /// Workers that step in the current run_workers call, whose reports make up a step; 0: all of them.
  int64_t reporting_workers = 0;
  clock::time_point t_start;
  double last_val_loss = std::numeric_limits<double>::quiet_NaN();
  double eval_s = 0;  // wall time spent evaluating (excluded from train_seconds)
  // Per local worker: compute seconds in the current round and since start, tokens since start, and tokens
  // of the run before this session (a resume: its sampler position x the tokens of a batch). The node's
  // totals are their sums.
  std::vector<double> round_compute, run_compute;
  std::vector<int64_t> worker_tokens, tokens_before;
  /// Per local worker on a GPU: device seconds of the current round's steps (CUDA events), and its GPU's peak
  /// allocated bytes; -1 for a worker on the CPU.
  std::vector<double> round_gpu_s;
  std::vector<int64_t> gpu_peak;
  /// Per local worker, the current round's run requests (round_result's host seconds, summed): where the
  /// round's idle time went.
  struct host_seconds {
    double load = 0, delta = 0, round = 0;
  };
  std::vector<host_seconds> round_host;
  double total_compute() const { return std::accumulate(run_compute.begin(), run_compute.end(), 0.0); }
  int64_t run_tokens(size_t worker) const { return tokens_before[worker] + worker_tokens[worker]; }
  int64_t session_tokens() const {
    return std::accumulate(worker_tokens.begin(), worker_tokens.end(), int64_t{0});
  }
  int64_t total_tokens() const {
    return session_tokens() + std::accumulate(tokens_before.begin(), tokens_before.end(), int64_t{0});
  }
  clock::time_point t_round_start;
  // diloco.adaptive_steps: the inner steps of the current round (0 before the first), and this node's
  // measured seconds per inner step (0 before the first round's).
  int64_t round_steps = 0;
  double step_seconds = 0;
  bool ended = false;  // the "end" event is written
  // All-reduces running in the background and their averages not yet applied (the policies' bookkeeping).
  inflight_reduces reduces;
  double round_stall_s = 0;   // seconds the workers of the current round waited for a late average
  bool eval_running = false;  // [eval] async: an evaluation is in flight, of round eval_round
  uint64_t eval_round = 0;
  std::function<void()> after_eval;  // a stop waiting for that evaluation's record before the process ends
  at::Tensor final_theta;  // the last round's theta, evaluated once its checkpoint is saved (final_eval)
  // Checkpoints on disk: the newest written ("" before any), the consecutive failed writes and the last
  // failure's reason. A failed latest write means the run's current state is not on disk.
  std::string newest_on_disk;
  std::string newest_path;  // the file of newest_on_disk that this run wrote ("" when it resumed from it)
  int64_t failed_writes = 0;
  std::string write_error;
  uint64_t boundary_saved = 0;  // the last round whose boundary snapshot the round tail saved
  bool has_residuals = false;  // sparse, or dense error feedback: snapshots hold the communicator's residuals
  // Snapshots waiting for their residuals, and what waits for them to reach the checkpointer (a flush must
  // not overtake a save).
  int64_t residual_waits = 0;
  std::vector<std::function<void()>> after_residuals;
  std::ofstream trace;
  std::string trace_path;  // loss_trace.tsv, named when a write to it fails
  caf::timespan round_timeout, request_timeout;
};

// ---- the state machine (actors/coordinator.cpp) ----------------------------------------------------------
bool set_phase(self_ptr self, phase to);
void fail(self_ptr self, const caf::error& e);
/// The run's state is not on disk (checkpoint writes failed): ends with exit code 3 and says so.
void fail_unsaved(self_ptr self, const std::string& what);
void notify_main(self_ptr self, int code);
void begin_round(self_ptr self);
void after_round(self_ptr self, at::Tensor theta);
void eval_then_continue(self_ptr self, at::Tensor theta);
bool has_code(const caf::error& e, errc code);

// ---- progress and metrics (progress.cpp) -----------------------------------------------------------------
void gauge(self_ptr self, const char* name, double v, const std::string& worker = "");
void record(self_ptr self, const runtime::json_line& line);
void record_start(self_ptr self);
/// A "round" line: theta_global's CRC-32C after the round, the same on every node of a cluster (eager: this
/// node's mean of its replicas, until the final mean).
void record_round(self_ptr self, const at::Tensor& theta);
/// theta's CRC-32C, as the "round" and "version" records carry it.
uint32_t theta_crc(const at::Tensor& theta);
double since_start(const coordinator_state& s);
std::string format_duration(double s);
void on_report(self_ptr self, const runtime::step_report& r);
void account_round(self_ptr self);
void on_eval(self_ptr self, uint64_t round, uint64_t version, int64_t step, double loss);
/// Writes out_dir/result.json (whole or not at all); the problem when it cannot ("": written).
std::string write_result(const coordinator_state& s, double wall);

// ---- snapshots, saves and stops (snapshots.cpp) ----------------------------------------------------------
/// delayed, eager: the average a snapshot holds as pending (its own round's), caught when the snapshot is
/// asked for, since the next outer step may apply and forget it before the snapshot is saved. Null under the
/// other policies, or when that average is not known.
struct caught_average;
using pending_catch = std::shared_ptr<caught_average>;
/// sent (not with lend or a target): called once the workers' requests are out, before the outer
/// optimizer's. Each worker answers before the next round's run, and nothing the start of a round sends
/// changes the outer optimizer's state, so the snapshot is of now even when training goes on at once (and the
/// round's theta is answered before the outer state is copied).
void take_snapshot(self_ptr self, bool boundary, std::function<void(train_snapshot, pending_catch)> then,
                   int64_t target = -1, bool lend = false, std::function<void()> sent = {});
/// Hands a snapshot to the checkpointer once it holds its residuals and its pending average; then() after
/// the write (or a tolerated failed write).
void save(self_ptr self, train_snapshot snap, pending_catch pending, std::function<void()> then);
void flush_then(self_ptr self, std::function<void()> then);
/// Cluster members: a copy of the state at this round boundary (outer state, replica 0, the policy's part
/// and, once it is there, the pending average) goes to the cluster link (publish) for joiners; then() once
/// the workers' requests for the copies are out (take_snapshot's sent). Without a link that serves_state,
/// at once.
void publish_boundary(self_ptr self, std::function<void()> then);
void stop_now(self_ptr self, bool boundary);
/// The all-reduce `label` failed with `e`: a stop, a lost peer's grace period, or a failed run.
void allreduce_failed(self_ptr self, ring_label label, caf::error e, bool waited = false);

// ---- resume (resume.cpp) ---------------------------------------------------------------------------------
void install_resume(self_ptr self);

// ---- requests to the workers -----------------------------------------------------------------------------

/// Calls request(i) for every worker i (a request to it); calls done with the replies in rank order once all
/// arrived. The first error fails the run.
template <class T, class Request>
void gather_each(self_ptr self, std::function<void(std::vector<T>)> done, Request request,
                 size_t first = SIZE_MAX) {
  const auto n = std::min(first, self->state.workers.size());  // first: the first workers only
  auto results = std::make_shared<std::vector<T>>(n);
  auto left = std::make_shared<size_t>(n);
  auto failed = std::make_shared<bool>(false);
  for (size_t i = 0; i < n; ++i) {
    request(i).then(
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

/// Sends the same message to every worker (gather_each).
template <class T, class... Ts>
void gather(self_ptr self, caf::timespan timeout, std::function<void(std::vector<T>)> done, Ts... msg) {
  gather_each<T>(self, std::move(done),
                 [=](size_t i) { return self->request(self->state.workers[i], timeout, msg...); });
}

}  // namespace longwave::actors::coordinator_parts
