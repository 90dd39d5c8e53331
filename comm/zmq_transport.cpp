// The ZeroMQ sockets of a ring member, opened, used and closed on its I/O thread: inside a job, try_send /
// try_recv / wait drive them without ever blocking for long.
#include "comm/zmq_transport.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "comm/zmq_monitor.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::comm {
namespace {

constexpr const char* monitor_endpoint = "inproc://longwave-transport-monitor";
constexpr auto max_wait_slice = std::chrono::milliseconds(50);

int to_int_ms(std::chrono::milliseconds ms) {
  return static_cast<int>(std::min<int64_t>(ms.count(), std::numeric_limits<int>::max()));
}

}  // namespace

zmq_transport::zmq_transport(transport_options opts) : opts_(std::move(opts)) {
  thread_.start([this] { open_sockets(); }, [this] { close_sockets(); },
                [this](const char* e) {
                  return fmt::format("comm: cannot open the ring sockets (bind {}, connect {}): {}",
                                     opts_.bind_endpoint, opts_.connect_endpoint, e);
                });
}

zmq_transport::~zmq_transport() {
  thread_.stop();
}

std::unique_ptr<transport> make_zmq_transport(transport_options opts) {
  return std::make_unique<zmq_transport>(std::move(opts));
}

void zmq_transport::open_sockets() {
  ctx_ = std::make_unique<zmq::context_t>(1);
  pull_ = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::pull);
  pull_->set(zmq::sockopt::rcvhwm, opts_.recv_hwm);
  pull_->set(zmq::sockopt::maxmsgsize, opts_.max_frame_bytes);
  pull_->set(zmq::sockopt::linger, 0);
  if (opts_.curve) {
    zap_ = std::make_unique<zap_handler>(*ctx_, opts_.curve->admitted, opts_.curve->on_refused);
    make_curve_server(*pull_, opts_.curve->own);
  }
  if (opts_.link_timeout.count() > 0) {
    // The previous rank's frames keep arriving on a live link; nothing, pings included, for link_timeout and
    // the connection is closed (the sender hears of it when the way back still works).
    pull_->set(zmq::sockopt::heartbeat_ivl, heartbeat_interval());
    pull_->set(zmq::sockopt::heartbeat_timeout, to_int_ms(opts_.link_timeout));
  }
  pull_->bind(opts_.bind_endpoint);
  bound_endpoint_ = pull_->get(zmq::sockopt::last_endpoint);
  if (opts_.connect_endpoint.empty()) return;
  push_ = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::push);
  push_->set(zmq::sockopt::sndhwm, opts_.send_hwm);
  push_->set(zmq::sockopt::linger, to_int_ms(opts_.linger));
  if (opts_.curve) make_curve_client(*push_, opts_.curve->own, opts_.server_public);
  if (opts_.link_timeout.count() > 0) {
    // Data the next rank has not acknowledged for link_timeout ends the connection (TCP_USER_TIMEOUT): a
    // sender whose send buffer filled on a dead link produces no ping, and may never hear the far end's
    // close. Idle, the pings are that data. Its pings wait behind the data queued in the kernel, so their
    // own timeout allows more; a connect that hangs (its packets dropped) is abandoned and retried.
    push_->set(zmq::sockopt::tcp_maxrt, to_int_ms(opts_.link_timeout));
    push_->set(zmq::sockopt::heartbeat_ivl, heartbeat_interval());
    push_->set(zmq::sockopt::heartbeat_timeout, to_int_ms(4 * opts_.link_timeout));
    push_->set(zmq::sockopt::connect_timeout, to_int_ms(opts_.link_timeout));
  }
  unconnected_since_ = std::chrono::steady_clock::now();
  // The monitor must be attached before connecting, or the first connection's events are missed.
  if (zmq_socket_monitor(push_->handle(), monitor_endpoint,
                         ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                             ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0)
    throw zmq::error_t();
  monitor_ = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::pair);
  monitor_->set(zmq::sockopt::linger, 0);
  monitor_->connect(monitor_endpoint);
  push_->connect(opts_.connect_endpoint);
}

void zmq_transport::close_sockets() {
  // Stop the monitor first, so closing the PUSH socket does not wait on it.
  try {
    if (push_ && monitor_) zmq_socket_monitor(push_->handle(), nullptr, 0);
    monitor_.reset();
    if (push_ && drop_on_close_.load(std::memory_order_acquire)) push_->set(zmq::sockopt::linger, 0);
    push_.reset();
    pull_.reset();
    zap_.reset();
    ctx_.reset();  // waits up to the linger time for frames still queued for the next rank
  } catch (const zmq::error_t& e) {
    std::fprintf(stderr, "longwave comm: error while closing sockets: %s\n", e.what());
  }
}

void zmq_transport::assert_io_thread() const {
  LW_ASSERT(thread_.on_thread(), "zmq_transport socket call outside the I/O thread");
}

bool zmq_transport::try_send(zmq::message_t& header, zmq::message_t& payload) {
  assert_io_thread();
  LW_ASSERT(push_ != nullptr, "zmq_transport::try_send without a next rank");
  auto first = push_->send(header, zmq::send_flags::dontwait | zmq::send_flags::sndmore);
  if (!first) return false;
  // The high-water mark is checked only at a message's first frame, so the second cannot wait for it.
  auto second = push_->send(payload, zmq::send_flags::none);
  if (!second) throw lw_error(errc::io_error, "comm: ZeroMQ refused the payload frame after its header");
  return true;
}

bool zmq_transport::try_recv(inbound_message& out, size_t max_parts) {
  assert_io_thread();
  out.parts.clear();
  out.extra_parts = 0;
  out.bytes = 0;
  out.peer.clear();
  zmq::message_t part;
  if (!pull_->recv(part, zmq::recv_flags::dontwait)) return false;
  if (const char* addr = zmq_msg_gets(part.handle(), "Peer-Address")) out.peer = addr;
  if (out.peer.empty()) out.peer = "unknown";
  for (;;) {
    const bool more = part.more();
    out.bytes += part.size();
    if (out.parts.size() < max_parts)
      out.parts.push_back(std::move(part));
    else
      ++out.extra_parts;
    if (!more) break;
    part = zmq::message_t();
    // The rest of a multipart message is delivered atomically with its first frame.
    if (!pull_->recv(part, zmq::recv_flags::none)) break;
  }
  return true;
}

void zmq_transport::wait(bool want_send, bool want_recv, std::chrono::steady_clock::time_point until) {
  assert_io_thread();
  zmq_pollitem_t items[3];
  int n = 0;
  if (want_recv) items[n++] = zmq_pollitem_t{pull_->handle(), 0, ZMQ_POLLIN, 0};
  if (want_send && push_) items[n++] = zmq_pollitem_t{push_->handle(), 0, ZMQ_POLLOUT, 0};
  if (monitor_) items[n++] = zmq_pollitem_t{monitor_->handle(), 0, ZMQ_POLLIN, 0};
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
  if (left.count() < 0) left = std::chrono::milliseconds(0);
  const int timeout = to_int_ms(std::min<std::chrono::milliseconds>(left, max_wait_slice));
  if (zmq_poll(items, n, timeout) < 0 && zmq_errno() != EINTR) throw zmq::error_t();
  drain_monitor();
}

void zmq_transport::drain_monitor() {
  if (!monitor_) return;
  while (const auto e = next_monitor_event(*monitor_)) {
    if (e->id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      connected_ = true;
      dropped_handshakes_ = 0;
      lost_.reset();
    } else if (e->id == ZMQ_EVENT_DISCONNECTED && connected_) {
      connected_ = false;
      unconnected_since_ = std::chrono::steady_clock::now();
      if (!lost_) lost_ = fmt::format("connection to {} lost", e->address);
    } else if (e->id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      // libzmq never retries after a refused handshake: say why now instead of stalling until the timeout.
      if (!lost_) lost_ = fmt::format("{} refused this node's CURVE key", e->address);
    } else if (e->id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
               (e->id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL && ++dropped_handshakes_ >= 3)) {
      // A server that cannot read this node's hello (pinned to another key) drops it, and libzmq tries again:
      // three drops in a row with no handshake between them are taken as the answer.
      if (!lost_)
        lost_ = opts_.curve
                    ? fmt::format(
                          "the CURVE handshake with {} failed (its key is not the one the "
                          "coordinator named, or it runs without CURVE)",
                          e->address)
                    : fmt::format("the handshake with {} failed (does it run with CURVE?)", e->address);
    }
  }
}

std::optional<std::string> zmq_transport::link_lost() {
  assert_io_thread();
  drain_monitor();
  if (lost_ || connected_ || !push_ || opts_.link_timeout.count() <= 0) return lost_;
  const auto apart = std::chrono::steady_clock::now() - unconnected_since_;
  if (apart < opts_.link_timeout) return std::nullopt;
  return fmt::format("no connection to {} for {:.0f} s (comm.link_timeout_s)", opts_.connect_endpoint,
                     std::chrono::duration<double>(apart).count());
}

int zmq_transport::heartbeat_interval() const {
  return to_int_ms(
      std::max<std::chrono::milliseconds>(std::chrono::milliseconds(200), opts_.link_timeout / 5));
}

}  // namespace longwave::comm
