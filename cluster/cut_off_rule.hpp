#pragma once
// A training node's rule for when it is cut off from its cluster (pure: its event-table test needs no
// socket).
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace longwave::cluster {

/// When a node takes itself to be cut off from its cluster: its ring cannot go on without a coordinator (a
/// call failed, or a fence awaits its membership) and the coordinator has been unreachable for `after`. By
/// then a coordinator has removed a node it cannot hear (a partition) and a standby has taken a dead one's
/// place. Pure: fed the node's events and the time.
class cut_off_rule {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  explicit cut_off_rule(std::chrono::milliseconds after) : after_(after) {}
  /// An all-reduce that began at `began` failed and was reported at `now`: the ring is taken to have stalled
  /// since the call began, since it may have waited out its timeout on a neighbour that died (an earlier
  /// stall keeps its time).
  void ring_failed(time_point began, time_point now);
  /// The coordinator fenced the ring for epoch `epoch`: no call runs until its membership.
  void fenced(uint64_t epoch, time_point now);
  /// A membership: the ring goes on.
  void entered() { stalled_since_.reset(); }
  /// Once the ring has stalled and the coordinator been unreachable (since `gone_since`; nullopt while it is
  /// connected) for `after`: why this node stops. Said once per stall.
  std::optional<std::string> due(std::optional<time_point> gone_since, time_point now);
  /// The ring cannot go on without a coordinator (a failed call or a fence since the last membership).
  bool stalled() const { return stalled_since_.has_value(); }

 private:
  std::chrono::milliseconds after_;
  std::optional<time_point> stalled_since_;
  std::optional<uint64_t> fence_epoch_;  // the stall is a fence's (else a failed call's)
};

}  // namespace longwave::cluster
