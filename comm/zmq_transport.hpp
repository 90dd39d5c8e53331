#pragma once
// The ZeroMQ transport of one ring member: its I/O thread owns the context and every socket (a PULL bound
// for the previous rank, a PUSH connected to the next one, a monitor of the PUSH).
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <zmq.hpp>

#include "comm/io_thread.hpp"
#include "comm/transport.hpp"

namespace longwave::comm {

class zmq_transport final : public transport {
 public:
  /// Binds and connects on the I/O thread; throws lw_error(errc::io_error) if it cannot (the port is in use).
  explicit zmq_transport(transport_options opts);
  ~zmq_transport() override;
  zmq_transport(const zmq_transport&) = delete;
  zmq_transport& operator=(const zmq_transport&) = delete;

  std::future<void> submit(std::function<void()> fn) override { return thread_.submit(std::move(fn)); }
  bool stopping() const override { return thread_.stopping(); }
  void drop_queued_on_close() override { drop_on_close_.store(true, std::memory_order_release); }
  const std::string& bound_endpoint() const override { return bound_endpoint_; }

  bool try_send(zmq::message_t& header, zmq::message_t& payload) override;
  bool try_recv(inbound_message& out, size_t max_parts) override;
  void wait(bool want_send, bool want_recv, std::chrono::steady_clock::time_point until) override;
  /// A dropped connection (the next rank died, even between rounds: the next round then fails at once
  /// instead of waiting for its deadline; or the link went silent), a failed CURVE handshake (libzmq does not
  /// retry a refused key), or no connection for link_timeout.
  std::optional<std::string> link_lost() override;

 private:
  void open_sockets();
  void close_sockets();
  void drain_monitor();
  void assert_io_thread() const;
  int heartbeat_interval() const;  // ms between ZMTP pings: a fifth of link_timeout

  transport_options opts_;
  std::string bound_endpoint_;

  // Owned and used by the I/O thread only.
  std::unique_ptr<zmq::context_t> ctx_;
  std::unique_ptr<zmq::socket_t> pull_;
  std::unique_ptr<zmq::socket_t> push_;
  std::unique_ptr<zmq::socket_t> monitor_;
  std::unique_ptr<zap_handler> zap_;  // CURVE: closed before the context
  bool connected_ = false;
  std::chrono::steady_clock::time_point unconnected_since_;  // opened, or the last disconnect
  int dropped_handshakes_ = 0;  // in a row, since the last handshake that succeeded
  std::optional<std::string> lost_;
  std::atomic<bool> drop_on_close_{false};
  io_thread thread_;  // last: stopped first
};

}  // namespace longwave::comm
