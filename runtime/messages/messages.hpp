#pragma once
// Message payloads exchanged by Longwave's actors inside one process. Tensors travel by handle: the sender
// never touches the storage again (or clones first).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace longwave::runtime {

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
};

/// One inner step's report, sent by each worker to the coordinator.
struct step_report {
  int64_t rank = 0;
  int64_t step = 0;  ///< the worker's global inner step, 1-based
  double loss = 0;
  double compute_s = 0;  ///< forward + backward + update
  int64_t tokens = 0;
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
  std::string meta;
};

}  // namespace longwave::runtime
