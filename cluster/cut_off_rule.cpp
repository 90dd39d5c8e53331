// When a node is cut off from its cluster (see cut_off_rule.hpp).
#include "cluster/cut_off_rule.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace longwave::cluster {

void cut_off_rule::ring_failed(time_point began, time_point now) {
  if (stalled_since_) return;
  stalled_since_ = std::min(began, now);
  fence_epoch_.reset();
}

void cut_off_rule::fenced(uint64_t epoch, time_point now) {
  stalled_since_ = now;
  fence_epoch_ = epoch;
}

std::optional<std::string> cut_off_rule::due(std::optional<time_point> gone_since, time_point now) {
  if (!stalled_since_ || !gone_since || now - std::max(*stalled_since_, *gone_since) < after_) return {};
  const auto what = fence_epoch_ ? fmt::format(
                                       "this node's ring is fenced for epoch {} (it waits for that "
                                       "membership)",
                                       *fence_epoch_)
                                 : std::string("this node's ring failed");
  stalled_since_.reset();
  return fmt::format(
      "cut off from the cluster: {} and the coordinator has not been reachable for {:.0f} s; a coordinator "
      "removes a node it cannot hear (a partition, or this node's links are down) and a standby takes a "
      "dead one's place, and the others go on. Its checkpoints are kept: start it again with the same "
      "command to rejoin",
      what, std::chrono::duration<double>(now - *gone_since).count());
}

}  // namespace longwave::cluster
