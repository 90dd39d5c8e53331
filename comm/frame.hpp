#pragma once
// Building and validating wire frames: the Cap'n Proto ChunkHeader and Envelope frames (comm/wire.capnp) and
// the checks every received frame passes before any of its fields is used.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "comm/codec.hpp"

namespace longwave::comm {

/// Why a received frame was dropped. to_string gives the stable names used in logs and on_reject.
enum class reject_reason : uint8_t {
  truncated,      ///< fewer frames or bytes than the message needs
  bad_size,       ///< a size is out of limits or disagrees with the frame length or the expected chunk
  malformed,      ///< not a valid Cap'n Proto message, or a field out of range (phase, weight, ...)
  bad_version,    ///< protocolVersion is not ours
  bad_dtype,      ///< unknown dtype, or not the dtype this ring uses
  wrong_cluster,  ///< clusterId is not ours
  wrong_round,    ///< an older (round, fragment): a late or replayed frame
  wrong_step,     ///< phase, step, segment or chunk is not the one expected next
  wrong_sender,   ///< sender is not the previous rank in the ring
  bad_checksum,   ///< CRC-32C of the payload differs from the header's
  bad_payload,    ///< the codec refused the payload (e.g. an int8 scale that is NaN)
  wrong_epoch,    ///< membership epoch is not this ring's (a frame from before or after a membership change)
};

/// The last reject_reason: values 0 .. last_reject_reason are all the reasons.
inline constexpr reject_reason last_reject_reason = reject_reason::wrong_epoch;

/// "truncated", "bad_size", "malformed", "bad_version", "bad_dtype", "wrong_cluster", "wrong_round",
/// "wrong_step", "wrong_sender", "bad_checksum", "bad_payload" or "wrong_epoch".
const char* to_string(reject_reason r);

/// A rejected frame: the reason and one line saying what exactly was wrong.
struct rejection {
  reject_reason reason;
  std::string detail;
  /// "<reason>: <detail>".
  std::string message() const;
};

/// A value parsed from a frame, or the rejection that stopped it.
template <class T>
class frame_result {
 public:
  frame_result(T value) : value_(std::move(value)) {}  // NOLINT: implicit on purpose, like expected<T>
  frame_result(rejection r) : rejection_(std::move(r)) {}

  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  /// The value; only when ok().
  const T& value() const& { return *value_; }
  T& value() & { return *value_; }
  /// The rejection; only when !ok().
  const rejection& error() const { return rejection_; }

 private:
  std::optional<T> value_;
  rejection rejection_{reject_reason::malformed, {}};
};

/// The all-reduce phase a chunk belongs to (wire::Phase).
enum class ring_phase : uint8_t { reduce_scatter = 0, all_gather = 1 };

/// "reduce_scatter" or "all_gather".
const char* to_string(ring_phase p);

/// The fields of a ChunkHeader as plain values (protocolVersion is implied: build writes ours, parse checks
/// it).
struct chunk_header {
  uint64_t cluster_id = 0;
  uint64_t epoch = 0;  ///< membership epoch the all-reduce runs in
  uint64_t round = 0;
  uint32_t fragment = 0;
  ring_phase phase = ring_phase::reduce_scatter;
  uint32_t step = 0;     ///< ring step within the phase, 0 .. world_size-2
  uint32_t segment = 0;  ///< ring segment, 0 .. world_size-1
  uint32_t chunk = 0;    ///< chunk index within the segment
  uint32_t sender = 0;   ///< sender's rank
  uint32_t world_size = 0;
  wire_dtype dtype = wire_dtype::fp32;
  uint64_t total_elements = 0;  ///< length of the whole vector (dtype sparse: bytes of one rank's message)
  uint64_t element_count = 0;   ///< values in this chunk (dtype sparse: bytes, = byte_count)
  uint64_t byte_count = 0;      ///< payload frame length
  uint32_t checksum = 0;        ///< CRC-32C of the payload
  /// Reduce-scatter: weight already summed in; all-gather: total weight; allgather: the origin rank's.
  double weight = 0.0;
};

/// What the receiver expects of the next chunk: everything a header is compared with.
struct chunk_expectation {
  uint64_t cluster_id = 0;
  uint64_t epoch = 0;
  uint64_t round = 0;
  uint32_t fragment = 0;
  uint32_t world_size = 0;
  uint64_t total_elements = 0;
  wire_dtype dtype = wire_dtype::fp32;
  uint32_t sender = 0;
  ring_phase phase = ring_phase::reduce_scatter;
  uint32_t step = 0;
  uint32_t segment = 0;
  uint32_t chunk = 0;
  uint64_t element_count = 0;
  uint64_t byte_count = 0;  ///< encoded_size(dtype, element_count), 0 for an empty chunk
};

/// Largest ChunkHeader frame accepted (a real one is about 120 bytes).
inline constexpr size_t max_chunk_header_bytes = 512;
/// Largest Envelope frame accepted.
inline constexpr size_t max_envelope_bytes = 256 * 1024;
/// The protocol version written into and required of every ChunkHeader and Hello (wire::PROTOCOL_VERSION).
uint16_t protocol_version();

/// Serializes h as a single-segment, unpacked Cap'n Proto ChunkHeader: the first of a chunk's two frames.
std::vector<std::byte> build_chunk_header(const chunk_header& h);

/// Decodes a header frame on its own: length a multiple of 8 and at most max_chunk_header_bytes, segment
/// table consistent with the length, explicit ReaderOptions (traversal and nesting limits), Cap'n Proto
/// errors caught; protocol version, dtype and phase in range, weight finite and >= 0, element_count <=
/// total_elements. The frame need not be aligned (it is copied).
frame_result<chunk_header> parse_chunk_header(const void* data, size_t size);

/// True when h is of e's cluster and epoch and (h.round, h.fragment) comes after the expected one: a frame
/// from a peer that is already in a later round, which the receiver keeps for later instead of rejecting.
/// A frame of another epoch is never kept (its ring's membership is not this one's).
bool is_later_round(const chunk_header& h, const chunk_expectation& e);

/// Checks a parsed header and its payload frame against e, cheapest first: cluster, epoch, round and
/// fragment, the header's byte count against payload_size, world size and vector length, dtype, sender,
/// position (phase, step, segment, chunk), element and byte counts against e, and last the CRC-32C.
/// nullopt: decode it.
std::optional<rejection> check_chunk(const chunk_header& h, const void* payload, size_t payload_size,
                                     const chunk_expectation& e);

/// parse_chunk_header then check_chunk.
frame_result<chunk_header> validate_chunk(const void* header, size_t header_size, const void* payload,
                                          size_t payload_size, const chunk_expectation& e);

// ---- control messages (one Envelope frame each) ----

/// One all-reduce of a run: (round, fragment), increasing from call to call.
struct reduce_key {
  uint64_t round = 0;
  uint32_t fragment = 0;
  friend bool operator==(const reduce_key& a, const reduce_key& b) {
    return a.round == b.round && a.fragment == b.fragment;
  }
  friend bool operator!=(const reduce_key& a, const reduce_key& b) { return !(a == b); }
  friend bool operator<(const reduce_key& a, const reduce_key& b) {
    return a.round != b.round ? a.round < b.round : a.fragment < b.fragment;
  }
};
/// A node asks to join (or, running, re-announces itself to a restarted coordinator).
struct hello_msg {
  uint16_t protocol_version = 0;
  uint64_t cluster_id = 0;
  std::string node_name;
  uint32_t n_workers = 0;
  std::string data_endpoint;
  uint64_t resume_round = 0;   ///< completed rounds of the node's newest checkpoint (0: none)
  bool running = false;        ///< a training node re-announcing itself: the fields below are set
  uint64_t epoch = 0;          ///< its epoch
  uint32_t world_size = 0;     ///< that epoch's member count
  reduce_key committed;        ///< the last all-reduce it applied
  uint64_t config_hash = 0;    ///< the node's training fingerprint (config::training_fingerprint)
  std::string state_endpoint;  ///< where the node serves its training state to joiners ("": nowhere)
  uint64_t data_fingerprint =
      0;  ///< its training data's fingerprint (models::data::data_fingerprint; 0: none)
  /// The completed rounds of every checkpoint it holds, oldest first (at most max_checkpoint_rounds, the
  /// newest): a cluster resumes after the newest round they all hold.
  std::vector<uint64_t> checkpoint_rounds;
};
/// One ring member in a welcome_msg.
struct peer_entry {
  uint32_t rank = 0;
  std::string name;
  std::string endpoint;
  std::string public_key;  ///< CURVE public key (Z85); "" without CURVE
};
/// The answer to hello: the receiver's rank and every member's data endpoint.
struct welcome_msg {
  uint32_t rank = 0;
  uint32_t world_size = 0;
  std::vector<peer_entry> peers;
  uint64_t start_round = 0;  ///< the round every node resumes from (the oldest of the nodes' resume rounds)
  uint64_t epoch = 0;        ///< the membership epoch the ring starts in
  std::vector<peer_entry> keys;  ///< CURVE: every node key the cluster admits (name, public_key)
};
/// Membership is changing to `epoch`: abandon the all-reduce in flight and report (fence_ack_msg).
struct fence_msg {
  uint64_t epoch = 0;
};
/// A node's answer to a fence, once its ring is idle.
struct fence_ack_msg {
  uint64_t epoch = 0;
  reduce_key committed;      ///< the last all-reduce the node applied ({0, 0}: none)
  bool has_pending = false;  ///< an all-reduce was in flight
  reduce_key pending;        ///< ... this one
  bool have_result = false;  ///< ... and its result had arrived (its confirmation had not)
};
/// The members of an epoch in ring order, the receiver's rank, and which interrupted all-reduce is kept.
struct membership_msg {
  uint64_t epoch = 0;
  uint32_t rank = 0;
  std::vector<peer_entry> peers;  ///< indexed by rank
  std::vector<uint32_t> workers;  ///< each member's worker count, indexed by rank
  reduce_key commit;              ///< nodes holding this all-reduce's result keep it; others redo theirs
  std::vector<peer_entry> keys;   ///< CURVE: every node key the cluster admits (name, public_key)
};
/// Node `node` is asked to leave the cluster at its next round boundary.
struct leave_msg {
  std::string node;
};
/// Stopping the whole cluster at one round boundary (`longwave stop`): requester -> coordinator and
/// coordinator -> member with round 0 (stop, or: where can you stop?), member -> coordinator with the round
/// after which it holds, coordinator -> member with the round after which every member stops.
struct stop_msg {
  uint64_t round = 0;
};
/// Holding the members at one round boundary while a joiner fetches that round's state: coordinator ->
/// member with round 0 (where can you hold?), round R (hold after R) or release (go on); member ->
/// coordinator with the round after which it holds.
struct pin_msg {
  uint64_t round = 0;
  bool release = false;
};
/// theta_global after round `round` has CRC-32C `theta_crc` (node -> coordinator, once per round).
struct committed_msg {
  uint64_t round = 0;
  uint32_t theta_crc = 0;
};
/// A node's ring failed in `epoch` (e.g. the next rank's connection dropped).
struct ring_failed_msg {
  uint64_t epoch = 0;
  std::string suspect;  ///< the node the ring lost, if known
  std::string reason;
};
/// The coordinator lets a node join the running cluster: fetch the state from `sources` (each member's state
/// server), then send join_ready_msg. Sent again (with a note) when the state fetched was stale.
struct recover_msg {
  uint64_t epoch = 0;
  std::vector<peer_entry> sources;
  std::string note;
  uint64_t round = 0;          ///< the round the members last reported completing
  uint64_t worker_offset = 0;  ///< the global rank of the joiner's first worker
};
/// A joiner holds the state after all-reduce `key` (completed round `round`) and asks to be admitted.
struct join_ready_msg {
  reduce_key key;
  uint64_t round = 0;
};
struct round_start_msg {
  uint64_t round = 0;
  uint32_t fragment = 0;
  uint64_t n_elements = 0;
  wire_dtype dtype = wire_dtype::fp32;
};
struct heartbeat_msg {
  uint64_t round = 0;
  uint64_t unix_millis = 0;
  uint64_t epoch = 0;
};
struct done_msg {
  uint64_t round = 0;
  uint32_t fragment = 0;
};
struct error_msg {
  uint16_t code = 0;  ///< a longwave::errc value
  std::string message;
};
struct bye_msg {
  std::string reason;
};

/// A control message: who sent it and which of the union members it carries.
struct envelope {
  uint64_t cluster_id = 0;
  uint32_t sender = 0xffffffffu;  ///< rank, or 0xffffffff before the sender has one
  std::variant<hello_msg, welcome_msg, round_start_msg, heartbeat_msg, done_msg, error_msg, bye_msg,
               fence_msg, fence_ack_msg, membership_msg, ring_failed_msg, leave_msg, recover_msg,
               join_ready_msg, stop_msg, committed_msg, pin_msg>
      body;
  /// The sending coordinator's term, or the newest term a node follows (0: none yet): one coordinator leads.
  uint64_t term = 0;
};

/// Limits parse_envelope enforces on text and lists.
inline constexpr size_t max_name_bytes = 256;
inline constexpr size_t max_endpoint_bytes = 1024;
inline constexpr size_t max_message_bytes = 4096;
inline constexpr size_t max_peers = 4096;
inline constexpr size_t max_checkpoint_rounds = 64;

/// Serializes e as an unpacked Cap'n Proto Envelope (one frame). Texts longer than the limits above are
/// refused by the receiver, so keep them short.
std::vector<std::byte> build_envelope(const envelope& e);

/// Decodes and checks an Envelope frame: the same framing checks as parse_chunk_header (with
/// max_envelope_bytes), a known union member, text and list sizes within the limits, dtype in range, and
/// clusterId == expected_cluster_id (wrong_cluster otherwise). Protocol-level checks such as Hello's version
/// are the caller's.
frame_result<envelope> parse_envelope(const void* data, size_t size, uint64_t expected_cluster_id);

}  // namespace longwave::comm
