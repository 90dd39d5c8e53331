// The metric catalogue (see dashboards/README.md, which a unit test keeps identical to this table).
#include "runtime/metrics/metric_catalogue.hpp"

#ifndef LW_VERSION
#define LW_VERSION "0.0.0"
#endif
#ifndef LW_GIT_HASH
#define LW_GIT_HASH "unknown"
#endif
#ifndef LW_TORCH_VERSION
#define LW_TORCH_VERSION "unknown"
#endif

namespace longwave::runtime {

namespace {
using t = metric_type;
using r = metric_role;
}  // namespace

const std::vector<metric_def>& metric_catalogue() {
  static const std::vector<metric_def> defs = {
      {"longwave_build_info", t::gauge, "version, git_hash, torch_version", r::both,
       "Always 1; the labels name the Longwave version, git commit and LibTorch version"},
      // Per worker.
      {"longwave_worker_train_loss", t::gauge, "worker", r::node,
       "Training loss of the worker's last inner step"},
      {"longwave_worker_tokens_per_second", t::gauge, "worker", r::node,
       "Worker training tokens per wall second since the run (re)started"},
      {"longwave_worker_tokens_total", t::counter, "worker", r::node,
       "Training tokens processed by the worker"},
      {"longwave_worker_inner_steps_total", t::counter, "worker", r::node, "Inner steps done by the worker"},
      {"longwave_worker_inner_step_seconds", t::histogram, "worker", r::node,
       "Compute time of one inner step (forward, backward, AdamW update)"},
      {"longwave_worker_compute_utilization_ratio", t::gauge, "worker", r::node,
       "Inner compute seconds / wall seconds over the last outer round"},
      {"longwave_worker_compute_utilization_run_ratio", t::gauge, "worker", r::node,
       "Inner compute seconds / wall seconds since the run (re)started"},
      {"longwave_worker_idle_seconds_total", t::counter, "worker", r::node,
       "Worker wall time not spent in inner compute (waiting for other workers, the all-reduce, evaluation)"},
      {"longwave_worker_stall_seconds_total", t::counter, "worker", r::node,
       "Time the worker waited on a communicator result later than needed (overlap policies; 0 in sync)"},
      {"longwave_worker_staleness_rounds", t::gauge, "worker", r::node,
       "Outer rounds between the parameters the worker computes on and the newest theta_global (0 in sync)"},
      // Per worker on a GPU (train.device); absent for workers on the CPU.
      {"longwave_worker_gpu_busy_seconds_total", t::counter, "worker", r::node,
       "Device time of the worker's inner steps on its GPU, from CUDA events"},
      {"longwave_worker_gpu_memory_allocated_bytes", t::gauge, "worker", r::node,
       "Bytes the caching allocator has handed out on the worker's GPU (after its last step)"},
      {"longwave_worker_gpu_memory_reserved_bytes", t::gauge, "worker", r::node,
       "Bytes the caching allocator holds from the driver on the worker's GPU"},
      {"longwave_worker_gpu_memory_peak_bytes", t::gauge, "worker", r::node,
       "Peak allocated bytes on the worker's GPU since the process started"},
      {"longwave_worker_model_flops_utilization_ratio", t::gauge, "worker", r::node,
       "6 x parameters x worker tokens/s / the GPU's dense bf16 peak (6N leaves attention out; known GPUs "
       "only)"},
      // Per node.
      {"longwave_train_loss", t::gauge, "", r::node,
       "Mean training loss of the last inner step over local workers"},
      {"longwave_train_tokens_per_second", t::gauge, "", r::node,
       "Training tokens per second of all local workers since the run (re)started"},
      {"longwave_compute_utilization_ratio", t::gauge, "", r::node,
       "Inner compute seconds / (wall seconds x local workers) since the run (re)started"},
      {"longwave_inner_learning_rate", t::gauge, "", r::node, "Current inner AdamW learning rate"},
      {"longwave_outer_round", t::gauge, "", r::node, "Completed outer rounds"},
      {"longwave_outer_learning_rate", t::gauge, "", r::node, "Outer SGD learning rate"},
      {"longwave_outer_version", t::gauge, "", r::node,
       "diloco.outer = \"async\": the version of theta_global (merges applied)"},
      {"longwave_outer_merge_staleness", t::histogram, "", r::node,
       "diloco.outer = \"async\": versions between a merged contribution's start and the merge"},
      {"longwave_outer_contributions_total", t::counter, "", r::node,
       "diloco.outer = \"async\": pseudo-gradients this node reported to the master"},
      {"longwave_outer_rebases_total", t::counter, "", r::node,
       "diloco.outer = \"async\": versions taken in by this node's workers in the middle of a phase"},
      {"longwave_outer_dropped_contributions_total", t::counter, "", r::node,
       "diloco.outer = \"async\": this node's contributions the master dropped (too stale)"},
      {"longwave_outer_pseudo_gradient_norm", t::gauge, "", r::node,
       "L2 norm of the averaged pseudo-gradient of the last round"},
      {"longwave_outer_update_norm", t::gauge, "", r::node,
       "L2 norm of the last outer step's change of theta_global"},
      {"longwave_val_loss", t::gauge, "", r::node, "Validation loss of theta_global at the last evaluation"},
      {"longwave_val_perplexity", t::gauge, "", r::node, "exp(validation loss) at the last evaluation"},
      // All-reduce and wire.
      {"longwave_allreduce_seconds", t::histogram, "", r::node,
       "Wall time of one pseudo-gradient average (local mean, and the ring in a cluster)"},
      {"longwave_allreduce_wire_bytes", t::gauge, "", r::node, "Bytes this node sent in the last all-reduce"},
      {"longwave_comm_compression_ratio", t::gauge, "", r::node,
       "fp32 bytes / wire bytes of the last all-reduce payload (1 for fp32, about 4 for int8)"},
      {"longwave_comm_residual_norm", t::gauge, "", r::node,
       "L2 norm of this node's error-feedback residual after the last all-reduce"},
      {"longwave_comm_density", t::gauge, "", r::node,
       "Fraction of the pseudo-gradient's values the last all-reduce sent (1 dense, comm.density sparse)"},
      {"longwave_comm_clipped_total", t::counter, "", r::node,
       "Sparse contributions scaled down to the round's median norm (comm.robust_clip)"},
      {"longwave_comm_bytes_sent_total", t::counter, "peer", r::node,
       "Bytes of ring frames handed to ZeroMQ for the next node"},
      {"longwave_comm_bytes_received_total", t::counter, "peer", r::node,
       "Bytes of ring frames read from the previous node, rejected ones included"},
      {"longwave_comm_send_wait_seconds_total", t::counter, "peer", r::node,
       "Time the all-reduce held a ready chunk that the next node's queue would not take"},
      {"longwave_comm_receive_wait_seconds_total", t::counter, "peer", r::node,
       "Time the all-reduce had nothing to send and waited for the previous node's next chunk"},
      {"longwave_codec_encode_seconds_total", t::counter, "", r::node,
       "Time spent encoding chunks for the wire"},
      {"longwave_codec_decode_seconds_total", t::counter, "", r::node,
       "Time spent decoding (and accumulating) received chunks"},
      {"longwave_comm_rejected_frames_total", t::counter, "reason", r::both,
       "Received frames dropped by validation, by reason"},
      {"longwave_cluster_refused_handshakes_total", t::counter, "reason", r::coordinator,
       "CURVE handshakes refused, by reason (unknown_key, revoked, handshake)"},
      // Membership.
      {"longwave_cluster_peers_alive", t::gauge, "", r::both,
       "Nodes alive as this process sees them (node: the ring's size; coordinator: nodes heard from within "
       "heartbeat_timeout_s)"},
      {"longwave_cluster_heartbeat_age_seconds", t::gauge, "peer", r::coordinator,
       "Seconds since the coordinator last heard from each node"},
      {"longwave_cluster_epoch", t::gauge, "", r::coordinator,
       "The membership epoch: it changes with every node that is lost, fails or leaves"},
      {"longwave_cluster_members", t::gauge, "", r::coordinator, "Nodes in the current epoch's membership"},
      {"longwave_cluster_membership_changes_total", t::counter, "reason", r::coordinator,
       "New epochs, by reason (lost, failed, left, ring_reset, takeover, join; several at once joined by "
       "commas)"},
      {"longwave_cluster_joins_total", t::counter, "", r::coordinator,
       "Nodes admitted into the running cluster (late, restarted or returning)"},
      {"longwave_cluster_quorum_wait_seconds", t::gauge, "", r::coordinator,
       "Seconds the members have waited below [cluster] min_nodes (0: quorum)"},
      {"longwave_cluster_recovery_bytes", t::gauge, "", r::node,
       "State this node fetched from the members when it joined the running cluster (0: its own checkpoint)"},
      {"longwave_cluster_recovery_seconds", t::gauge, "", r::node, "Time it took to fetch that state"},
      // Checkpoints.
      {"longwave_checkpoints_total", t::counter, "", r::node, "Checkpoints written"},
      {"longwave_checkpoint_write_seconds", t::gauge, "", r::node,
       "Time to write the last checkpoint (serialize, fsync, rename)"},
      {"longwave_checkpoint_bytes", t::gauge, "", r::node, "Size of the last checkpoint file"},
      {"longwave_checkpoint_last_success_timestamp_seconds", t::gauge, "", r::node,
       "Unix time of the last successful checkpoint write"},
      // Errors.
      {"longwave_errors_total", t::counter, "reason", r::both, "Errors, by reason"},
  };
  return defs;
}

const metric_def* find_metric(std::string_view name) {
  for (const auto& d : metric_catalogue())
    if (name == d.name) return &d;
  return nullptr;
}

bool registered_by(const metric_def& m, metric_role role) {
  return m.role == metric_role::both || m.role == role;
}

const char* to_string(metric_type type) {
  switch (type) {
    case metric_type::counter: return "counter";
    case metric_type::gauge: return "gauge";
    case metric_type::histogram: return "histogram";
  }
  return "?";
}

const char* to_string(metric_role role) {
  switch (role) {
    case metric_role::node: return "node";
    case metric_role::coordinator: return "coordinator";
    case metric_role::both: return "both";
  }
  return "?";
}

const std::vector<std::string>& error_reasons() {
  static const std::vector<std::string> reasons = {
      "checkpoint_write", "checkpoint_corrupt", "allreduce", "node_lost", "rejected_join", "theta_mismatch"};
  return reasons;
}

const std::vector<std::string>& rejection_reasons() {
  // comm::to_string(reject_reason); runtime does not depend on comm, so the names are listed here and a
  // unit test compares the two lists.
  static const std::vector<std::string> reasons = {
      "truncated",   "bad_size",   "malformed",    "bad_version",  "bad_dtype",   "wrong_cluster",
      "wrong_round", "wrong_step", "wrong_sender", "bad_checksum", "bad_payload", "wrong_epoch"};
  return reasons;
}

const std::vector<std::string>& handshake_refusal_reasons() {
  static const std::vector<std::string> reasons = {"unknown_key", "revoked", "handshake"};
  return reasons;
}

std::string build_version() {
  return LW_VERSION;
}
std::string build_git_hash() {
  return LW_GIT_HASH;
}
std::string build_torch_version() {
  return LW_TORCH_VERSION;
}

}  // namespace longwave::runtime
