#pragma once
// One training run in this process: prepare data, resume or start, spawn the actor graph, wait for it,
// handle Ctrl-C. The CLI's `run` and the integration tests call this.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/cluster_link.hpp"
#include "actors/run_context.hpp"
#include "comm/collective.hpp"
#include "comm/reduction.hpp"
#include "comm/ring_allreduce.hpp"
#include "comm/sparse_codec.hpp"
#include "config/train_config.hpp"
#include "runtime/checkpoint/snapshot_codec.hpp"
#include "runtime/messages/interfaces.hpp"

namespace longwave::actors {

/// Options of one invocation that are not part of the config.
struct run_options {
  bool fresh = false;          ///< ignore (and remove) earlier checkpoints of this out_dir
  bool dry_run = false;        ///< validate, print the resolved config and the model size, do not train
  bool handle_signals = true;  ///< SIGINT/SIGTERM stop cleanly (exit code 130)
  bool leave = false;          ///< cluster node: ask the coordinator to make the running node leave
  std::string config_file;     ///< the config (or cluster) file read: the resolved copy never replaces it
  /// A cluster node: its hello announced its newest checkpoint, so a newest one that does not load stops it
  /// rather than falling back to an older one.
  bool cluster_node = false;
  /// Cluster node not in the file ([cluster] open): its ring endpoint and workers (--endpoint, --workers;
  /// -1: not given, 1 for such a node).
  std::string endpoint;
  int64_t workers = -1;
  /// Cluster nodes: resume from the newest valid checkpoint whose completed round is at most this (the round
  /// the coordinator agreed on); unset: the newest valid checkpoint.
  std::optional<uint64_t> max_resume_round;
  /// Tests only: spawns the communicator instead of the real one (e.g. one that answers (reduce, round,
  /// parts) with hand-set averages). Empty: the real communicator.
  std::function<runtime::communicator_actor(caf::actor_system&)> communicator_override;
  /// Tests only: CPU workers copy their state and pseudo-gradient through a GPU's stage (a side stream,
  /// reused host buffers; models::inner_options::stage_delta), so a GPU's deferred answers run here.
  bool stage_on_cpu = false;
};

/// Exit codes: 0 done, 1 runtime failure, 2 bad config or input (comm.backend = "nccl" where this binary or
/// machine cannot run it included), 130 stopped by a signal. A cluster node trains through its link (its
/// communicator averages across the cluster with comm.backend); alone, through no_cluster().
int run_training(const config::train_config& cfg, const run_options& opts, cluster_link& cluster);
inline int run_training(const config::train_config& cfg, const run_options& opts) {
  return run_training(cfg, opts, no_cluster());
}

/// diloco.outer = "async": theta's version in the newest valid checkpoint (0: none).
uint64_t latest_checkpoint_version(const config::train_config& cfg);

/// The valid checkpoints in cfg's checkpoint directory, one per round with its theta's CRC, oldest first (the
/// last is the newest a resume would take): each file is read and checked, a corrupt one left out with a
/// warning.
std::vector<runtime::held_round> held_checkpoints(const config::train_config& cfg);
/// The newest valid checkpoint in cfg's checkpoint directory and its theta's CRC (round 0: none). Called
/// under the run's lock: the corrupt files it passes are moved to corrupt/.
own_checkpoint newest_checkpoint(const config::train_config& cfg);

/// The sparse codec's settings of a config's [comm] section (used when comm.dtype = "sparse").
comm::sparse_options sparse_options_from(const config::train_config& cfg);

/// The reduction settings of a config's [comm] section (comm/reduction.hpp), but for shared_chunk, which
/// depends on the backend.
comm::reduction_options reduction_options_from(const config::train_config& cfg);

/// The ring settings of a config's [comm] section (cluster id from the cluster file).
comm::ring_options ring_options_from(const config::train_config& cfg, uint64_t cluster_id);

/// `longwave eval CHECKPOINT`: validation loss and perplexity of theta_global in a checkpoint file (or the
/// newest valid one in a directory), on the validation set of its run's data, or of `data` (--data: the
/// corpus where it is now; a fingerprint unlike the run's is warned about). Returns the exit code.
int run_eval(const std::string& checkpoint_path, int64_t batches, const std::string& data = "");

}  // namespace longwave::actors
