// State transfer (see state_transfer.hpp). The server answers on one thread from a ROUTER socket; chunks go
// out as zero-copy ZeroMQ frames that hold a reference to the published blob. The fetcher drives one DEALER
// per peer from a single poll loop: a queue of chunks, a window of requests per peer, and a peer that errs
// has its chunks put back at the front of the queue.
#include "comm/state_transfer.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fmt/format.h>

#include <kj/array.h>
#include <kj/exception.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <zmq.hpp>

#include "comm/control_common.hpp"
#include "comm/wire.capnp.h"
#include "comm/zmq_monitor.hpp"
#include "runtime/checksum/crc32c.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::comm {

using runtime::crc32c;
using clock = std::chrono::steady_clock;

namespace {

using bytes_ptr = std::shared_ptr<const std::vector<std::byte>>;

// A state is checksummed in blocks: 1 MiB, doubled until a state has at most this many.
constexpr uint64_t min_block_bytes = 1u << 20;
constexpr uint64_t max_blocks_chosen = 1u << 16;
constexpr size_t max_offers = 8;
constexpr size_t max_parts = 3;  // a reply is at most [header][payload]; a request [routing id][request]
constexpr auto poll_slice = std::chrono::milliseconds(50);
// Offers are awaited from every peer, but no longer than this after the first one arrived: a dead peer does
// not hold the download up (its offer is still taken if it comes later).
constexpr auto offer_grace = std::chrono::milliseconds(500);

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

std::string key_text(const reduce_key& k) {
  return fmt::format("(round {}, fragment {})", k.round, k.fragment);
}

std::string mib(uint64_t b) {
  return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20));
}

// Reads one message of at most max_parts frames; further frames are read and discarded, so a peer cannot
// make us hold an unbounded number of them. n_parts counts them all.
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

// The framing checks Cap'n Proto would otherwise report as exceptions (as in frame.cpp): length a multiple of
// 8 and within the limit, and a segment table that accounts for exactly the frame. Copies into aligned words.
std::optional<std::string> check_framing(const void* data, size_t size, size_t max_bytes,
                                         kj::Array<capnp::word>& words) {
  if (size < 8 || size > max_bytes || size % 8 != 0)
    return fmt::format("frame of {} bytes (needs a multiple of 8, from 8 to {})", size, max_bytes);
  words = kj::heapArray<capnp::word>(size / 8);
  std::memcpy(words.begin(), data, size);
  const auto* bytes = reinterpret_cast<const unsigned char*>(words.begin());
  uint32_t first = 0;
  std::memcpy(&first, bytes, 4);
  const uint64_t n_segments = uint64_t{first} + 1;
  if (n_segments > 16) return fmt::format("frame declares {} segments", n_segments);
  const uint64_t table_words = (4 + 4 * n_segments + 7) / 8;
  if (table_words > words.size()) return std::string("frame is shorter than its segment table");
  uint64_t body_words = 0;
  for (uint64_t s = 0; s < n_segments; ++s) {
    uint32_t w = 0;
    std::memcpy(&w, bytes + 4 + 4 * s, 4);
    body_words += w;
  }
  if (body_words == 0 || table_words + body_words != words.size())
    return fmt::format("frame of {} bytes disagrees with its segment table ({} words)", size,
                       table_words + body_words);
  return std::nullopt;
}

capnp::ReaderOptions reader_options(size_t words) {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = 4 * words + 64;
  o.nestingLimit = 8;
  return o;
}

zmq::message_t flat_message(capnp::MallocMessageBuilder& mb) {
  auto words = capnp::messageToFlatArray(mb);
  auto bytes = words.asBytes();
  return zmq::message_t(bytes.begin(), bytes.size());
}

// ---- requests ----

struct state_request {
  uint64_t cluster_id = 0;
  bool chunk = false;
  uint64_t request_id = 0;
  reduce_key key;
  uint64_t offset = 0;
  uint64_t length = 0;
};

zmq::message_t build_request(const state_request& r) {
  capnp::MallocMessageBuilder mb(16);
  auto w = mb.initRoot<wire::StateRequest>();
  w.setProtocolVersion(wire::PROTOCOL_VERSION);
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
  kj::Array<capnp::word> words;
  if (auto bad = check_framing(data, size, max_state_request_bytes, words)) return bad;
  uint16_t version = 0, kind = 0;
  try {
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(words.begin(), words.size()),
                                         reader_options(words.size()));
    auto r = reader.getRoot<wire::StateRequest>();
    version = r.getProtocolVersion();
    out.cluster_id = r.getClusterId();
    kind = static_cast<uint16_t>(r.getKind());
    out.request_id = r.getRequestId();
    out.key = {r.getKey().getRound(), r.getKey().getFragment()};
    out.offset = r.getOffset();
    out.length = r.getLength();
  } catch (const kj::Exception& e) {
    return "request does not decode: " + std::string(e.getDescription().cStr());
  }
  if (version != wire::PROTOCOL_VERSION)
    return fmt::format("protocol version {}, this server speaks {}", version, wire::PROTOCOL_VERSION);
  if (kind > static_cast<uint16_t>(wire::StateRequestKind::CHUNK))
    return fmt::format("unknown kind {}", kind);
  out.chunk = kind == static_cast<uint16_t>(wire::StateRequestKind::CHUNK);
  return std::nullopt;
}

// ---- replies ----

struct state_reply {
  uint64_t cluster_id = 0;
  wire::StateStatus status = wire::StateStatus::BAD_REQUEST;
  uint64_t request_id = 0;
  std::vector<offer_info> offers;
  reduce_key key;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t checksum = 0;
  std::string message;
};

std::optional<std::string> parse_reply(const void* data, size_t size, state_reply& out) {
  kj::Array<capnp::word> words;
  if (auto bad = check_framing(data, size, max_state_reply_bytes, words)) return bad;
  uint16_t version = 0, status = 0;
  try {
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(words.begin(), words.size()),
                                         reader_options(words.size()));
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
    if (offers.size() > max_offers) return fmt::format("{} offers, limit {}", offers.size(), max_offers);
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
    return "reply does not decode: " + std::string(e.getDescription().cStr());
  }
  if (version != wire::PROTOCOL_VERSION)
    return fmt::format("protocol version {}, this node speaks {}", version, wire::PROTOCOL_VERSION);
  if (status > static_cast<uint16_t>(wire::StateStatus::BAD_REQUEST))
    return fmt::format("unknown status {}", status);
  out.status = static_cast<wire::StateStatus>(status);
  return std::nullopt;
}

}  // namespace

std::optional<std::string> check_state_request(const void* data, size_t size) {
  state_request r;
  return parse_request(data, size, r);
}

std::optional<std::string> check_state_reply(const void* data, size_t size) {
  state_reply r;
  return parse_reply(data, size, r);
}

// ---- server ----

struct state_server::published {
  reduce_key key;
  uint64_t round = 0;
  bytes_ptr bytes;
  // Computed on the server thread the first time a joiner asks; only that thread touches them.
  bool summed = false;
  uint32_t checksum = 0;
  uint64_t block_bytes = 0;
  std::vector<uint32_t> block_checksums;

  void sum() {
    if (summed) return;
    const uint64_t total = bytes->size();
    block_bytes = min_block_bytes;
    while (total / block_bytes >= max_blocks_chosen && block_bytes < max_state_chunk_bytes) block_bytes *= 2;
    const auto* p = bytes->data();
    for (uint64_t off = 0; off < total; off += block_bytes)
      block_checksums.push_back(crc32c(p + off, std::min(block_bytes, total - off)));
    checksum = crc32c(p, total);
    summed = true;
  }
};

struct state_server::sockets {
  zmq::context_t ctx{1};
  zmq::socket_t router{ctx, zmq::socket_type::router};
  std::unique_ptr<zap_handler> zap;  // CURVE: closed before the context
};

state_server::state_server(const std::string& bind_endpoint, uint64_t cluster_id,
                           std::optional<curve_server_keys> curve)
    : cluster_id_(cluster_id), sockets_(std::make_unique<sockets>()) {
  auto& r = sockets_->router;
  try {
    if (curve) {
      sockets_->zap = std::make_unique<zap_handler>(sockets_->ctx, curve->admitted, curve->on_refused);
      make_curve_server(r, curve->own);
    }
    r.set(zmq::sockopt::linger, 0);
    r.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_state_request_bytes));
    // No send limit: a queued chunk holds only a reference to its blob (zero-copy), and each joiner keeps a
    // bounded window of requests. With a limit, ROUTER would silently drop replies to a slow joiner.
    r.set(zmq::sockopt::sndhwm, 0);
    r.bind(bind_endpoint);
    endpoint_ = r.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    throw lw_error(errc::io_error, fmt::format("state server: cannot bind {}: {}", bind_endpoint, e.what()));
  }
  // The socket moves to the server thread here (thread start is a full barrier) and stays there.
  thread_ = std::thread([this] { run(); });
}

state_server::~state_server() {
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
}

void state_server::publish(reduce_key key, uint64_t round, bytes_ptr bytes) {
  LW_ASSERT(bytes != nullptr, "state_server::publish without bytes");
  auto p = std::make_shared<published>();
  p->key = key;
  p->round = round;
  p->bytes = std::move(bytes);
  std::shared_ptr<published> dropped;  // released outside the lock
  std::lock_guard<std::mutex> lk(mu_);
  held_.insert(held_.begin(), std::move(p));
  if (held_.size() > max_held_states) {
    dropped = std::move(held_.back());
    held_.pop_back();
  }
}

uint64_t state_server::rejected_total() const {
  uint64_t n = 0;
  for (const auto& r : rejected_) n += r.load(std::memory_order_relaxed);
  return n;
}

void state_server::run() {
  auto& router = sockets_->router;
  const auto count = [this](state_reject why) {
    rejected_[static_cast<size_t>(why)].fetch_add(1, std::memory_order_relaxed);
  };
  // Sends [identity][header] or [identity][header][payload]; a joiner gone meanwhile is dropped by ROUTER.
  const auto send = [&](zmq::message_t& identity, capnp::MallocMessageBuilder& mb, zmq::message_t* payload) {
    zmq::message_t id;
    id.copy(identity);
    auto header = flat_message(mb);
    try {
      (void)router.send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      (void)router.send(
          header, payload ? zmq::send_flags::sndmore | zmq::send_flags::dontwait : zmq::send_flags::dontwait);
      if (payload) (void)router.send(*payload, zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
      // EHOSTUNREACH and the like: the joiner is gone
    }
  };
  const auto reply = [&](zmq::message_t& identity, wire::StateStatus status, uint64_t request_id,
                         const std::string& message) {
    capnp::MallocMessageBuilder mb(64);
    auto w = mb.initRoot<wire::StateReply>();
    w.setProtocolVersion(wire::PROTOCOL_VERSION);
    w.setClusterId(cluster_id_);
    w.setStatus(status);
    w.setRequestId(request_id);
    w.setMessage(capnp::Text::Reader(message.c_str(), message.size()));
    send(identity, mb, nullptr);
  };

  std::vector<zmq::message_t> parts;
  size_t n_parts = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    try {
      if (!control::readable(router, poll_slice)) continue;
    } catch (const zmq::error_t& e) {
      std::fprintf(stderr, "longwave state server: poll failed: %s\n", e.what());
      return;
    }
    for (int budget = 0; budget < 256 && !stop_.load(std::memory_order_acquire); ++budget) {
      try {
        if (!recv_message(router, parts, n_parts)) break;
      } catch (const zmq::error_t&) {
        break;  // EINTR: poll again
      }
      if (n_parts != 2) {
        count(state_reject::bad_framing);
        if (n_parts > 1)
          reply(parts[0], wire::StateStatus::BAD_REQUEST, 0,
                fmt::format("a request is one frame, this message has {}", n_parts - 1));
        continue;
      }
      state_request req;
      if (auto bad = parse_request(parts[1].data(), parts[1].size(), req)) {
        count(state_reject::malformed);
        reply(parts[0], wire::StateStatus::BAD_REQUEST, 0, *bad);
        continue;
      }
      if (req.cluster_id != cluster_id_) {
        count(state_reject::wrong_cluster);
        reply(parts[0], wire::StateStatus::REFUSED, req.request_id,
              fmt::format("this server belongs to cluster {}, the request to cluster {}", cluster_id_,
                          req.cluster_id));
        continue;
      }
      std::vector<std::shared_ptr<published>> held;
      {
        std::lock_guard<std::mutex> lk(mu_);
        held = held_;
      }
      if (!req.chunk) {
        capnp::MallocMessageBuilder mb;
        auto w = mb.initRoot<wire::StateReply>();
        w.setProtocolVersion(wire::PROTOCOL_VERSION);
        w.setClusterId(cluster_id_);
        w.setStatus(wire::StateStatus::OFFER);
        w.setRequestId(req.request_id);
        const auto n = static_cast<unsigned>(held.size());
        auto offers = w.initOffers(n);
        for (unsigned i = 0; i < n; ++i) {
          auto& p = *held[i];
          p.sum();
          auto o = offers[i];
          o.initKey().setRound(p.key.round);
          o.getKey().setFragment(p.key.fragment);
          o.setRound(p.round);
          o.setTotalBytes(p.bytes->size());
          o.setChecksum(p.checksum);
          o.setBlockBytes(p.block_bytes);
          auto sums = o.initBlockChecksums(static_cast<unsigned>(p.block_checksums.size()));
          for (unsigned b = 0; b < p.block_checksums.size(); ++b) sums.set(b, p.block_checksums[b]);
        }
        send(parts[0], mb, nullptr);
        continue;
      }
      published* p = nullptr;
      for (auto& h : held)
        if (h && h->key == req.key) p = h.get();
      if (!p) {
        count(state_reject::gone);
        reply(parts[0], wire::StateStatus::GONE, req.request_id,
              fmt::format("state {} is not held here (newest: {})", key_text(req.key),
                          held.empty() ? std::string("none") : key_text(held[0]->key)));
        continue;
      }
      p->sum();
      const uint64_t total = p->bytes->size();
      if (req.length == 0 || req.length > max_state_chunk_bytes || req.offset > total ||
          req.length > total - req.offset || req.offset % p->block_bytes != 0) {
        count(state_reject::bad_range);
        reply(parts[0], wire::StateStatus::BAD_REQUEST, req.request_id,
              fmt::format("chunk [{}, +{}) is not within the {} bytes of {} in blocks of {} (at most {} "
                          "bytes a chunk)",
                          req.offset, req.length, total, key_text(p->key), p->block_bytes,
                          max_state_chunk_bytes));
        continue;
      }
      const auto* data = p->bytes->data() + req.offset;
      const auto len = static_cast<size_t>(req.length);
      // Zero-copy: the frame keeps the blob alive until ZeroMQ has sent it, even if it is unpublished.
      auto* keep = new bytes_ptr(p->bytes);
      zmq::message_t payload(
          const_cast<std::byte*>(data), len, [](void*, void* hint) { delete static_cast<bytes_ptr*>(hint); },
          keep);
      capnp::MallocMessageBuilder mb(32);
      auto w = mb.initRoot<wire::StateReply>();
      w.setProtocolVersion(wire::PROTOCOL_VERSION);
      w.setClusterId(cluster_id_);
      w.setStatus(wire::StateStatus::CHUNK);
      w.setRequestId(req.request_id);
      w.initKey().setRound(p->key.round);
      w.getKey().setFragment(p->key.fragment);
      w.setOffset(req.offset);
      w.setLength(req.length);
      w.setChecksum(crc32c(data, len));
      send(parts[0], mb, &payload);
      bytes_served_.fetch_add(req.length, std::memory_order_relaxed);
    }
  }
}

// ---- fetcher ----

namespace {

enum class peer_phase {
  asking,   // offer requested, no answer yet
  offered,  // answered; not (yet) a source
  source,   // offers the chosen state: chunks are requested from it
  dropped,  // failed or left out; its socket is closed
};

enum class drop_kind { none, io, malformed, wrong_cluster, stalled, no_state };

struct peer_conn {
  std::string endpoint;
  std::unique_ptr<zmq::socket_t> sock, monitor;
  peer_phase phase = peer_phase::asking;
  std::vector<offer_info> offers;
  std::map<uint64_t, size_t> outstanding;  // request id -> chunk index
  clock::time_point last_heard;
  uint64_t bytes = 0;
  drop_kind why = drop_kind::none;
  std::string cause;
};

class fetcher {
 public:
  fetcher(const std::vector<std::string>& peers, uint64_t cluster_id, const fetch_options& opts)
      : cluster_id_(cluster_id), opts_(opts) {
    peer_stall_ = opts.peer_stall.count() > 0
                      ? opts.peer_stall
                      : std::max<std::chrono::milliseconds>(std::chrono::seconds(1), opts.timeout / 3);
    peers_.resize(peers.size());
    for (size_t i = 0; i < peers.size(); ++i) peers_[i].endpoint = peers[i];
  }

  ~fetcher() {
    // Stop the monitors first, so closing the DEALERs does not wait on them.
    for (auto& p : peers_)
      if (p.monitor) {
        zmq_socket_monitor(p.sock->handle(), nullptr, 0);
        p.monitor.reset();
      }
  }
  fetcher(const fetcher&) = delete;
  fetcher& operator=(const fetcher&) = delete;

  fetched_state run() {
    const auto start = clock::now();
    last_progress_ = start;
    if (peers_.empty()) throw lw_error(errc::peer_lost, "state transfer: no peers to fetch the state from");
    for (size_t i = 0; i < peers_.size(); ++i) open(i);
    auto next_tick = start + std::chrono::seconds(1);
    while (!done()) {
      step();
      const auto now = clock::now();
      if (now - last_progress_ > opts_.timeout) fail_deadline();
      if (opts_.tick && now >= next_tick) {
        next_tick = now + std::chrono::seconds(1);
        opts_.tick();
      }
    }
    fetched_state out;
    out.key = chosen_->key;
    out.round = chosen_->round;
    const uint32_t sum = crc32c(buffer_.data(), buffer_.size());
    if (sum != chosen_->checksum)
      throw lw_error(
          errc::malformed_frame,
          fmt::format("state transfer: state {} has CRC-32C {:08x} though its blocks match the offer "
                      "of {}, which announced {:08x}",
                      key_text(chosen_->key), sum, sources_text(), chosen_->checksum));
    report_progress(true);
    out.bytes = std::move(buffer_);
    out.seconds = std::chrono::duration<double>(clock::now() - start).count();
    for (auto& p : peers_) {
      out.bytes_per_peer.push_back(p.bytes);
      if (p.phase == peer_phase::dropped || (p.phase != peer_phase::source && !p.cause.empty()))
        out.dropped.push_back(p.endpoint + ": " + p.cause);
    }
    return out;
  }

 private:
  void open(size_t i) {
    auto& p = peers_[i];
    p.sock = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
    p.sock->set(zmq::sockopt::linger, 0);
    p.sock->set(zmq::sockopt::maxmsgsize,
                static_cast<int64_t>(std::max<uint64_t>(max_state_chunk_bytes, max_state_reply_bytes)));
    if (opts_.curve) {
      if (i >= opts_.peer_keys.size() || !is_z85_key(opts_.peer_keys[i])) {
        drop(i, drop_kind::io, "no CURVE public key for this peer");
        return;
      }
      make_curve_client(*p.sock, *opts_.curve, opts_.peer_keys[i]);
    }
    const auto monitor_endpoint = fmt::format("inproc://longwave-state-fetch-{}", i);
    if (zmq_socket_monitor(p.sock->handle(), monitor_endpoint.c_str(),
                           ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) == 0) {
      p.monitor = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::pair);
      p.monitor->set(zmq::sockopt::linger, 0);
      p.monitor->connect(monitor_endpoint);
    }
    try {
      p.sock->connect(p.endpoint);
    } catch (const zmq::error_t& e) {
      drop(i, drop_kind::io, fmt::format("cannot connect: {}", e.what()));
      return;
    }
    p.last_heard = clock::now();
    state_request r;
    r.cluster_id = cluster_id_;
    r.request_id = next_request_++;
    send(i, r);
  }

  bool send(size_t i, const state_request& r) {
    auto m = build_request(r);
    try {
      return peers_[i].sock->send(m, zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t& e) {
      drop(i, drop_kind::io, fmt::format("send failed: {}", e.what()));
      return false;
    }
  }

  void drop(size_t i, drop_kind why, std::string cause) {
    auto& p = peers_[i];
    if (p.phase == peer_phase::dropped) return;
    p.phase = peer_phase::dropped;
    p.why = why;
    p.cause = std::move(cause);
    for (auto it = p.outstanding.rbegin(); it != p.outstanding.rend(); ++it) {
      pending_.push_front(it->second);  // the oldest first
    }
    p.outstanding.clear();
    if (p.monitor) {
      zmq_socket_monitor(p.sock->handle(), nullptr, 0);
      p.monitor.reset();
    }
    p.sock.reset();
  }

  bool done() const { return chosen_ && n_done_ == n_chunks_; }

  // One poll over every open socket and monitor, then the replies, the choice, the requests and the clocks.
  void step() {
    std::vector<zmq::pollitem_t> items;
    std::vector<std::pair<size_t, bool>> owner;  // peer, is its monitor
    for (size_t i = 0; i < peers_.size(); ++i) {
      auto& p = peers_[i];
      if (p.phase == peer_phase::dropped) continue;
      items.push_back({static_cast<void*>(*p.sock), 0, ZMQ_POLLIN, 0});
      owner.emplace_back(i, false);
      if (p.monitor) {
        items.push_back({static_cast<void*>(*p.monitor), 0, ZMQ_POLLIN, 0});
        owner.emplace_back(i, true);
      }
    }
    if (!items.empty()) {
      try {
        zmq::poll(items.data(), items.size(), poll_slice);
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR)
          throw lw_error(errc::io_error, fmt::format("state transfer: poll: {}", e.what()));
        return;
      }
    } else {
      std::this_thread::sleep_for(poll_slice);
    }
    for (size_t k = 0; k < items.size(); ++k) {
      if (!(items[k].revents & ZMQ_POLLIN)) continue;
      const auto [i, is_monitor] = owner[k];
      if (peers_[i].phase == peer_phase::dropped) continue;
      if (is_monitor) {
        while (peers_[i].monitor) {
          const auto e = next_monitor_event(*peers_[i].monitor);
          if (!e) break;
          if (e->id == ZMQ_EVENT_DISCONNECTED) drop(i, drop_kind::io, "connection lost");
          if (e->id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
            drop(i, drop_kind::io, "it refused this node's CURVE key");
          if (e->id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
            drop(i, drop_kind::io,
                 "the CURVE handshake failed (its key is not the one the coordinator named)");
        }
      } else {
        receive(i);
      }
    }
    if (!chosen_) choose();
    if (chosen_) {
      dispatch();
      check_stalls();
      check_sources_left();
    } else {
      check_nothing_offered();
    }
  }

  void receive(size_t i) {
    std::vector<zmq::message_t> parts;
    size_t n_parts = 0;
    for (int budget = 0; budget < 64 && peers_[i].phase != peer_phase::dropped; ++budget) {
      try {
        if (!recv_message(*peers_[i].sock, parts, n_parts)) return;
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) return;
        drop(i, drop_kind::io, fmt::format("receive failed: {}", e.what()));
        return;
      }
      handle(i, parts, n_parts);
    }
  }

  void handle(size_t i, std::vector<zmq::message_t>& parts, size_t n_parts) {
    auto& p = peers_[i];
    state_reply r;
    if (n_parts > 2) return drop(i, drop_kind::malformed, fmt::format("sent a reply of {} frames", n_parts));
    if (auto bad = parse_reply(parts[0].data(), parts[0].size(), r))
      return drop(i, drop_kind::malformed, "sent garbage: " + *bad);
    if (r.cluster_id != cluster_id_)
      return drop(i, drop_kind::wrong_cluster,
                  fmt::format("serves cluster {}, not {}{}", r.cluster_id, cluster_id_,
                              r.message.empty() ? "" : " (" + r.message + ")"));
    const bool is_chunk = r.status == wire::StateStatus::CHUNK;
    if ((n_parts == 2) != is_chunk)
      return drop(i, drop_kind::malformed, fmt::format("sent a reply of {} frames", n_parts));
    switch (r.status) {
      case wire::StateStatus::OFFER:
        if (p.phase != peer_phase::asking) return;  // a duplicate: nothing new
        for (auto& o : r.offers)
          if (o.total > opts_.max_bytes)
            return drop(i, drop_kind::malformed,
                        fmt::format("offers {} of {} bytes, more than fetch_options::max_bytes ({})",
                                    key_text(o.key), o.total, opts_.max_bytes));
        p.offers = std::move(r.offers);
        p.phase = peer_phase::offered;
        p.last_heard = last_progress_ = clock::now();
        if (!first_offer_) first_offer_ = p.last_heard;
        if (chosen_) consider(i);
        return;
      case wire::StateStatus::CHUNK: return chunk(i, r, parts[1]);
      case wire::StateStatus::GONE:
        return drop(i, drop_kind::no_state,
                    fmt::format("no longer holds the state (it has published twice since): {}", r.message));
      case wire::StateStatus::REFUSED: return drop(i, drop_kind::wrong_cluster, "refused: " + r.message);
      case wire::StateStatus::BAD_REQUEST:
        return drop(i, drop_kind::malformed, "refused a request: " + r.message);
    }
  }

  void chunk(size_t i, const state_reply& r, const zmq::message_t& payload) {
    auto& p = peers_[i];
    const auto it = p.outstanding.find(r.request_id);
    if (it == p.outstanding.end())
      return drop(i, drop_kind::malformed,
                  fmt::format("sent a chunk for request {}, never asked of it", r.request_id));
    const size_t c = it->second;
    const uint64_t off = c * chunk_len_;
    const uint64_t len = std::min<uint64_t>(chunk_len_, chosen_->total - off);
    if (r.key != chosen_->key || r.offset != off || r.length != len || payload.size() != len)
      return drop(i, drop_kind::malformed,
                  fmt::format("sent chunk {} of {} at [{}, +{}) with {} bytes, asked for {} at [{}, +{})",
                              key_text(r.key), r.request_id, r.offset, r.length, payload.size(),
                              key_text(chosen_->key), off, len));
    const auto* data = static_cast<const std::byte*>(payload.data());
    if (crc32c(data, len) != r.checksum)
      return drop(i, drop_kind::malformed, fmt::format("sent chunk [{}, +{}) with a bad CRC-32C", off, len));
    const uint64_t bb = chosen_->block_bytes;
    for (uint64_t b = 0; b < len; b += bb) {
      const auto idx = static_cast<size_t>((off + b) / bb);
      if (crc32c(data + b, std::min(bb, len - b)) != chosen_->block_checksums[idx])
        return drop(i, drop_kind::malformed,
                    fmt::format("sent block {} of {} whose CRC-32C differs from the offer's (corrupt copy)",
                                idx, key_text(chosen_->key)));
    }
    p.outstanding.erase(it);
    p.last_heard = last_progress_ = clock::now();
    if (done_[c]) return;  // fetched meanwhile from a peer it was given to after a drop
    std::memcpy(buffer_.data() + off, data, len);
    done_[c] = true;
    ++n_done_;
    done_bytes_ += len;
    p.bytes += len;
    report_progress(false);
  }

  // Once every open peer has answered (or the grace after the first answer is over): the newest key, or
  // opts.want; among the offers of that key, the contents most peers agree on.
  void choose() {
    bool all = true;
    for (auto& p : peers_)
      if (p.phase == peer_phase::asking) all = false;
    if (!first_offer_ || (!all && clock::now() - *first_offer_ < offer_grace)) return;
    std::optional<reduce_key> key = opts_.want;
    if (!key)
      for (auto& p : peers_)
        for (auto& o : p.offers)
          if ((!opts_.fragment || o.key.fragment == *opts_.fragment) && o.key.round >= opts_.min_round &&
              (!key || *key < o.key))
            key = o.key;
    if (!key) return;  // nobody offers anything (yet): check_nothing_offered decides
    const offer_info* best = nullptr;
    size_t best_votes = 0;
    for (auto& p : peers_)
      for (auto& o : p.offers) {
        if (o.key != *key) continue;
        size_t votes = 0;
        for (auto& q : peers_)
          for (auto& o2 : q.offers)
            if (o2.same_contents(o)) ++votes;
        if (votes > best_votes) best = &o, best_votes = votes;
      }
    if (!best) return;
    chosen_ = *best;
    const uint64_t bb = chosen_->block_bytes;
    const uint64_t want_len = std::max<uint64_t>(opts_.chunk_bytes, 1);
    chunk_len_ = std::min((want_len + bb - 1) / bb * bb, max_state_chunk_bytes / bb * bb);
    n_chunks_ = static_cast<size_t>((chosen_->total + chunk_len_ - 1) / chunk_len_);
    buffer_.resize(chosen_->total);
    done_.assign(n_chunks_, false);
    for (size_t c = 0; c < n_chunks_; ++c) pending_.push_back(c);
    for (size_t i = 0; i < peers_.size(); ++i)
      if (peers_[i].phase == peer_phase::offered) consider(i);
    // Enough requests in flight to fill a long link (16 MiB), but no more than a fair share of the chunks,
    // so that a state smaller than the window still comes from every source at once.
    size_t sources = 0;
    for (const auto& p : peers_) sources += p.phase == peer_phase::source ? 1 : 0;
    const size_t share = (n_chunks_ + std::max<size_t>(sources, 1) - 1) / std::max<size_t>(sources, 1);
    window_ = opts_.in_flight ? opts_.in_flight
                              : std::max<size_t>(2, std::min<size_t>((16u << 20) / chunk_len_, share));
  }

  // A peer that answered: a source if it offers the chosen contents, otherwise left out with the reason.
  void consider(size_t i) {
    auto& p = peers_[i];
    for (auto& o : p.offers)
      if (o.same_contents(*chosen_)) {
        p.phase = peer_phase::source;
        p.last_heard = clock::now();
        return;
      }
    for (auto& o : p.offers)
      if (o.key == chosen_->key)
        return drop(
            i, drop_kind::malformed,
            fmt::format("offers {} with other contents (CRC-32C {:08x}, {} bytes; most peers: {:08x}, {} "
                        "bytes)",
                        key_text(o.key), o.checksum, o.total, chosen_->checksum, chosen_->total));
    std::string has;
    for (auto& o : p.offers) has += (has.empty() ? "" : ", ") + key_text(o.key);
    drop(i, drop_kind::no_state,
         fmt::format("does not offer {} (it offers {})", key_text(chosen_->key), has.empty() ? "none" : has));
  }

  void dispatch() {
    for (size_t i = 0; i < peers_.size() && !pending_.empty(); ++i) {
      auto& p = peers_[i];
      while (p.phase == peer_phase::source && p.outstanding.size() < window_ && !pending_.empty()) {
        const size_t c = pending_.front();
        if (done_[c]) {
          pending_.pop_front();
          continue;
        }
        state_request r;
        r.cluster_id = cluster_id_;
        r.chunk = true;
        r.request_id = next_request_++;
        r.key = chosen_->key;
        r.offset = c * chunk_len_;
        r.length = std::min<uint64_t>(chunk_len_, chosen_->total - r.offset);
        if (!send(i, r)) break;  // queue full: later
        pending_.pop_front();
        if (p.outstanding.empty()) p.last_heard = clock::now();  // its clock starts with its first request
        p.outstanding.emplace(r.request_id, c);
      }
    }
  }

  void check_stalls() {
    const auto now = clock::now();
    for (size_t i = 0; i < peers_.size(); ++i) {
      auto& p = peers_[i];
      if (p.phase == peer_phase::source && !p.outstanding.empty() && now - p.last_heard > peer_stall_)
        drop(i, drop_kind::stalled,
             fmt::format("sent nothing for {} with {} requests outstanding", control::secs(peer_stall_),
                         p.outstanding.size()));
    }
  }

  // Chunks are missing and no peer can supply them any more.
  void check_sources_left() {
    if (done()) return;
    for (auto& p : peers_)
      if (p.phase == peer_phase::source || p.phase == peer_phase::asking) return;
    fail_all_dropped(fmt::format("state transfer of {} ({}) stopped at {} of {}", key_text(chosen_->key),
                                 mib(chosen_->total), mib(done_bytes_), mib(chosen_->total)));
  }

  void check_nothing_offered() {
    for (auto& p : peers_)
      if (p.phase == peer_phase::asking) return;
    bool any_offer = false;
    for (auto& p : peers_) any_offer |= !p.offers.empty();
    fail_all_dropped(opts_.want
                         ? fmt::format("state transfer: no peer offers state {}", key_text(*opts_.want))
                     : any_offer ? std::string("state transfer: no peer offers a state")
                                 : std::string("state transfer: no peer has a state to offer"));
  }

  [[noreturn]] void fail_all_dropped(const std::string& what) {
    bool all_malformed = true, all_cluster = true;
    std::string causes;
    for (auto& p : peers_) {
      all_malformed &= p.why == drop_kind::malformed;
      all_cluster &= p.why == drop_kind::wrong_cluster;
      std::string offered;
      if (p.why == drop_kind::none) {
        for (auto& o : p.offers) offered += (offered.empty() ? "" : ", ") + key_text(o.key);
        offered = "offers " + (offered.empty() ? std::string("nothing") : offered);
      }
      causes += fmt::format("; {}: {}", p.endpoint, p.why == drop_kind::none ? offered : p.cause);
    }
    const errc code = all_cluster     ? errc::invalid_config
                      : all_malformed ? errc::malformed_frame
                                      : errc::peer_lost;
    throw lw_error(code,
                   what + causes + (all_cluster ? " (start every node from the same cluster file)" : ""));
  }

  [[noreturn]] void fail_deadline() {
    std::string causes;
    for (auto& p : peers_) {
      const char* state = p.phase == peer_phase::asking   ? "never answered"
                          : p.phase == peer_phase::source ? "a source, silent"
                                                          : "answered";
      causes += fmt::format("; {}: {}", p.endpoint, p.phase == peer_phase::dropped ? p.cause : state);
    }
    throw lw_error(
        errc::deadline_missed,
        fmt::format("state transfer: no progress from any peer for {}{}{}", control::secs(opts_.timeout),
                    chosen_ ? fmt::format(" ({} of {} of {} fetched)", mib(done_bytes_), mib(chosen_->total),
                                          key_text(chosen_->key))
                            : std::string(" (no state offered)"),
                    causes));
  }

  std::string sources_text() const {
    std::vector<std::string> names;
    for (auto& p : peers_)
      if (p.phase == peer_phase::source) names.push_back(p.endpoint);
    return control::join_names(names);
  }

  void report_progress(bool final) {
    if (!opts_.progress || !chosen_) return;
    const auto now = clock::now();
    const uint64_t step = std::max<uint64_t>(chosen_->total / 10, 1);
    if (final || done_bytes_ >= next_report_bytes_ || now - last_report_ >= std::chrono::seconds(1)) {
      if (final && reported_final_) return;
      reported_final_ = final || done_bytes_ == chosen_->total;
      opts_.progress(done_bytes_, chosen_->total);
      last_report_ = now;
      next_report_bytes_ = (done_bytes_ / step + 1) * step;
    }
  }

  uint64_t cluster_id_;
  fetch_options opts_;
  std::chrono::milliseconds peer_stall_;
  zmq::context_t ctx_{1};
  std::vector<peer_conn> peers_;  // declared after ctx_: sockets close before the context
  uint64_t next_request_ = 1;
  std::optional<clock::time_point> first_offer_;
  clock::time_point last_progress_;
  std::optional<offer_info> chosen_;
  uint64_t chunk_len_ = 0;
  size_t n_chunks_ = 0, n_done_ = 0, window_ = 2;
  uint64_t done_bytes_ = 0;
  std::vector<std::byte> buffer_;
  std::vector<bool> done_;
  std::deque<size_t> pending_;
  clock::time_point last_report_{};
  uint64_t next_report_bytes_ = 0;
  bool reported_final_ = false;
};

}  // namespace

fetched_state fetch_state(const std::vector<std::string>& peers, uint64_t cluster_id,
                          const fetch_options& opts) {
  try {
    fetcher f(peers, cluster_id, opts);
    return f.run();
  } catch (const zmq::error_t& e) {
    throw lw_error(errc::io_error, fmt::format("state transfer: {}", e.what()));
  } catch (const std::bad_alloc& e) {
    throw lw_error(errc::io_error, "state transfer: " + describe(e));
  }
}

}  // namespace longwave::comm
