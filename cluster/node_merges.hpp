#pragma once
// diloco.outer = "async", a node's side: its contributions, handed from the training coordinator's thread to
// the main loop that sends them to the master, and the master's merges handed back to training. A
// contribution the master has not answered (merged or dropped) is sent again to a master that takes the
// cluster over, since a restarted master knows none.
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/cluster_link.hpp"
#include "cluster/control_client.hpp"
#include "cluster/node_watch.hpp"

namespace longwave::cluster {

class merge_follower {
 public:
  explicit merge_follower(std::string name) : name_(std::move(name)) {}

  /// Training coordinator's thread.
  void push(uint64_t v_start, uint64_t tokens);
  /// Main loop: sends what training contributed, passes the master's merges on, and re-sends the unanswered
  /// contribution after a takeover (asks.welcomed).
  void on_tick(const master_asks& asks, control_client& control, const actors::node_controls& controls);
  /// Main loop: the merges told of after version `applied`, oldest first (those up to it are forgotten).
  std::vector<merge_msg> unapplied(uint64_t applied);

 private:
  /// Whether m answers this node's contribution (merges it or drops it).
  bool answers(const merge_msg& m) const;

  std::string name_;
  std::mutex mu_;
  std::vector<contribute_msg> queued_;        // pushed by training, not yet sent
  std::optional<contribute_msg> unanswered_;  // sent, not yet merged or dropped (main loop only)
  std::map<uint64_t, merge_msg> told_;        // merges told of, not yet applied (main loop only)
  uint64_t forgotten_ = 0;                    // merges up to it are applied and forgotten (main loop only)
  uint64_t pushed_ = 0;                       // contributions pushed (contribute_msg::seq; under mu_)
};

}  // namespace longwave::cluster
