#pragma once
// A member serves its round-boundary states to joiners (state_server), turning each into bytes on a
// thread of its own, off the training path.
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "cluster/state_fetcher.hpp"
#include "cluster/state_server.hpp"
#include "comm/curve.hpp"
#include "runtime/checkpoint/checkpoint_bytes.hpp"

namespace longwave::cluster {

/// The two parts of a served state: (round, shared_part) and (round, own_part); async: (version, ...).
constexpr uint32_t shared_part = 0, own_part = 1;

/// Serves this node's round-boundary states to joiners: the training thread hands over a checkpoint (no
/// copy), a thread of its own turns the newest into bytes and publishes it.
class state_publisher {
 public:
  /// Listens on the host of this node's ring endpoint, on a port the system picks (CURVE: admitting the
  /// cluster's node keys).
  state_publisher(const std::string& ring_endpoint, uint64_t cluster_id,
                  std::optional<comm::curve_server_keys> curve);
  ~state_publisher();
  state_publisher(const state_publisher&) = delete;
  state_publisher& operator=(const state_publisher&) = delete;

  std::string endpoint() const { return server_.endpoint(); }
  /// Newest wins: a state still waiting when the next one comes is dropped. `version` (async): served under
  /// that version instead of c.round, and only the first state of a version (a joiner may be fetching it).
  void publish(runtime::checkpoint c, std::optional<uint64_t> version = std::nullopt);

 private:
  void run();

  state_server server_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<runtime::checkpoint> slot_;
  std::optional<uint64_t> slot_version_, last_version_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace longwave::cluster
