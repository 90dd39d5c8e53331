#pragma once
// Message payloads exchanged by Longwave's actors inside one process. Tensors travel by handle: the sender
// never touches the storage again (or clones first).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/messages/merge_order.hpp"

namespace longwave::runtime {

/// The ring label of one all-reduce, (round, part), the same name from the policy to the wire: part 0 is a
/// round's average, j = 1..P streaming's j-th sync of the round, higher parts the reduces that finish a run.
/// Labels increase from call to call.
using ring_label = std::pair<uint64_t, uint32_t>;

/// What the communicator averages: this node's workers' tensors (rank order) under one ring label. exact:
/// fp32 on the wire and no error feedback, whatever comm.dtype says (parameters, not pseudo-gradients).
struct reduce_request {
  ring_label label;
  std::vector<at::Tensor> parts;
  bool exact = false;
  /// The node's weight in a cluster's average: the workers whose pseudo-gradients parts are (adaptive steps:
  /// times their share of the round's steps). -1: parts.size(); 0: parts is one zero tensor (no worker of
  /// this node was drawn this round); comm::rank0_weight: the epoch's rank 0 alone (theta_0).
  double weight = -1;
  /// Client sampling: every node may weigh 0 (none of the round's drawn clients is on a live node); the
  /// answer is then zeros of total_weight 0, where any other reduction fails.
  bool empty_ok = false;
};

/// The communicator's answer to a reduce_request: the average, and the nodes whose contributions it holds
/// (comm::collective::last_members: the members of the epoch that computed it; empty in one process).
struct reduced {
  at::Tensor avg;
  std::vector<std::string> members;
  bool empty = false;  ///< every node weighed 0 (reduce_request::empty_ok): avg is zeros
};

/// diloco.outer = "eager": one replica's own outer parameters, momentum (undefined before its first step with
/// momentum) and last pseudo-gradient (undefined before its first round).
struct eager_outer {
  at::Tensor theta, momentum, prev_delta;
};

/// The outer optimizer's resumable state: theta_global, its momentum (undefined before the first outer step)
/// and, under eager, each local replica's own outer state (empty otherwise). diloco.outer = "async": the
/// version theta is (the merges applied), Delayed Nesterov's buffer of the period's pseudo-gradients and the
/// contributions in it.
struct outer_snapshot {
  at::Tensor theta, momentum;
  std::vector<eager_outer> replicas;
  uint64_t version = 0;
  at::Tensor dn_buffer;
  int64_t dn_arrivals = 0;  ///< async: contributions in dn_buffer since Delayed Nesterov's last fold
};

/// The answer of an eager step: theta_global (the replicas' mean) and each local replica's outer parameters.
struct eager_thetas {
  at::Tensor theta;
  std::vector<at::Tensor> replicas;
};

/// The resumable state of one worker replica, fp32 flat buffers.
struct replica_state {
  int64_t rank = 0;
  at::Tensor master, exp_avg, exp_avg_sq;
  int64_t adam_steps = 0;
  uint64_t sampler_position = 0;
  int64_t steps_in_round = 0;  ///< inner steps of the current round already done
  /// diloco.outer = "eager": this replica's own outer parameters and momentum (undefined before its first
  /// outer step with momentum) and its pseudo-gradient of the last round; undefined under other policies.
  at::Tensor outer_theta, outer_momentum, prev_delta;
};

/// What a worker returns at the end of its inner round.
struct round_result {
  int64_t rank = 0;
  uint64_t round = 0;
  at::Tensor delta;  ///< theta_global - theta_local, fp32 (ddp: the step's gradient)
  double mean_loss = 0;
  double compute_s = 0;  ///< ddp: forward + backward time
  /// An inner round's host seconds outside its steps' own: theta loaded at the start, the pseudo-gradient
  /// made at the end, and the whole round from the run request to this reply (0 for ddp's gradients).
  double load_s = 0, delta_s = 0, round_s = 0;
};

/// One inner step's report, sent by each worker to the coordinator.
struct step_report {
  int64_t rank = 0;
  int64_t step = 0;  ///< the worker's global inner step, 1-based
  double loss = 0;
  double compute_s = 0;  ///< forward + backward + update
  int64_t tokens = 0;
  /// A worker on a GPU: the step's device time (CUDA events) and its GPU's caching-allocator bytes; -1 and
  /// zeros on the CPU.
  double gpu_s = -1;
  int64_t gpu_allocated = 0, gpu_reserved = 0, gpu_peak = 0;
};

/// A node's error-feedback residuals (comm.error_feedback), one per ring label's fragment part (0 for a
/// round's average, j for streaming's j-th sync), fp32.
using residual_map = std::map<uint32_t, at::Tensor>;

/// Everything needed to resume a run exactly.
struct train_snapshot {
  uint64_t round = 0;          ///< completed outer rounds
  uint64_t step = 0;           ///< inner steps per worker so far
  at::Tensor theta, momentum;  ///< momentum undefined before the first outer step
  /// diloco.outer = "delayed": the averaged pseudo-gradient of round pending_round, not yet applied (the next
  /// outer step applies it); undefined otherwise.
  at::Tensor pending;
  uint64_t pending_round = 0;
  std::vector<replica_state> replicas;
  /// The communicator's error-feedback residuals after the last all-reduce this snapshot includes; empty
  /// without error feedback.
  residual_map residuals;
  /// diloco.outer = "async": theta's version (merges applied) and Delayed Nesterov's period buffer
  /// (undefined while empty). version is 0 under the other policies.
  uint64_t version = 0;
  at::Tensor dn_buffer;
  uint64_t merged_tokens = 0;  ///< async: the tokens merged into theta up to `version`
  int64_t dn_arrivals = 0;     ///< async: contributions in dn_buffer since Delayed Nesterov's last fold
  std::string meta;
};

}  // namespace longwave::runtime
