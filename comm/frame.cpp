// Wire frames: Cap'n Proto ChunkHeader and Envelope built and parsed with explicit limits, and the chunk
// checks against what the receiver expects. Nothing here trusts a peer: every size is checked before use and
// every Cap'n Proto (kj) exception is turned into a rejection.
#include "comm/frame.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fmt/format.h>

#include <kj/array.h>
#include <kj/exception.h>
#include <cmath>
#include <cstring>

#include "comm/curve.hpp"
#include "comm/wire.capnp.h"
#include "runtime/checksum/crc32c.hpp"

namespace longwave::comm {

using runtime::crc32c;
namespace {

rejection reject(reject_reason r, std::string detail) {
  return rejection{r, std::move(detail)};
}

// A frame copied into word-aligned memory (ZeroMQ gives no alignment guarantee), after the framing checks
// that Cap'n Proto would otherwise report as exceptions: length a multiple of 8 and within the limit, and a
// segment table whose sizes add up to exactly the frame length.
struct aligned_frame {
  kj::Array<capnp::word> words;
};

frame_result<aligned_frame> check_framing(const void* data, size_t size, size_t max_bytes, const char* what) {
  if (size < 8)
    return reject(reject_reason::truncated,
                  fmt::format("{} frame has {} bytes, less than one word", what, size));
  if (size > max_bytes)
    return reject(reject_reason::bad_size,
                  fmt::format("{} frame has {} bytes, limit {}", what, size, max_bytes));
  if (size % 8 != 0)
    return reject(
        reject_reason::bad_size,
        fmt::format("{} frame has {} bytes, not a multiple of 8 (not an unpacked Cap'n Proto message)", what,
                    size));
  aligned_frame f;
  f.words = kj::heapArray<capnp::word>(size / 8);
  std::memcpy(f.words.begin(), data, size);
  const auto* bytes = reinterpret_cast<const unsigned char*>(f.words.begin());
  uint32_t first = 0;
  std::memcpy(&first, bytes, 4);
  const uint64_t n_segments = uint64_t{first} + 1;
  constexpr uint64_t max_segments = 16;
  if (n_segments > max_segments)
    return reject(reject_reason::malformed,
                  fmt::format("{} frame declares {} segments, limit {}", what, n_segments, max_segments));
  const uint64_t table_words = (4 + 4 * n_segments + 7) / 8;
  const uint64_t words = size / 8;
  if (table_words > words)
    return reject(reject_reason::truncated,
                  fmt::format("{} frame of {} bytes is shorter than its segment table", what, size));
  uint64_t body_words = 0;
  for (uint64_t s = 0; s < n_segments; ++s) {
    uint32_t w = 0;
    std::memcpy(&w, bytes + 4 + 4 * s, 4);
    body_words += w;
  }
  if (table_words + body_words > words)
    return reject(reject_reason::truncated,
                  fmt::format("{} frame has {} bytes but its segment table needs {}", what, size,
                              8 * (table_words + body_words)));
  if (table_words + body_words < words)
    return reject(reject_reason::bad_size,
                  fmt::format("{} frame has {} bytes but its segment table accounts for {}", what, size,
                              8 * (table_words + body_words)));
  if (body_words == 0) return reject(reject_reason::malformed, fmt::format("{} frame has no root", what));
  return f;
}

capnp::ReaderOptions reader_options(size_t words, int nesting) {
  capnp::ReaderOptions o;
  // Legitimate messages are read once; 4x the frame plus a little leaves room for default-struct reads
  // while stopping amplification through shared pointers.
  o.traversalLimitInWords = 4 * words + 64;
  o.nestingLimit = nesting;
  return o;
}

bool known_dtype(uint16_t v) {
  return v <= static_cast<uint16_t>(wire_dtype::sparse);
}

wire::Dtype to_wire(wire_dtype d) {
  return static_cast<wire::Dtype>(static_cast<uint16_t>(d));
}

std::string kj_text(const kj::Exception& e) {
  return std::string(e.getDescription().cStr());
}

template <class Builder>
std::vector<std::byte> flat_bytes(Builder& mb) {
  auto words = capnp::messageToFlatArray(mb);
  auto bytes = words.asBytes();
  std::vector<std::byte> out(bytes.size());
  std::memcpy(out.data(), bytes.begin(), bytes.size());
  return out;
}

capnp::Text::Reader txt(const std::string& s) {
  return capnp::Text::Reader(s.c_str(), s.size());
}

std::string text_of(capnp::Text::Reader t) {
  return std::string(t.cStr(), t.size());
}

std::optional<rejection> check_text(capnp::Text::Reader t, size_t limit, const char* field) {
  if (t.size() > limit)
    return reject(reject_reason::bad_size, fmt::format("{} has {} bytes, limit {}", field, t.size(), limit));
  return std::nullopt;
}

}  // namespace

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

// ---- control messages ----------------------------------------------------------------------------------

namespace {

void set_peers(capnp::List<wire::Peer>::Builder out, const std::vector<peer_entry>& peers) {
  for (size_t i = 0; i < peers.size(); ++i) {
    const auto k = static_cast<unsigned>(i);
    out[k].setRank(peers[i].rank);
    out[k].setName(txt(peers[i].name));
    out[k].setEndpoint(txt(peers[i].endpoint));
    out[k].setPublicKey(txt(peers[i].public_key));
  }
}

void set_key(wire::ReduceKey::Builder out, const reduce_key& k) {
  out.setRound(k.round);
  out.setFragment(k.fragment);
}

reduce_key key_of(wire::ReduceKey::Reader r) {
  return {r.getRound(), r.getFragment()};
}

/// A peer list within max_peers whose texts are within their limits; `what` names the message.
std::optional<rejection> read_peers(capnp::List<wire::Peer>::Reader peers, const char* what,
                                    std::vector<peer_entry>& out) {
  if (peers.size() > max_peers)
    return rejection{reject_reason::bad_size,
                     fmt::format("{} lists {} peers, limit {}", what, peers.size(), max_peers)};
  for (auto p : peers) {
    auto name = p.getName();
    auto ep = p.getEndpoint();
    auto key = p.getPublicKey();
    if (auto bad = check_text(name, max_name_bytes, fmt::format("{} peer name", what).c_str())) return bad;
    if (auto bad = check_text(ep, max_endpoint_bytes, fmt::format("{} peer endpoint", what).c_str()))
      return bad;
    if (auto bad = check_text(key, 40, fmt::format("{} peer key", what).c_str())) return bad;
    auto key_text = text_of(key);
    if (!key_text.empty() && !is_z85_key(key_text))
      return rejection{
          reject_reason::malformed,
          fmt::format("{} peer {}: its public key is not 40 characters of Z85", what, text_of(name))};
    out.push_back(peer_entry{p.getRank(), text_of(name), text_of(ep), std::move(key_text)});
  }
  return std::nullopt;
}

}  // namespace

std::vector<std::byte> build_envelope(const envelope& e) {
  capnp::MallocMessageBuilder mb;
  auto w = mb.initRoot<wire::Envelope>();
  w.setClusterId(e.cluster_id);
  w.setSender(e.sender);
  w.setTerm(e.term);
  auto body = w.initBody();
  struct visitor {
    wire::Envelope::Body::Builder& b;
    void operator()(const hello_msg& m) {
      auto x = b.initHello();
      x.setProtocolVersion(m.protocol_version);
      x.setClusterId(m.cluster_id);
      x.setNodeName(txt(m.node_name));
      x.setNWorkers(m.n_workers);
      x.setDataEndpoint(txt(m.data_endpoint));
      x.setResumeRound(m.resume_round);
      x.setRunning(m.running);
      x.setEpoch(m.epoch);
      x.setWorldSize(m.world_size);
      set_key(x.initCommitted(), m.committed);
      x.setConfigHash(m.config_hash);
      x.setStateEndpoint(txt(m.state_endpoint));
      x.setDataFingerprint(m.data_fingerprint);
      const size_t n = std::min(m.checkpoint_rounds.size(), max_checkpoint_rounds);
      auto rounds = x.initCheckpointRounds(static_cast<unsigned>(n));
      for (size_t i = 0; i < n; ++i)
        rounds.set(static_cast<unsigned>(i), m.checkpoint_rounds[m.checkpoint_rounds.size() - n + i]);
    }
    void operator()(const welcome_msg& m) {
      auto x = b.initWelcome();
      x.setRank(m.rank);
      x.setWorldSize(m.world_size);
      x.setStartRound(m.start_round);
      x.setEpoch(m.epoch);
      set_peers(x.initPeers(static_cast<unsigned>(m.peers.size())), m.peers);
      set_peers(x.initKeys(static_cast<unsigned>(m.keys.size())), m.keys);
    }
    void operator()(const fence_msg& m) { b.initFence().setEpoch(m.epoch); }
    void operator()(const fence_ack_msg& m) {
      auto x = b.initFenceAck();
      x.setEpoch(m.epoch);
      set_key(x.initCommitted(), m.committed);
      x.setHasPending(m.has_pending);
      set_key(x.initPending(), m.pending);
      x.setHaveResult(m.have_result);
    }
    void operator()(const membership_msg& m) {
      auto x = b.initMembership();
      x.setEpoch(m.epoch);
      x.setRank(m.rank);
      set_peers(x.initPeers(static_cast<unsigned>(m.peers.size())), m.peers);
      auto w = x.initWorkers(static_cast<unsigned>(m.workers.size()));
      for (size_t i = 0; i < m.workers.size(); ++i) w.set(static_cast<unsigned>(i), m.workers[i]);
      set_key(x.initCommit(), m.commit);
      set_peers(x.initKeys(static_cast<unsigned>(m.keys.size())), m.keys);
    }
    void operator()(const leave_msg& m) { b.initLeave().setNode(txt(m.node)); }
    void operator()(const stop_msg& m) { b.initStop().setRound(m.round); }
    void operator()(const pin_msg& m) {
      auto x = b.initPin();
      x.setRound(m.round);
      x.setRelease(m.release);
    }
    void operator()(const committed_msg& m) {
      auto x = b.initCommitted();
      x.setRound(m.round);
      x.setThetaCrc(m.theta_crc);
    }
    void operator()(const recover_msg& m) {
      auto x = b.initRecover();
      x.setEpoch(m.epoch);
      set_peers(x.initSources(static_cast<unsigned>(m.sources.size())), m.sources);
      x.setNote(txt(m.note));
      x.setRound(m.round);
      x.setWorkerOffset(m.worker_offset);
    }
    void operator()(const join_ready_msg& m) {
      auto x = b.initJoinReady();
      set_key(x.initKey(), m.key);
      x.setRound(m.round);
    }
    void operator()(const ring_failed_msg& m) {
      auto x = b.initRingFailed();
      x.setEpoch(m.epoch);
      x.setSuspect(txt(m.suspect));
      x.setReason(txt(m.reason));
    }
    void operator()(const round_start_msg& m) {
      auto x = b.initRoundStart();
      x.setRound(m.round);
      x.setFragment(m.fragment);
      x.setNElements(m.n_elements);
      x.setDtype(to_wire(m.dtype));
    }
    void operator()(const heartbeat_msg& m) {
      auto x = b.initHeartbeat();
      x.setRound(m.round);
      x.setUnixMillis(m.unix_millis);
      x.setEpoch(m.epoch);
    }
    void operator()(const done_msg& m) {
      auto x = b.initDone();
      x.setRound(m.round);
      x.setFragment(m.fragment);
    }
    void operator()(const error_msg& m) {
      auto x = b.initError();
      x.setCode(m.code);
      x.setMessage(txt(m.message));
    }
    void operator()(const bye_msg& m) { b.initBye().setReason(txt(m.reason)); }
  };
  std::visit(visitor{body}, e.body);
  return flat_bytes(mb);
}

frame_result<envelope> parse_envelope(const void* data, size_t size, uint64_t expected_cluster_id) {
  auto framed = check_framing(data, size, max_envelope_bytes, "envelope");
  if (!framed) return framed.error();
  const auto& words = framed.value().words;
  envelope out;
  std::optional<rejection> bad;
  try {
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(words.begin(), words.size()),
                                         reader_options(words.size(), 8));
    auto r = reader.getRoot<wire::Envelope>();
    out.cluster_id = r.getClusterId();
    out.sender = r.getSender();
    out.term = r.getTerm();
    if (out.cluster_id != expected_cluster_id)
      return reject(reject_reason::wrong_cluster, fmt::format("cluster id {:#x}, this node is in {:#x}",
                                                              out.cluster_id, expected_cluster_id));
    auto b = r.getBody();
    switch (b.which()) {
      case wire::Envelope::Body::HELLO: {
        auto x = b.getHello();
        hello_msg m;
        m.protocol_version = x.getProtocolVersion();
        m.cluster_id = x.getClusterId();
        m.n_workers = x.getNWorkers();
        m.resume_round = x.getResumeRound();
        m.running = x.getRunning();
        m.epoch = x.getEpoch();
        m.world_size = x.getWorldSize();
        m.committed = key_of(x.getCommitted());
        m.config_hash = x.getConfigHash();
        m.data_fingerprint = x.getDataFingerprint();
        const auto rounds = x.getCheckpointRounds();
        if (rounds.size() > max_checkpoint_rounds) {
          bad = reject(reject_reason::bad_size, fmt::format("hello checkpointRounds has {} entries, limit {}",
                                                            rounds.size(), max_checkpoint_rounds));
          break;
        }
        for (const auto r : rounds) m.checkpoint_rounds.push_back(r);
        auto name = x.getNodeName();
        auto ep = x.getDataEndpoint();
        auto state_ep = x.getStateEndpoint();
        if ((bad = check_text(name, max_name_bytes, "hello nodeName"))) break;
        if ((bad = check_text(ep, max_endpoint_bytes, "hello dataEndpoint"))) break;
        if ((bad = check_text(state_ep, max_endpoint_bytes, "hello stateEndpoint"))) break;
        m.node_name = text_of(name);
        m.data_endpoint = text_of(ep);
        m.state_endpoint = text_of(state_ep);
        out.body = std::move(m);
        break;
      }
      case wire::Envelope::Body::WELCOME: {
        auto x = b.getWelcome();
        welcome_msg m;
        m.rank = x.getRank();
        m.world_size = x.getWorldSize();
        m.start_round = x.getStartRound();
        m.epoch = x.getEpoch();
        if ((bad = read_peers(x.getPeers(), "welcome", m.peers))) break;
        if ((bad = read_peers(x.getKeys(), "welcome keys", m.keys))) break;
        out.body = std::move(m);
        break;
      }
      case wire::Envelope::Body::FENCE: out.body = fence_msg{b.getFence().getEpoch()}; break;
      case wire::Envelope::Body::FENCE_ACK: {
        auto x = b.getFenceAck();
        out.body = fence_ack_msg{x.getEpoch(), key_of(x.getCommitted()), x.getHasPending(),
                                 key_of(x.getPending()), x.getHaveResult()};
        break;
      }
      case wire::Envelope::Body::MEMBERSHIP: {
        auto x = b.getMembership();
        membership_msg m;
        m.epoch = x.getEpoch();
        m.rank = x.getRank();
        m.commit = key_of(x.getCommit());
        if ((bad = read_peers(x.getPeers(), "membership", m.peers))) break;
        if ((bad = read_peers(x.getKeys(), "membership keys", m.keys))) break;
        auto w = x.getWorkers();
        if (w.size() != m.peers.size() || m.rank >= m.peers.size()) {
          bad = reject(reject_reason::bad_size,
                       fmt::format("membership of {} peers has {} worker counts and rank {}", m.peers.size(),
                                   w.size(), m.rank));
          break;
        }
        for (auto v : w) m.workers.push_back(v);
        out.body = std::move(m);
        break;
      }
      case wire::Envelope::Body::LEAVE: {
        auto node = b.getLeave().getNode();
        if ((bad = check_text(node, max_name_bytes, "leave node"))) break;
        out.body = leave_msg{text_of(node)};
        break;
      }
      case wire::Envelope::Body::STOP: out.body = stop_msg{b.getStop().getRound()}; break;
      case wire::Envelope::Body::PIN:
        out.body = pin_msg{b.getPin().getRound(), b.getPin().getRelease()};
        break;
      case wire::Envelope::Body::COMMITTED:
        out.body = committed_msg{b.getCommitted().getRound(), b.getCommitted().getThetaCrc()};
        break;
      case wire::Envelope::Body::RECOVER: {
        auto x = b.getRecover();
        recover_msg m;
        m.epoch = x.getEpoch();
        m.round = x.getRound();
        m.worker_offset = x.getWorkerOffset();
        auto note = x.getNote();
        if ((bad = check_text(note, max_message_bytes, "recover note"))) break;
        m.note = text_of(note);
        if ((bad = read_peers(x.getSources(), "recover", m.sources))) break;
        out.body = std::move(m);
        break;
      }
      case wire::Envelope::Body::JOIN_READY: {
        auto x = b.getJoinReady();
        out.body = join_ready_msg{key_of(x.getKey()), x.getRound()};
        break;
      }
      case wire::Envelope::Body::RING_FAILED: {
        auto x = b.getRingFailed();
        auto suspect = x.getSuspect();
        auto reason = x.getReason();
        if ((bad = check_text(suspect, max_name_bytes, "ringFailed suspect"))) break;
        if ((bad = check_text(reason, max_message_bytes, "ringFailed reason"))) break;
        out.body = ring_failed_msg{x.getEpoch(), text_of(suspect), text_of(reason)};
        break;
      }
      case wire::Envelope::Body::ROUND_START: {
        auto x = b.getRoundStart();
        const auto dt = static_cast<uint16_t>(x.getDtype());
        if (!known_dtype(dt)) {
          bad = reject(reject_reason::bad_dtype, fmt::format("roundStart has unknown dtype {}", dt));
          break;
        }
        out.body =
            round_start_msg{x.getRound(), x.getFragment(), x.getNElements(), static_cast<wire_dtype>(dt)};
        break;
      }
      case wire::Envelope::Body::HEARTBEAT: {
        auto x = b.getHeartbeat();
        out.body = heartbeat_msg{x.getRound(), x.getUnixMillis(), x.getEpoch()};
        break;
      }
      case wire::Envelope::Body::DONE: {
        auto x = b.getDone();
        out.body = done_msg{x.getRound(), x.getFragment()};
        break;
      }
      case wire::Envelope::Body::ERROR: {
        auto x = b.getError();
        auto msg = x.getMessage();
        if ((bad = check_text(msg, max_message_bytes, "error message"))) break;
        out.body = error_msg{x.getCode(), text_of(msg)};
        break;
      }
      case wire::Envelope::Body::BYE: {
        auto reason = b.getBye().getReason();
        if ((bad = check_text(reason, max_message_bytes, "bye reason"))) break;
        out.body = bye_msg{text_of(reason)};
        break;
      }
      default:
        bad = reject(reject_reason::malformed, fmt::format("envelope carries unknown message kind {}",
                                                           static_cast<unsigned>(b.which())));
    }
  } catch (const kj::Exception& e) {
    return reject(reject_reason::malformed, "envelope does not decode: " + kj_text(e));
  }
  if (bad) return *bad;
  return out;
}

}  // namespace longwave::comm
