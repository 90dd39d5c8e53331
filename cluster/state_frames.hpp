#pragma once
// State transfer's frames (cluster/state.capnp) as plain structs, built and checked in one place for the
// server (state_server.cpp) and the fetcher (state_fetcher.cpp). A request is one frame from the joiner's
// DEALER; a reply is one StateReply frame, followed for a chunk by the chunk's raw bytes as a second frame.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "comm/frame.hpp"

namespace longwave::cluster {

using comm::reduce_key;

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
/// Most offers a reply may carry.
inline constexpr size_t max_state_offers = 8;

/// A reply's status (wire::StateStatus, the same numbers).
enum class state_status : uint16_t {
  offer = 0,        ///< offers holds the states served, newest first
  chunk = 1,        ///< the payload frame follows
  gone = 2,         ///< the key is not held (any more)
  refused = 3,      ///< another cluster's request
  bad_request = 4,  ///< the request failed validation; message says why
};

/// One state a server offers: its key, size and checksums (whole and per block).
struct offer_info {
  reduce_key key;
  uint64_t round = 0;
  uint64_t total = 0;
  uint32_t checksum = 0;
  uint64_t block_bytes = 0;
  std::vector<uint32_t> block_checksums;

  bool same_contents(const offer_info& o) const {
    return key == o.key && round == o.round && total == o.total && checksum == o.checksum &&
           block_bytes == o.block_bytes && block_checksums == o.block_checksums;
  }
};

struct state_request {
  uint64_t cluster_id = 0;
  bool chunk = false;
  uint64_t request_id = 0;
  reduce_key key;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct state_reply {
  uint64_t cluster_id = 0;
  state_status status = state_status::bad_request;
  uint64_t request_id = 0;
  std::vector<offer_info> offers;
  reduce_key key;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t checksum = 0;
  std::string message;
};

/// "(round R, fragment F)".
std::string key_text(const reduce_key& k);
/// "12.5 MiB".
std::string mib(uint64_t b);

/// Reads one message of at most 3 frames; further frames are read and discarded, so a peer cannot make us
/// hold an unbounded number of them. n_parts counts them all. False when nothing was waiting.
bool recv_message(zmq::socket_t& sock, std::vector<zmq::message_t>& parts, size_t& n_parts);

zmq::message_t build_request(const state_request& r);
/// Decodes a request frame: nullopt and `out` filled, or why it is refused.
std::optional<std::string> parse_request(const void* data, size_t size, state_request& out);
/// The StateReply frame of r: offers only with status offer, key and range only with chunk, the message
/// only with gone, refused and bad_request.
zmq::message_t build_reply(const state_reply& r);
/// Decodes a reply's header frame: nullopt and `out` filled, or why it is refused.
std::optional<std::string> parse_reply(const void* data, size_t size, state_reply& out);

/// The checks state_server runs on a request frame (framing, Cap'n Proto limits, protocol version, kind):
/// nullopt if it passes, else why not (what the server answers badRequest with). For tests and fuzz/.
std::optional<std::string> check_state_request(const void* data, size_t size);

/// The checks fetch_state runs on a reply's header frame (framing, limits, version, status, each offer's
/// block size and checksum count): nullopt if it passes, else why not. For tests and fuzz/.
std::optional<std::string> check_state_reply(const void* data, size_t size);

}  // namespace longwave::cluster
