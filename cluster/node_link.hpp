#pragma once
// A training node's link to its cluster (actors::cluster_link): its place in the ring, the join of a running
// cluster, the states it serves, its elastic ring, and the control plane ticked from the training's main
// loop.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "actors/cluster_link.hpp"
#include "cluster/control_client.hpp"
#include "cluster/joiner.hpp"
#include "cluster/node_merges.hpp"
#include "cluster/node_watch.hpp"
#include "cluster/state_publisher.hpp"
#include "comm/deferred_collective.hpp"
#include "comm/elastic_ring.hpp"

namespace longwave::cluster {

class node_link final : public actors::cluster_link {
 public:
  /// name: this node's. place: its place in the ring (the joiner completes a joiner's), which outlives the
  /// link. hello: what it said to the master, re-sent to one that comes back. publisher: where it serves
  /// its states to joiners (nullptr: it serves none, as with NCCL). check_theta: report theta's CRC each
  /// round (every policy but eager keeps one theta_global on every node; async reports it per version).
  /// heartbeat_timeout: the cluster's heartbeat_timeout_s (master_watch).
  node_link(std::string name, actors::ring_place& place, control_client& control, hello_msg hello,
            state_publisher* publisher, bool check_theta, std::chrono::milliseconds heartbeat_timeout);
  ~node_link() override;
  node_link(const node_link&) = delete;
  node_link& operator=(const node_link&) = delete;

  /// From here until the first tick (or end_start_up), a thread tells the master at once and then every 2 s
  /// that this node is still starting (building its model, loading its checkpoint): a member silent for
  /// heartbeat_timeout_s is taken as lost. The main thread's start-up calls on the control connection (a
  /// join, the first NCCL id) take turns with it.
  void begin_start_up();
  /// Ends the start-up beats (the main loop's first tick does). Idempotent.
  void end_start_up();

  /// The cluster is already training: this node joins it through `j` (join()).
  void join_with(joiner j) { joiner_.emplace(std::move(j)); }
  /// Turned away while joining because the cluster stops.
  bool cluster_stopped() const { return cluster_stopped_; }
  /// The round after which this node stops with the cluster (nullopt: it is not stopping).
  std::optional<uint64_t> stopped_after() const { return stop_.round(); }
  /// The last round this node completed (0: none in this process).
  uint64_t last_round() const { return last_round_.load(); }
  /// The master asked this node to leave (longwave node --leave).
  bool leaving() const { return leaving_; }
  /// diloco.outer = "async": a master unreachable for `orphaned` ends training (node_controls::end), as an
  /// eviction or a call-off does under every policy: no merge comes without one, and the node would train
  /// on, unmerged, past the run's end.
  void end_when_orphaned(std::chrono::milliseconds orphaned) { orphaned_after_ = orphaned; }

  const actors::ring_place* place() const override { return &place_; }
  bool joining() const override { return joiner_.has_value(); }
  actors::joined_state join(const runtime::snapshot_shape& shape, actors::own_checkpoint own) override;
  std::shared_ptr<comm::collective> collective(const config::train_config& cfg,
                                               comm::ring_allreduce::reject_callback on_reject) override;
  bool serves_state() const override { return publisher_ != nullptr; }
  void publish(runtime::checkpoint state, std::optional<uint64_t> version) override;
  void round_committed(uint64_t round, uint32_t theta_crc) override;
  void version_committed(uint64_t version, uint32_t theta_crc) override {
    version_.store(version);  // the training coordinator's thread; tick reads it on the main loop
    committed_.push(version, theta_crc);
  }
  void contribute(uint64_t v_start, uint64_t tokens) override { merges_.push(v_start, tokens); }
  void tick(const std::function<void(std::string)>& record, const actors::node_controls& controls) override;

 private:
  static constexpr auto beat_every = std::chrono::seconds(2);
  /// comm.backend = "nccl": the unique id of this epoch's communicator, made here at rank 0 and handed to the
  /// master for the others, else the one the master hands on from rank 0.
  std::string nccl_id(const config::train_config& cfg);
  static std::chrono::milliseconds nccl_id_timeout(const config::train_config& cfg);
  /// comm.backend = "nccl": each epoch's communicator, for the elastic collective.
  comm::elastic_ring::epoch_factory nccl_epochs(const config::train_config& cfg);
  std::string name_;
  actors::ring_place& place_;
  control_client& control_;
  state_publisher* publisher_;
  bool check_theta_;
  std::optional<joiner> joiner_;
  std::shared_ptr<comm::collective> ring_;
  std::shared_ptr<comm::elastic_ring> elastic_;  // ring_, through its epochs
  std::shared_ptr<comm::epoch_keys> nccl_ids_;   // comm.backend = "nccl": each epoch's id, as it comes
  master_watch watch_;
  stop_follower stop_;
  pin_follower pin_;
  committed_rounds committed_;
  std::atomic<uint64_t> version_{0};  // async: the last version applied
  std::atomic<uint64_t> last_round_{0};
  merge_follower merges_;
  bool leaving_ = false;
  std::optional<std::chrono::milliseconds> orphaned_after_;  // set: async (end_when_orphaned)
  bool ended_ = false;
  bool cluster_stopped_ = false;
  // The start-up beats (begin_start_up): their thread, its stop, and the turns on control_.
  std::thread start_up_beats_;
  std::mutex start_up_mu_, control_mu_;
  std::condition_variable started_;
  bool start_up_over_ = false;
  // The first tick heartbeats at once: the master allows a member join_timeout_s of silence only until its
  // first heartbeat (while it loads its data and model).
  steady::time_point last_beat_{};
};

}  // namespace longwave::cluster
