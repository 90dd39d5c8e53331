#pragma once
// A training node's side of the control plane, ticked from its main loop: what the master asks of it
// (membership changes, leave, a cluster stop), what it reports (fence answers, ring failures, theta's CRC per
// round), and a master that went away and comes back (re-announcement, for a takeover).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/cluster_link.hpp"
#include "cluster/control_client.hpp"
#include "cluster/cut_off_rule.hpp"
#include "comm/deferred_collective.hpp"
#include "comm/elastic_ring.hpp"

namespace longwave::cluster {

using steady = std::chrono::steady_clock;

/// CURVE: admits exactly the node keys the master listed (a welcome's or a membership's, each the whole list)
/// on this node's state socket: a key it no longer lists (revoked) is no longer admitted.
void admit_keys(const std::shared_ptr<comm::key_ring>& ring, const std::vector<peer_entry>& keys);

/// What the master asked of a training node since the last tick.
struct master_asks {
  bool leave = false;                  ///< leave at the next round boundary (longwave node --leave)
  bool stop_query = false;             ///< the cluster stops: where can this node stop?
  std::optional<uint64_t> stop_round;  ///< the cluster stops after this round
  bool pin_query = false;              ///< a joiner's fetch was overtaken: where can this node hold?
  std::optional<uint64_t> pin_round;   ///< hold after this round while joiners fetch its state
  bool pin_release = false;            ///< the pin is over: go on
  std::vector<merge_msg> merges;       ///< diloco.outer = "async": merges and drops, in arrival order
  bool welcomed = false;               ///< a (restarted) coordinator took this running node on
  bool known_again = false;  ///< a coordinator this node re-announced itself to knows it (welcome or fence)
  std::optional<std::string> evicted;  ///< the coordinator evicted this node or called the run off: why
  std::optional<std::string> cut_off;  ///< this node takes itself to be cut off from the cluster: why
};

/// A node's view of its master while it trains: membership changes reach the ring (fence, next epoch,
/// removal), the ring's answers and failures reach the master, and a master that went away is said once,
/// then reminded of every minute.
class master_watch {
 public:
  /// hello: this node's hello, re-sent (running) to a master that comes back.
  /// admitted: CURVE's admitted node keys, which each membership extends (nullptr without CURVE).
  /// heartbeat_timeout: the cluster's heartbeat_timeout_s, within which a standby takes a dead coordinator's
  /// place (a node cuts itself off only well after that).
  master_watch(hello_msg hello, std::shared_ptr<comm::key_ring> admitted,
               std::chrono::milliseconds heartbeat_timeout)
      : hello_(std::move(hello)),
        admitted_(std::move(admitted)),
        cut_off_(std::max<std::chrono::milliseconds>(cut_off_after, 3 * heartbeat_timeout)),
        version_(hello_.committed.round) {}

  /// diloco.outer = "async": the version this node applied last. A re-announcement names it, not the ring's
  /// last label, which after a resume is the state transfer's (0, 3): a restarted master merges on from the
  /// newest version a member holds.
  void version_applied(uint64_t version) { version_ = std::max(version_, version); }
  /// async: the merges this node was told of, oldest first; a re-announcement names those not yet applied,
  /// which a master taking the cluster over announces again instead of closing others of their versions.
  void merges_told(std::vector<merge_msg> told) { told_ = std::move(told); }

  /// comm.backend = "nccl": where the epochs' communicator ids that the master hands on go.
  void take_nccl_ids(std::shared_ptr<comm::epoch_keys> keys) { nccl_ids_ = std::move(keys); }

  /// What the master asked of this node (leave, a cluster stop). elastic: the node's elastic collective
  /// (nullptr: membership changes reach no collective, as in tests of the watch alone).
  master_asks on_tick(control_client& control, comm::collective& ring, comm::elastic_ring* elastic,
                      const std::string& name, steady::time_point now,
                      const std::function<void(std::string)>& record);

  /// Since when the master has been unreachable (dropped, refused); nullopt while it is connected.
  std::optional<steady::time_point> gone_since() const { return gone_since_; }

 private:
  void on_event(const control_event& ev, comm::collective& ring, comm::elastic_ring* elastic,
                const std::string& name, steady::time_point now);
  void enter(const membership_msg& m, comm::elastic_ring* elastic, const std::string& name);
  void on_connection(const control_event& ev, const std::string& name, steady::time_point now);
  /// Until the master answers: a restarted one takes the running cluster over from these.
  void reannounce(control_client& control, const comm::elastic_ring& elastic, steady::time_point now);
  /// Fence answers and ring failures, to the master.
  void report(control_client& control, comm::elastic_ring& elastic, const std::string& name,
              steady::time_point now);

  static constexpr auto reminder_every = std::chrono::seconds(60);
  static constexpr std::chrono::milliseconds cut_off_after{30000};  // at least; cut_off_rule
  hello_msg hello_;
  std::shared_ptr<comm::key_ring> admitted_;
  cut_off_rule cut_off_;
  std::shared_ptr<comm::epoch_keys> nccl_ids_;  // comm.backend = "nccl"
  std::optional<steady::time_point> gone_since_;
  std::string refused_;   // why the master refuses this node's handshake now ("" while it does not)
  bool evicted_ = false;  // the master removed this node or called the run off: its training ends
  steady::time_point next_reminder_;
  bool reannounce_ = false;
  bool known_again_ = false;  // master_asks::known_again, for this tick
  steady::time_point next_announce_;
  uint64_t version_;  // async: the last version applied (a resumed node's hello names its checkpoint's)
  std::vector<merge_msg> told_;  // async: merges told of, oldest first (merges_told)
};

/// theta_global's CRC after each round, handed from the training coordinator's thread to the main loop,
/// which sends them to the master (it compares the members').
class committed_rounds {
 public:
  void push(uint64_t round, uint32_t crc) {
    std::lock_guard<std::mutex> lk(mu_);
    if (items_.size() < max_items) items_.emplace_back(round, crc);
  }
  std::vector<std::pair<uint64_t, uint32_t>> take() {
    std::lock_guard<std::mutex> lk(mu_);
    return std::exchange(items_, {});
  }

 private:
  static constexpr size_t max_items = 1024;  // a main loop that stalls loses later reports, not memory
  std::mutex mu_;
  std::vector<std::pair<uint64_t, uint32_t>> items_;
};

/// A pin as one node follows it: asked where it can hold, it holds at the boundary after its current round
/// and says which; told the round R after which every member holds, it trains on to R (if behind) and holds
/// there while joiners fetch R's state; released, it goes on.
class pin_follower {
 public:
  explicit pin_follower(std::string name) : name_(std::move(name)) {}
  void on_tick(const master_asks& asks, control_client& control, const actors::node_controls& controls);

 private:
  std::string name_;
  std::optional<uint64_t> hold_, round_;
};

/// A cluster stop (longwave stop) as one node follows it: asked where it can stop, it holds at the boundary
/// after its current round and says which; told the round after which every node stops, it trains to it,
/// saves its checkpoint and exits. Without that round within max_hold of the question, or of the last time a
/// coordinator knew this node again (one that took over, or a dropped connection back), it stops where it
/// holds: the master went away.
class stop_follower {
 public:
  explicit stop_follower(std::string name) : name_(std::move(name)) {}

  void on_tick(const master_asks& asks, control_client& control, const actors::node_controls& controls,
               const std::function<void(std::string)>& record, steady::time_point now);

  /// The round after which this node stops (nullopt: it is not stopping).
  std::optional<uint64_t> round() const { return round_; }

 private:
  void stop(uint64_t round, const actors::node_controls& controls,
            const std::function<void(std::string)>& record);

  static constexpr std::chrono::seconds max_hold{60};
  std::string name_;
  std::optional<uint64_t> hold_, round_;
  steady::time_point held_since_;
};

}  // namespace longwave::cluster
