// State transfer's serving side (see state_server.hpp). The server answers on one thread from a ROUTER
// socket; chunks go out as zero-copy ZeroMQ frames that hold a reference to the published blob.
#include "cluster/state_server.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <zmq.hpp>

#include "cluster/control_common.hpp"
#include "runtime/checksum/crc32c.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::cluster {

using namespace comm;  // CURVE, ZAP and socket monitors
using runtime::crc32c;

namespace {

using bytes_ptr = std::shared_ptr<const std::vector<std::byte>>;

// A state is checksummed in blocks: 1 MiB, doubled until a state has at most this many.
constexpr uint64_t min_block_bytes = 1u << 20;
constexpr uint64_t max_blocks_chosen = 1u << 16;
constexpr auto poll_slice = std::chrono::milliseconds(50);

/// The address a received frame came from ("" if ZeroMQ does not say: inproc, an old libzmq).
std::string peer_of(const zmq::message_t& frame) {
  try {
    const char* a = const_cast<zmq::message_t&>(frame).gets("Peer-Address");  // cppzmq: not const
    return a ? a : "";
  } catch (const zmq::error_t&) {
    return "";
  }
}

}  // namespace

const char* to_string(state_reject why) {
  switch (why) {
    case state_reject::bad_framing: return "bad_framing";
    case state_reject::malformed: return "malformed";
    case state_reject::wrong_cluster: return "wrong_cluster";
    case state_reject::gone: return "gone";
    case state_reject::bad_range: return "bad_range";
  }
  return "unknown";
}

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
                           std::optional<curve_server_keys> curve, state_refusal_callback on_refused)
    : cluster_id_(cluster_id), on_refused_(std::move(on_refused)), sockets_(std::make_unique<sockets>()) {
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
      answer(parts, n_parts);
    }
  }
}

void state_server::send(const zmq::message_t& identity, const state_reply& reply, zmq::message_t* payload) {
  auto& router = sockets_->router;
  zmq::message_t id;
  id.copy(const_cast<zmq::message_t&>(identity));
  auto header = build_reply(reply);
  try {
    (void)router.send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    (void)router.send(
        header, payload ? zmq::send_flags::sndmore | zmq::send_flags::dontwait : zmq::send_flags::dontwait);
    if (payload) (void)router.send(*payload, zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
    // EHOSTUNREACH and the like: the joiner is gone
  }
}

void state_server::tell(state_reject why, const std::string& message) {
  if (!on_refused_) return;
  try {
    on_refused_(request_ ? peer_of(*request_) : std::string(), why, message);
  } catch (...) {
    // the callback's failure (say, out of memory while logging) must not end the server's thread
  }
}

void state_server::refuse(const zmq::message_t& identity, state_reject why, state_status status,
                          uint64_t request_id, std::string message) {
  rejected_[static_cast<size_t>(why)].fetch_add(1, std::memory_order_relaxed);
  tell(why, message);
  state_reply r;
  r.cluster_id = cluster_id_;
  r.status = status;
  r.request_id = request_id;
  r.message = std::move(message);
  send(identity, r);
}

void state_server::answer(std::vector<zmq::message_t>& parts, size_t n_parts) {
  // ROUTER puts the peer's address on the frames it received, not on the routing id it adds.
  request_ = parts.size() > 1 ? &parts.back() : nullptr;  // parts holds at most 3 of the n_parts frames
  if (n_parts != 2) {
    if (n_parts > 1)
      refuse(parts[0], state_reject::bad_framing, state_status::bad_request, 0,
             fmt::format("a request is one frame, this message has {}", n_parts - 1));
    else {
      rejected_[static_cast<size_t>(state_reject::bad_framing)].fetch_add(1, std::memory_order_relaxed);
      tell(state_reject::bad_framing, "no request frame");
    }
    return;
  }
  state_request req;
  if (auto bad = parse_request(parts[1].data(), parts[1].size(), req))
    return refuse(parts[0], state_reject::malformed, state_status::bad_request, 0, *bad);
  if (req.cluster_id != cluster_id_)
    return refuse(parts[0], state_reject::wrong_cluster, state_status::refused, req.request_id,
                  fmt::format("this server belongs to cluster {}, the request to cluster {}", cluster_id_,
                              req.cluster_id));
  std::vector<std::shared_ptr<published>> held;
  {
    std::lock_guard<std::mutex> lk(mu_);
    held = held_;
  }
  if (req.chunk) return serve_chunk(parts[0], req, held);
  state_reply r;
  r.cluster_id = cluster_id_;
  r.status = state_status::offer;
  r.request_id = req.request_id;
  for (const auto& h : held) {
    h->sum();
    r.offers.push_back(
        offer_info{h->key, h->round, h->bytes->size(), h->checksum, h->block_bytes, h->block_checksums});
  }
  send(parts[0], r);
}

void state_server::serve_chunk(zmq::message_t& identity, const state_request& req,
                               const std::vector<std::shared_ptr<published>>& held) {
  published* p = nullptr;
  for (const auto& h : held)
    if (h && h->key == req.key) p = h.get();
  if (!p)
    return refuse(identity, state_reject::gone, state_status::gone, req.request_id,
                  fmt::format("state {} is not held here (newest: {})", key_text(req.key),
                              held.empty() ? std::string("none") : key_text(held[0]->key)));
  p->sum();
  const uint64_t total = p->bytes->size();
  if (req.length == 0 || req.length > max_state_chunk_bytes || req.offset > total ||
      req.length > total - req.offset || req.offset % p->block_bytes != 0)
    return refuse(
        identity, state_reject::bad_range, state_status::bad_request, req.request_id,
        fmt::format("chunk [{}, +{}) is not within the {} bytes of {} in blocks of {} (at most {} "
                    "bytes a chunk)",
                    req.offset, req.length, total, key_text(p->key), p->block_bytes, max_state_chunk_bytes));
  const auto* data = p->bytes->data() + req.offset;
  const auto len = static_cast<size_t>(req.length);
  // Zero-copy: the frame keeps the blob alive until ZeroMQ has sent it, even if it is unpublished.
  auto* keep = new bytes_ptr(p->bytes);
  zmq::message_t payload(
      const_cast<std::byte*>(data), len, [](void*, void* hint) { delete static_cast<bytes_ptr*>(hint); },
      keep);
  state_reply r;
  r.cluster_id = cluster_id_;
  r.status = state_status::chunk;
  r.request_id = req.request_id;
  r.key = p->key;
  r.offset = req.offset;
  r.length = req.length;
  r.checksum = crc32c(data, len);
  send(identity, r, &payload);
  bytes_served_.fetch_add(req.length, std::memory_order_relaxed);
}

}  // namespace longwave::cluster
