#pragma once
// State transfer: a node joining a running cluster downloads the live training state (an opaque blob, e.g. a
// serialized checkpoint) from several members at once. state_server serves on its own thread; fetch_state
// is the joiner's side. Wire: StateRequest / StateReply in comm/wire.capnp.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/curve.hpp"
#include "comm/frame.hpp"

namespace longwave::comm {

/// Largest chunk a server sends in one reply; larger requests are answered badRequest.
inline constexpr uint64_t max_state_chunk_bytes = 64ull << 20;
/// Largest request frame a server accepts (a real one is about 80 bytes).
inline constexpr size_t max_state_request_bytes = 512;
/// Largest reply header frame a fetcher accepts (an offer with its block checksums).
inline constexpr size_t max_state_reply_bytes = 2u << 20;
/// States a server holds: the newest first (a joiner mid-download keeps its source while newer ones come).
inline constexpr size_t max_held_states = 2;
/// Most blocks an offer may list (a server picks its block size so that a state has at most 65536).
inline constexpr uint64_t max_state_blocks = 1u << 18;

/// Why a server dropped or refused a request (counted per reason, see state_server::rejected).
enum class state_reject : uint8_t {
  bad_framing,    ///< not [routing id][one request frame], or the frame is too long
  malformed,      ///< not a valid StateRequest, or an unknown kind or protocol version
  wrong_cluster,  ///< another cluster's request: answered refused
  gone,           ///< a key the server does not hold (any more): answered gone
  bad_range,      ///< offset or length out of range or unaligned: answered badRequest
};
inline constexpr size_t n_state_rejects = 5;

/// Serves published states to joiners on its own thread (a ROUTER socket), off the training path.
class state_server {
 public:
  /// Binds bind_endpoint, e.g. "tcp://127.0.0.1:*" (an ephemeral port) or "tcp://10.0.0.2:5700".
  /// Throws lw_error(errc::io_error) naming the endpoint when it cannot bind.
  /// With `curve`, only the admitted node keys get in and replies are encrypted.
  state_server(const std::string& bind_endpoint, uint64_t cluster_id,
               std::optional<curve_server_keys> curve = std::nullopt);
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

  struct published;  // a state and its checksums (state_transfer.cpp)

 private:
  void run();

  uint64_t cluster_id_;
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

struct fetch_options {
  std::chrono::milliseconds timeout{30000};  ///< no progress from any peer this long: give up
  size_t chunk_bytes = 1 << 20;              ///< rounded up to a multiple of the offer's block size
  std::optional<reduce_key> want;            ///< this key only (else the newest key any peer offers)
  std::optional<uint32_t> fragment;          ///< without want: the newest key with this fragment
  uint64_t min_round = 0;                    ///< without want: only keys of this round or later
  /// About every 10 % or every second: bytes verified so far, and the state's size.
  std::function<void(uint64_t done_bytes, uint64_t total_bytes)> progress;
  /// About every second while the fetch runs, progress or not (a joiner's heartbeats go on while a dead
  /// peer stalls it); it may throw to abandon the fetch.
  std::function<void()> tick;
  /// Requests in flight per peer; 0: enough for 16 MiB (at least 2), so that one peer can fill a long link.
  size_t in_flight = 0;
  /// A peer that owes replies and sends nothing this long is dropped and its chunks go to the others
  /// (a peer whose connection drops is dropped at once). 0: timeout / 3, at least 1 s.
  std::chrono::milliseconds peer_stall{0};
  /// A peer offering a larger state is dropped (malformed): the joiner allocates the whole state up front.
  uint64_t max_bytes = 256ull << 30;
  /// CURVE: this node's key pair, and each peer's public key (indexed like the peers; pinned).
  std::optional<curve_key> curve;
  std::vector<std::string> peer_keys;
};

struct fetched_state {
  reduce_key key;
  uint64_t round = 0;
  std::vector<std::byte> bytes;
  double seconds = 0;
  std::vector<uint64_t> bytes_per_peer;  ///< verified bytes each peer sent; index = peers' order
  std::vector<std::string> dropped;      ///< "peer: cause" for each peer left out or dropped
};

/// Asks each peer what it offers; takes the newest key (or opts.want) and downloads its chunks from every
/// peer that offers that key with the same checksums, in parallel (several chunks in flight per peer);
/// checks every chunk against its CRC-32C and the offer's block checksums, and the whole blob's CRC-32C;
/// a peer that fails, stalls or sends a bad chunk is dropped and its chunks are fetched from the others.
/// Throws lw_error naming the peers and causes: errc::peer_lost (no peer offers a state / all dropped),
/// errc::deadline_missed (no progress for opts.timeout), errc::malformed_frame (every peer sent garbage),
/// errc::invalid_config (every peer serves another cluster).
fetched_state fetch_state(const std::vector<std::string>& peers, uint64_t cluster_id,
                          const fetch_options& opts = {});

/// The checks state_server runs on a request frame (framing, Cap'n Proto limits, protocol version, kind):
/// nullopt if it passes, else why not (what the server answers badRequest with). For tests and fuzz/.
std::optional<std::string> check_state_request(const void* data, size_t size);

/// The checks fetch_state runs on a reply's header frame (framing, limits, version, status, each offer's
/// block size and checksum count): nullopt if it passes, else why not. For tests and fuzz/.
std::optional<std::string> check_state_reply(const void* data, size_t size);

}  // namespace longwave::comm
