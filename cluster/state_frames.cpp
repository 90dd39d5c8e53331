// State transfer's frames (see state_frames.hpp): requests and replies checked before use, every Cap'n Proto
// (kj) exception turned into a refusal.
#include "cluster/state_frames.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fmt/format.h>

#include <kj/exception.h>
#include <algorithm>

#include "cluster/envelope.hpp"
#include "cluster/state.capnp.h"
#include "comm/capnp_frame.hpp"

namespace longwave::cluster {

namespace {

constexpr size_t max_parts = 3;  // a reply is at most [header][payload]; a request [routing id][request]

zmq::message_t flat_message(capnp::MallocMessageBuilder& mb) {
  auto words = capnp::messageToFlatArray(mb);
  auto bytes = words.asBytes();
  return zmq::message_t(bytes.begin(), bytes.size());
}

}  // namespace

std::string key_text(const reduce_key& k) {
  return fmt::format("(round {}, fragment {})", k.round, k.fragment);
}

std::string mib(uint64_t b) {
  return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20));
}

bool recv_message(zmq::socket_t& sock, std::vector<zmq::message_t>& parts, size_t& n_parts) {
  parts.clear();
  n_parts = 0;
  zmq::message_t m;
  if (!sock.recv(m, zmq::recv_flags::dontwait)) return false;
  for (;;) {
    ++n_parts;
    const bool more = m.more();
    if (parts.size() < max_parts) parts.push_back(std::move(m));
    if (!more) return true;
    m = zmq::message_t();
    (void)sock.recv(m, zmq::recv_flags::none);  // the rest of a message arrives with its first frame
  }
}

zmq::message_t build_request(const state_request& r) {
  capnp::MallocMessageBuilder mb(16);
  auto w = mb.initRoot<wire::StateRequest>();
  w.setProtocolVersion(comm::wire::PROTOCOL_VERSION);
  w.setClusterId(r.cluster_id);
  w.setKind(r.chunk ? wire::StateRequestKind::CHUNK : wire::StateRequestKind::OFFER);
  w.setRequestId(r.request_id);
  auto k = w.initKey();
  k.setRound(r.key.round);
  k.setFragment(r.key.fragment);
  w.setOffset(r.offset);
  w.setLength(r.length);
  return flat_message(mb);
}

std::optional<std::string> parse_request(const void* data, size_t size, state_request& out) {
  auto framed = comm::check_framing(data, size, max_state_request_bytes, "state request");
  if (!framed) return framed.error().detail;
  const auto& words = framed.value().words;
  uint16_t version = 0, kind = 0;
  try {
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(words.begin(), words.size()),
                                         comm::reader_options(words.size(), 8));
    auto r = reader.getRoot<wire::StateRequest>();
    version = r.getProtocolVersion();
    out.cluster_id = r.getClusterId();
    kind = static_cast<uint16_t>(r.getKind());
    out.request_id = r.getRequestId();
    out.key = {r.getKey().getRound(), r.getKey().getFragment()};
    out.offset = r.getOffset();
    out.length = r.getLength();
  } catch (const kj::Exception& e) {
    return "request does not decode: " + comm::kj_text(e);
  }
  if (version != comm::wire::PROTOCOL_VERSION)
    return fmt::format("protocol version {}, this server speaks {}", version, comm::wire::PROTOCOL_VERSION);
  if (kind > static_cast<uint16_t>(wire::StateRequestKind::CHUNK))
    return fmt::format("unknown kind {}", kind);
  out.chunk = kind == static_cast<uint16_t>(wire::StateRequestKind::CHUNK);
  return std::nullopt;
}

zmq::message_t build_reply(const state_reply& r) {
  capnp::MallocMessageBuilder mb(r.status == state_status::offer ? 1024 : 64);
  auto w = mb.initRoot<wire::StateReply>();
  w.setProtocolVersion(comm::wire::PROTOCOL_VERSION);
  w.setClusterId(r.cluster_id);
  w.setStatus(static_cast<wire::StateStatus>(r.status));
  w.setRequestId(r.request_id);
  switch (r.status) {
    case state_status::offer: {
      auto offers = w.initOffers(static_cast<unsigned>(r.offers.size()));
      for (unsigned i = 0; i < r.offers.size(); ++i) {
        const auto& p = r.offers[i];
        auto o = offers[i];
        o.initKey().setRound(p.key.round);
        o.getKey().setFragment(p.key.fragment);
        o.setRound(p.round);
        o.setTotalBytes(p.total);
        o.setChecksum(p.checksum);
        o.setBlockBytes(p.block_bytes);
        auto sums = o.initBlockChecksums(static_cast<unsigned>(p.block_checksums.size()));
        for (unsigned b = 0; b < p.block_checksums.size(); ++b) sums.set(b, p.block_checksums[b]);
      }
      break;
    }
    case state_status::chunk:
      w.initKey().setRound(r.key.round);
      w.getKey().setFragment(r.key.fragment);
      w.setOffset(r.offset);
      w.setLength(r.length);
      w.setChecksum(r.checksum);
      break;
    default: w.setMessage(capnp::Text::Reader(r.message.c_str(), r.message.size()));
  }
  return flat_message(mb);
}

std::optional<std::string> parse_reply(const void* data, size_t size, state_reply& out) {
  auto framed = comm::check_framing(data, size, max_state_reply_bytes, "state reply");
  if (!framed) return framed.error().detail;
  const auto& words = framed.value().words;
  uint16_t version = 0, status = 0;
  try {
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(words.begin(), words.size()),
                                         comm::reader_options(words.size(), 8));
    auto r = reader.getRoot<wire::StateReply>();
    version = r.getProtocolVersion();
    out.cluster_id = r.getClusterId();
    status = static_cast<uint16_t>(r.getStatus());
    out.request_id = r.getRequestId();
    out.key = {r.getKey().getRound(), r.getKey().getFragment()};
    out.offset = r.getOffset();
    out.length = r.getLength();
    out.checksum = r.getChecksum();
    auto text = r.getMessage();
    out.message.assign(text.cStr(), std::min<size_t>(text.size(), max_message_bytes));
    auto offers = r.getOffers();
    if (offers.size() > max_state_offers)
      return fmt::format("{} offers, limit {}", offers.size(), max_state_offers);
    for (auto o : offers) {
      offer_info info;
      info.key = {o.getKey().getRound(), o.getKey().getFragment()};
      info.round = o.getRound();
      info.total = o.getTotalBytes();
      info.checksum = o.getChecksum();
      info.block_bytes = o.getBlockBytes();
      auto sums = o.getBlockChecksums();
      if (info.block_bytes == 0 || info.block_bytes > max_state_chunk_bytes)
        return fmt::format("offer of {} has a block size of {} bytes", key_text(info.key), info.block_bytes);
      const uint64_t n_blocks = info.total / info.block_bytes + (info.total % info.block_bytes != 0);
      if (n_blocks > max_state_blocks || sums.size() != n_blocks)
        return fmt::format("offer of {} lists {} block checksums for {} bytes in blocks of {}",
                           key_text(info.key), sums.size(), info.total, info.block_bytes);
      info.block_checksums.reserve(sums.size());
      for (auto c : sums) info.block_checksums.push_back(c);
      out.offers.push_back(std::move(info));
    }
  } catch (const kj::Exception& e) {
    return "reply does not decode: " + comm::kj_text(e);
  }
  if (version != comm::wire::PROTOCOL_VERSION)
    return fmt::format("protocol version {}, this node speaks {}", version, comm::wire::PROTOCOL_VERSION);
  if (status > static_cast<uint16_t>(wire::StateStatus::BAD_REQUEST))
    return fmt::format("unknown status {}", status);
  out.status = static_cast<state_status>(status);
  return std::nullopt;
}

std::optional<std::string> check_state_request(const void* data, size_t size) {
  state_request r;
  return parse_request(data, size, r);
}

std::optional<std::string> check_state_reply(const void* data, size_t size) {
  state_reply r;
  return parse_reply(data, size, r);
}

}  // namespace longwave::cluster
