#pragma once
// A master that is about to listen at one of several [cluster] coordinator addresses first looks for another
// master that leads: while one answers at another address, this one stands by (a lease held by the leader's
// liveness: ZeroMQ handshakes and ZMTP heartbeats), and listens only once it has been unreachable for a
// while. It tells the leader it stands by, and ends when the leader says the cluster ended.
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/curve.hpp"

namespace longwave::cluster {

struct standby_options {
  /// The cluster's other coordinator addresses.
  std::vector<std::string> others;
  /// The cluster's id, and this master's own address: the leader is told it stands by there (a Standby
  /// message every 2 s), and says bye to it when the cluster ends.
  uint64_t cluster_id = 0;
  std::string address;
  /// CURVE: the coordinator's key pair (the cluster key): the look is a client of that key, which a leader
  /// admits as the operator's.
  std::optional<comm::curve_key> curve;
  /// How long the first look waits for another master to answer.
  std::chrono::milliseconds first_look{1500};
  /// The leader unreachable this long (heartbeat_timeout_s): this master takes over.
  std::chrono::milliseconds silence{6000};
  std::function<bool()> stop;                    ///< polled every 100 ms: true ends the wait
  std::function<void(const std::string&)> info;  ///< standing by, taking over
};

/// What the wait ended with.
enum class standby_end : uint8_t {
  lead,       ///< no other master answered within first_look: this one leads from the start
  take_over,  ///< the master that led has been unreachable for `silence`: this one takes its place
  stopped,    ///< stop() asked to end first
  ended,      ///< the master that led said the cluster ended (stopped, finished, called off): nothing to lead
  foreign,    ///< a master of another cluster (another [cluster] id) listens at one of the addresses
};

/// How the wait ended, and for `ended` what the leader said (`foreign`: which address serves which cluster).
struct standby_result {
  standby_end end = standby_end::lead;
  std::string said;
};

/// Waits while another master leads; says when (and why) this one should listen.
standby_result stand_by(const standby_options& o);

}  // namespace longwave::cluster
