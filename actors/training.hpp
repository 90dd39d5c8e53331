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
  /// Cluster node not in the file ([cluster] open): its ring endpoint and workers (--endpoint, --workers).
  std::string endpoint;
  int64_t workers = 1;
  /// Cluster nodes: resume from the newest valid checkpoint whose completed round is at most this (the round
  /// the coordinator agreed on); unset: the newest valid checkpoint.
  std::optional<uint64_t> max_resume_round;
  /// Tests only: spawns the communicator instead of the real one (e.g. one that answers (reduce, round,
  /// parts) with hand-set averages). Empty: the real communicator.
  std::function<runtime::communicator_actor(caf::actor_system&)> communicator_override;
};

/// What a node that joins a running cluster starts from: the members' state (fetched), or its own newest
/// checkpoint when that is at the cluster's round (fetched empty).
struct joined_state {
  std::optional<runtime::train_snapshot> fetched;
  uint64_t round = 0;  ///< the completed round of that state
};

/// What a cluster may ask of a node's training (cluster_role::tick), from the main thread.
struct node_controls {
  std::function<void()> leave;  ///< stop at the next round boundary (this node leaves the cluster)
  /// A cluster stop or a pin (the members hold while a joiner fetches): hold at the boundary after the
  /// current round until stop_after, hold_until or release; returns that round (nullopt: training did not
  /// answer). Idempotent.
  std::function<std::optional<uint64_t>()> hold;
  std::function<void(uint64_t round)> stop_after;  ///< a cluster stop: stop at the boundary after `round`
  std::function<void(uint64_t round)> hold_until;  ///< a pin: hold at the boundary after `round` instead
  std::function<void()> release;                   ///< a pin is over: go on from the boundary
};

/// This process as one node of a cluster: its place in the ring (from the coordinator's welcome).
struct cluster_role {
  int rank = 0;
  std::vector<std::string> endpoints;    ///< ring endpoint of every rank
  std::vector<std::string> names;        ///< node name of every rank
  std::vector<std::string> public_keys;  ///< CURVE: every rank's public key (empty without CURVE)
  /// CURVE: the node keys this node's ring and state sockets admit, as the coordinator lists them (it grows
  /// with each welcome and membership); ring.curve holds it too. nullptr without CURVE.
  std::shared_ptr<comm::key_ring> admitted;
  uint64_t epoch = 1;           ///< the membership epoch the ring starts in
  int64_t rank_offset = 0;      ///< global rank of this node's first worker
  int64_t cluster_workers = 0;  ///< workers of the whole cluster
  int64_t data_partitions = 0;  ///< parts of the training data, one per global rank (0: cluster_workers)
  comm::ring_options ring;      ///< the ring's settings; the NCCL backend takes its dtype and timeouts
  comm::reduce_key committed;   ///< the last all-reduce the starting state includes (a joiner's)
  /// Joining a running cluster: called once the data are loaded, before any actor starts, with the run's
  /// snapshot shape and the round of this node's own newest checkpoint (0: none). Fetches the state, waits
  /// to be admitted, and fills in rank, endpoints, names, epoch, committed and observe_round. Throws
  /// lw_error when the node is turned away or the state cannot be had.
  std::function<joined_state(const runtime::snapshot_shape&, uint64_t own_round)> join;
  /// A joiner's first round: its workers train no steps and it adds weight 0 to the round's all-reduces
  /// (the members do not wait for it), then it trains from the next round on. 0: none.
  uint64_t observe_round = 0;
  /// Set by join: how the state was had.
  std::optional<recovery_info> recovery;
  /// Members: gets a copy of the state at each round boundary (replica 0 only; pending average included), as
  /// a checkpoint, to serve to joiners. Called on the training coordinator's thread: must not block.
  std::function<void(runtime::checkpoint)> publish;
  /// Members: theta_global's CRC-32C after each round (the coordinator compares them across nodes). Called on
  /// the training coordinator's thread: must not block.
  std::function<void(uint64_t round, uint32_t theta_crc)> round_committed;
  /// Called from the main thread about every 100 ms with the node's collective (heartbeats with its
  /// completed round, the coordinator's verdicts and membership changes), a sink for metrics.jsonl lines and
  /// what the cluster may ask of this node's training.
  std::function<void(comm::collective&, const std::function<void(std::string)>& record,
                     const node_controls& controls)>
      tick;
};

/// Exit codes: 0 done, 1 runtime failure, 2 bad config or input (comm.backend = "nccl" where this binary or
/// machine cannot run it included), 130 stopped by a signal. With a role, the communicator averages across
/// the cluster with comm.backend.
int run_training(const config::train_config& cfg, const run_options& opts,
                 const cluster_role* role = nullptr);

/// Completed rounds of the newest valid checkpoint of this config's run (0: none). Corrupt files are skipped.
uint64_t latest_checkpoint_round(const config::train_config& cfg);

/// The rounds of the valid checkpoints in cfg's checkpoint directory up to `newest` (its newest valid one),
/// oldest first: each file is read and checked, a corrupt one left out with a warning.
std::vector<uint64_t> checkpoint_rounds(const config::train_config& cfg, uint64_t newest);

/// The sparse codec's settings of a config's [comm] section (used when comm.dtype = "sparse").
comm::sparse_options sparse_options_from(const config::train_config& cfg);

/// The reduction settings of a config's [comm] section (comm/reduction.hpp), but for shared_chunk, which
/// depends on the backend.
comm::reduction_options reduction_options_from(const config::train_config& cfg);

/// The ring settings of a config's [comm] section (cluster id from the cluster file).
comm::ring_options ring_options_from(const config::train_config& cfg, uint64_t cluster_id);

/// The bundled default corpus: $LONGWAVE_CORPUS, else ${XDG_CACHE_HOME:-~/.cache}/longwave/kjv.txt
/// (written by scripts/setup).
std::string default_corpus_path();

/// `longwave eval CHECKPOINT`: validation loss and perplexity of theta_global in a checkpoint file (or the
/// newest valid one in a directory). Returns the exit code.
int run_eval(const std::string& checkpoint_path, int64_t batches);

}  // namespace longwave::actors
