#pragma once
// The serving side of state transfer: a member serves its published training states (opaque blobs, e.g. a
// serialized checkpoint) to joiners on its own thread. Wire: cluster/state_frames.hpp.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cluster/state_frames.hpp"
#include "comm/curve.hpp"

namespace longwave::cluster {

using comm::curve_server_keys;

/// Why a server dropped or refused a request (counted per reason, see state_server::rejected).
enum class state_reject : uint8_t {
  bad_framing,    ///< not [routing id][one request frame], or the frame is too long
  malformed,      ///< not a valid StateRequest, or an unknown kind or protocol version
  wrong_cluster,  ///< another cluster's request: answered refused
  gone,           ///< a key the server does not hold (any more): answered gone
  bad_range,      ///< offset or length out of range or unaligned: answered badRequest
};
inline constexpr size_t n_state_rejects = 5;
/// The reason's name in logs: "bad_framing", "malformed", ...
const char* to_string(state_reject why);

/// Told of each request the server drops or refuses, on its thread: the peer's address ("" if unknown),
/// why, and what the peer was told.
using state_refusal_callback =
    std::function<void(const std::string& peer, state_reject why, const std::string& message)>;

/// Serves published states to joiners on its own thread (a ROUTER socket), off the training path.
class state_server {
 public:
  /// Binds bind_endpoint, e.g. "tcp://127.0.0.1:*" (an ephemeral port) or "tcp://10.0.0.2:5700".
  /// Throws lw_error(errc::io_error) naming the endpoint when it cannot bind.
  /// With `curve`, only the admitted node keys get in and replies are encrypted.
  state_server(const std::string& bind_endpoint, uint64_t cluster_id,
               std::optional<curve_server_keys> curve = std::nullopt, state_refusal_callback on_refused = {});
  ~state_server();  // stops the thread promptly
  state_server(const state_server&) = delete;
  state_server& operator=(const state_server&) = delete;

  /// The bound endpoint with its port resolved (what joiners connect to).
  std::string endpoint() const { return endpoint_; }

  /// Makes `bytes` the newest state under `key` (round = completed outer rounds); keeps the previous
  /// max_held_states - 1 too (a joiner mid-download keeps its source). Thread-safe, O(1): never copies bytes,
  /// never waits for a transfer. The bytes must not change while published. Checksums are computed on the
  /// server's thread when a joiner first asks for the state.
  void publish(reduce_key key, uint64_t round, std::shared_ptr<const std::vector<std::byte>> bytes);

  /// Payload bytes of the chunk replies handed to ZeroMQ so far (queued for sending).
  uint64_t bytes_served() const { return bytes_served_.load(std::memory_order_relaxed); }
  /// Requests dropped or refused for `why` so far.
  uint64_t rejected(state_reject why) const {
    return rejected_[static_cast<size_t>(why)].load(std::memory_order_relaxed);
  }
  /// All requests dropped or refused so far.
  uint64_t rejected_total() const;

  struct published;  // a state and its checksums (state_server.cpp)

 private:
  void run();
  /// Answers one received message (parts[0] the joiner's routing id); counts what it refuses.
  void answer(std::vector<zmq::message_t>& parts, size_t n_parts);
  void serve_chunk(zmq::message_t& identity, const state_request& req,
                   const std::vector<std::shared_ptr<published>>& held);
  /// Sends [identity][reply] or [identity][reply][payload]; a joiner gone meanwhile is dropped by ROUTER.
  void send(const zmq::message_t& identity, const state_reply& reply, zmq::message_t* payload = nullptr);
  /// Tells on_refused_ (if set) of a refusal of the request being answered; what it throws is dropped.
  void tell(state_reject why, const std::string& message);
  void refuse(const zmq::message_t& identity, state_reject why, state_status status, uint64_t request_id,
              std::string message);

  uint64_t cluster_id_;
  state_refusal_callback on_refused_;
  const zmq::message_t* request_ = nullptr;  // the request frame being answered (its peer's address)
  std::string endpoint_;
  struct sockets;
  std::unique_ptr<sockets> sockets_;
  std::mutex mu_;                                 // guards held_ (publish vs. the server thread)
  std::vector<std::shared_ptr<published>> held_;  // newest first, at most max_held_states
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> bytes_served_{0};
  std::atomic<uint64_t> rejected_[n_state_rejects] = {};
  std::thread thread_;
};

}  // namespace longwave::cluster
