#pragma once
// What a node's training sees of its cluster: its place in the ring and the control plane's hooks. actors/
// declares the interface and cluster/ implements it (cluster/node_link.hpp), so actors/ never includes
// cluster/. One process alone trains with the null link (no_cluster()).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/run_context.hpp"
#include "comm/collective.hpp"
#include "comm/reduce_key.hpp"
#include "comm/ring_allreduce.hpp"
#include "config/train_config.hpp"
#include "runtime/checkpoint/snapshot_codec.hpp"

namespace longwave::actors {

/// What a node that joins a running cluster starts from: the members' state (fetched), or its own newest
/// checkpoint when that is at the cluster's round (fetched empty).
/// A node's own newest valid checkpoint: its round (0: none) and its theta's CRC-32C, which a joiner compares
/// with the members' before it starts from it instead of fetching their state.
struct own_checkpoint {
  uint64_t round = 0;
  uint32_t theta_crc = 0;
  uint64_t step = 0;  ///< this node's own inner steps there
  /// Each local worker's data position there (async: a rejoining node's workers go on from their own).
  std::vector<uint64_t> sampler_positions;
};

struct joined_state {
  std::optional<runtime::train_snapshot> fetched;
  uint64_t round = 0;  ///< the completed round of that state
};

/// What a cluster may ask of a node's training (cluster_link::tick), from the main thread.
struct node_controls {
  std::function<void()> leave;  ///< stop at the next round boundary (this node leaves the cluster)
  /// A cluster stop or a pin (the members hold while a joiner fetches): hold at the boundary after the
  /// current round until stop_after, hold_until or release; returns that round (nullopt: training did not
  /// answer). Idempotent.
  std::function<std::optional<uint64_t>()> hold;
  std::function<void(uint64_t round)> stop_after;  ///< a cluster stop: stop at the boundary after `round`
  std::function<void(uint64_t round)> hold_until;  ///< a pin: hold at the boundary after `round` instead
  std::function<void()> release;                   ///< a pin is over: go on from the boundary
  /// diloco.outer = "async": the master announced a merge (or drops); in arrival order.
  std::function<void(runtime::merge_order)> merge;
  /// The master evicted this node or called the run off: end the run now (exit 1), not when its next
  /// all-reduce fails on it a whole inner phase later (async: none would; no merge comes).
  std::function<void(std::string why)> end;
};

/// A node's place in the ring (the master's welcome, or a joiner's admission).
struct ring_place {
  int rank = 0;
  std::vector<std::string> endpoints;    ///< ring endpoint of every rank
  std::vector<std::string> names;        ///< node name of every rank
  std::vector<std::string> public_keys;  ///< CURVE: every rank's public key (empty without CURVE)
  /// CURVE: the node keys this node's ring and state sockets admit, as the master lists them (it grows with
  /// each welcome and membership); ring.curve holds it too. nullptr without CURVE.
  std::shared_ptr<comm::key_ring> admitted;
  uint64_t epoch = 1;           ///< the membership epoch the ring starts in
  int64_t rank_offset = 0;      ///< global rank of this node's first worker
  int64_t cluster_workers = 0;  ///< workers of the whole cluster
  int64_t data_partitions = 0;  ///< parts of the training data, one per global rank (0: cluster_workers)
  comm::ring_options ring;      ///< the ring's settings; the NCCL backend takes its dtype and timeouts
  comm::reduce_key committed;   ///< the last all-reduce the starting state includes (a joiner's)
  /// A joiner's first round: its workers train no steps and it adds weight 0 to the round's all-reduces
  /// (the members do not wait for it), then it trains from the next round on. 0: none.
  uint64_t observe_round = 0;
  std::optional<recovery_info> recovery;  ///< a joiner: how the state was had
  const std::string& name() const { return names[static_cast<size_t>(rank)]; }
};

/// The cluster as a node's training uses it. The calls come from the thread the comment names.
class cluster_link {
 public:
  virtual ~cluster_link() = default;

  /// This node's place in the ring; nullptr: one process alone (its communicator is a ring of one rank). A
  /// joiner's place is complete once join() returned.
  virtual const ring_place* place() const = 0;

  /// Whether this node joins a running cluster: join() is then called once the data are loaded, before any
  /// actor starts, with the run's snapshot shape and the node's own newest checkpoint (round 0: none).
  /// It fetches the state and waits to be admitted; throws lw_error when the node is turned away or the
  /// state cannot be had.
  virtual bool joining() const = 0;
  virtual joined_state join(const runtime::snapshot_shape& shape, own_checkpoint own) = 0;

  /// The node's collective across the cluster for cfg.comm.backend (rejected frames go to on_reject);
  /// nullptr alone. Called once, from the main thread, before training starts.
  virtual std::shared_ptr<comm::collective> collective(const config::train_config& cfg,
                                                       comm::ring_allreduce::reject_callback on_reject) = 0;

  /// Whether publish() wants the round-boundary states (a member that serves joiners): false spares the copy.
  virtual bool serves_state() const = 0;
  /// A copy of the state at a round boundary (replica 0 only; pending average included), to serve to
  /// joiners: under the state's round, or (diloco.outer = "async", whose members share versions, not rounds)
  /// under `version`. Training coordinator's thread: must not block.
  virtual void publish(runtime::checkpoint state, std::optional<uint64_t> version) = 0;
  /// theta_global's CRC-32C after each round (the master compares them across nodes). Training
  /// coordinator's thread: must not block.
  virtual void round_committed(uint64_t round, uint32_t theta_crc) = 0;
  /// diloco.outer = "async": theta's CRC-32C at `version`, reported whatever check_theta says (every node
  /// applies every merge). Training coordinator's thread: must not block.
  virtual void version_committed(uint64_t version, uint32_t theta_crc) = 0;
  /// diloco.outer = "async": this node's pseudo-gradient from version v_start, `tokens` trained, is ready to
  /// merge; the master's answer comes through node_controls::merge. Training coordinator's thread: must not
  /// block.
  virtual void contribute(uint64_t v_start, uint64_t tokens) = 0;

  /// Main thread, about every 100 ms while training: heartbeats with the completed round, the master's
  /// verdicts and membership changes; `record` is a sink for metrics.jsonl lines, `controls` what the
  /// cluster may ask of this node's training.
  virtual void tick(const std::function<void(std::string)>& record, const node_controls& controls) = 0;
};

/// One process alone: no place, nothing to join, publish or tick.
class null_cluster_link final : public cluster_link {
 public:
  const ring_place* place() const override { return nullptr; }
  bool joining() const override { return false; }
  joined_state join(const runtime::snapshot_shape&, own_checkpoint) override { return {}; }
  std::shared_ptr<comm::collective> collective(const config::train_config&,
                                               comm::ring_allreduce::reject_callback) override {
    return nullptr;
  }
  bool serves_state() const override { return false; }
  void publish(runtime::checkpoint, std::optional<uint64_t>) override {}
  void round_committed(uint64_t, uint32_t) override {}
  void version_committed(uint64_t, uint32_t) override {}
  void contribute(uint64_t, uint64_t) override {}
  void tick(const std::function<void(std::string)>&, const node_controls&) override {}
};

/// The null link every run outside a cluster shares (it holds no state); declared in run_context.hpp too.
cluster_link& no_cluster();

}  // namespace longwave::actors
