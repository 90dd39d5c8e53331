#pragma once
// Building and validating the data plane's wire frames: the Cap'n Proto ChunkHeader (comm/wire.capnp) and
// the checks every received chunk passes before any of its fields is used. The control plane's envelopes are
// cluster/envelope.hpp.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "comm/codec.hpp"
#include "comm/reduce_key.hpp"

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

}  // namespace longwave::comm
