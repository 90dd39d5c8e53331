// Data-plane frames: the Cap'n Proto ChunkHeader built and parsed with explicit limits, and the chunk checks
// against what the receiver expects. Nothing here trusts a peer: every size is checked before use and
// every Cap'n Proto (kj) exception is turned into a rejection.
#include "comm/frame.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fmt/format.h>

#include <kj/array.h>
#include <kj/exception.h>
#include <cmath>
#include <cstring>

#include "comm/capnp_frame.hpp"
#include "comm/wire.capnp.h"
#include "runtime/checksum/crc32c.hpp"

namespace longwave::comm {

using runtime::crc32c;

const char* to_string(reject_reason r) {
  switch (r) {
    case reject_reason::truncated: return "truncated";
    case reject_reason::bad_size: return "bad_size";
    case reject_reason::malformed: return "malformed";
    case reject_reason::bad_version: return "bad_version";
    case reject_reason::bad_dtype: return "bad_dtype";
    case reject_reason::wrong_cluster: return "wrong_cluster";
    case reject_reason::wrong_round: return "wrong_round";
    case reject_reason::wrong_step: return "wrong_step";
    case reject_reason::wrong_sender: return "wrong_sender";
    case reject_reason::bad_checksum: return "bad_checksum";
    case reject_reason::bad_payload: return "bad_payload";
    case reject_reason::wrong_epoch: return "wrong_epoch";
  }
  return "invalid";
}

std::string rejection::message() const {
  return std::string(to_string(reason)) + ": " + detail;
}

const char* to_string(ring_phase p) {
  switch (p) {
    case ring_phase::reduce_scatter: return "reduce_scatter";
    case ring_phase::all_gather: return "all_gather";
  }
  return "invalid";
}

uint16_t protocol_version() {
  return wire::PROTOCOL_VERSION;
}

std::vector<std::byte> build_chunk_header(const chunk_header& h) {
  // 24 words hold the whole header, so the message is one segment.
  capnp::MallocMessageBuilder mb(24);
  auto w = mb.initRoot<wire::ChunkHeader>();
  w.setProtocolVersion(wire::PROTOCOL_VERSION);
  w.setClusterId(h.cluster_id);
  w.setRound(h.round);
  w.setFragment(h.fragment);
  w.setPhase(static_cast<wire::Phase>(static_cast<uint16_t>(h.phase)));
  w.setStep(h.step);
  w.setSegment(h.segment);
  w.setChunk(h.chunk);
  w.setSender(h.sender);
  w.setWorldSize(h.world_size);
  w.setDtype(to_wire(h.dtype));
  w.setTotalElements(h.total_elements);
  w.setElementCount(h.element_count);
  w.setByteCount(h.byte_count);
  w.setChecksum(h.checksum);
  w.setWeight(h.weight);
  w.setEpoch(h.epoch);
  return flat_bytes(mb);
}

frame_result<chunk_header> parse_chunk_header(const void* data, size_t size) {
  auto framed = check_framing(data, size, max_chunk_header_bytes, "chunk header");
  if (!framed) return framed.error();
  const auto& words = framed.value().words;
  chunk_header h;
  uint16_t version = 0, dtype = 0, phase = 0;
  try {
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(words.begin(), words.size()),
                                         reader_options(words.size(), 4));
    auto r = reader.getRoot<wire::ChunkHeader>();
    version = r.getProtocolVersion();
    h.cluster_id = r.getClusterId();
    h.round = r.getRound();
    h.fragment = r.getFragment();
    phase = static_cast<uint16_t>(r.getPhase());
    h.step = r.getStep();
    h.segment = r.getSegment();
    h.chunk = r.getChunk();
    h.sender = r.getSender();
    h.world_size = r.getWorldSize();
    dtype = static_cast<uint16_t>(r.getDtype());
    h.total_elements = r.getTotalElements();
    h.element_count = r.getElementCount();
    h.byte_count = r.getByteCount();
    h.checksum = r.getChecksum();
    h.weight = r.getWeight();
    h.epoch = r.getEpoch();
  } catch (const kj::Exception& e) {
    return reject(reject_reason::malformed, "chunk header does not decode: " + kj_text(e));
  }
  if (version != wire::PROTOCOL_VERSION)
    return reject(reject_reason::bad_version,
                  fmt::format("protocol version {}, this node speaks {}", version, wire::PROTOCOL_VERSION));
  if (!known_dtype(dtype)) return reject(reject_reason::bad_dtype, fmt::format("unknown dtype {}", dtype));
  h.dtype = static_cast<wire_dtype>(dtype);
  if (phase > static_cast<uint16_t>(ring_phase::all_gather))
    return reject(reject_reason::malformed, fmt::format("unknown phase {}", phase));
  h.phase = static_cast<ring_phase>(phase);
  if (!std::isfinite(h.weight) || h.weight < 0.0)
    return reject(reject_reason::malformed, fmt::format("weight {} is not a finite number >= 0", h.weight));
  if (h.world_size == 0) return reject(reject_reason::malformed, "world size 0");
  if (h.element_count > h.total_elements)
    return reject(reject_reason::bad_size,
                  fmt::format("chunk of {} values in a vector of {}", h.element_count, h.total_elements));
  return h;
}

bool is_later_round(const chunk_header& h, const chunk_expectation& e) {
  if (h.cluster_id != e.cluster_id || h.epoch != e.epoch) return false;
  return h.round > e.round || (h.round == e.round && h.fragment > e.fragment);
}

std::optional<rejection> check_chunk(const chunk_header& h, const void* payload, size_t payload_size,
                                     const chunk_expectation& e) {
  if (h.cluster_id != e.cluster_id)
    return reject(reject_reason::wrong_cluster,
                  fmt::format("cluster id {:#x}, this ring is {:#x}", h.cluster_id, e.cluster_id));
  if (h.epoch != e.epoch)
    return reject(reject_reason::wrong_epoch,
                  fmt::format("epoch {}, this ring is in epoch {}", h.epoch, e.epoch));
  if (h.round != e.round || h.fragment != e.fragment)
    return reject(reject_reason::wrong_round,
                  fmt::format("round {} fragment {}, this rank is in round {} fragment {}", h.round,
                              h.fragment, e.round, e.fragment));
  // The header's own sizes against the frame it came with, before anything is compared with the schedule.
  if (payload_size != h.byte_count)
    return reject(payload_size < h.byte_count ? reject_reason::truncated : reject_reason::bad_size,
                  fmt::format("payload frame has {} bytes, header says {}", payload_size, h.byte_count));
  if (h.world_size != e.world_size)
    return reject(reject_reason::bad_size,
                  fmt::format("sender's ring has {} ranks, ours {}", h.world_size, e.world_size));
  if (h.total_elements != e.total_elements)
    return reject(reject_reason::bad_size,
                  fmt::format("sender reduces {} values, this rank {}", h.total_elements, e.total_elements));
  if (h.dtype != e.dtype)
    return reject(reject_reason::bad_dtype,
                  fmt::format("dtype {}, this ring uses {}", to_string(h.dtype), to_string(e.dtype)));
  if (h.sender != e.sender)
    return reject(reject_reason::wrong_sender,
                  fmt::format("sender rank {}, expected rank {}", h.sender, e.sender));
  if (h.phase != e.phase || h.step != e.step || h.segment != e.segment || h.chunk != e.chunk)
    return reject(reject_reason::wrong_step,
                  fmt::format("{} step {} segment {} chunk {}, expected {} step {} segment {} chunk {}",
                              to_string(h.phase), h.step, h.segment, h.chunk, to_string(e.phase), e.step,
                              e.segment, e.chunk));
  if (h.element_count != e.element_count)
    return reject(reject_reason::bad_size,
                  fmt::format("chunk of {} values, expected {}", h.element_count, e.element_count));
  if (h.byte_count != e.byte_count)
    return reject(reject_reason::bad_size,
                  fmt::format("header says {} payload bytes, {} values of {} take {}", h.byte_count,
                              e.element_count, to_string(e.dtype), e.byte_count));
  const uint32_t crc = crc32c(payload, payload_size);
  if (crc != h.checksum)
    return reject(reject_reason::bad_checksum,
                  fmt::format("payload CRC-32C {:08x}, header says {:08x}", crc, h.checksum));
  return std::nullopt;
}

frame_result<chunk_header> validate_chunk(const void* header, size_t header_size, const void* payload,
                                          size_t payload_size, const chunk_expectation& e) {
  auto h = parse_chunk_header(header, header_size);
  if (!h) return h;
  if (auto bad = check_chunk(h.value(), payload, payload_size, e)) return *bad;
  return h;
}

}  // namespace longwave::comm
