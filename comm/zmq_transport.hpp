#pragma once
// The ZeroMQ side of one ring member: a single I/O thread that owns the context and every socket (a PULL
// bound for the previous rank, a PUSH connected to the next one, a monitor of the PUSH), and a job queue
// through which other threads run work on that thread and wait for it with a std::future.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "comm/curve.hpp"

namespace longwave::comm {

/// Sockets and limits of a transport.
struct transport_options {
  /// Where this node listens for the previous rank, e.g. "tcp://127.0.0.1:5601".
  std::string bind_endpoint;
  /// The next rank's bind endpoint; empty for a node that only receives.
  std::string connect_endpoint;
  /// Messages queued towards the next rank before try_send reports a full queue.
  int send_hwm = 64;
  /// Messages queued per incoming connection before ZeroMQ stops reading that connection.
  int recv_hwm = 64;
  /// ZMQ_MAXMSGSIZE: a peer that sends a larger frame is disconnected before it is buffered (-1: no limit).
  int64_t max_frame_bytes = -1;
  /// How long closing waits for frames still queued for the next rank.
  std::chrono::milliseconds linger{30000};
  /// CURVE: the listening socket admits the ring's node keys, and the next rank must hold server_public.
  std::optional<curve_server_keys> curve;
  std::string server_public;
};

/// One complete multipart message taken from the listening socket.
struct inbound_message {
  std::vector<zmq::message_t> parts;  ///< at most the max_parts given to try_recv
  size_t extra_parts = 0;             ///< parts beyond that, read and discarded
  size_t bytes = 0;                   ///< bytes of all parts, discarded ones included
  std::string peer;                   ///< the sending connection's address, e.g. "127.0.0.1"
};

/// Owns the I/O thread and the sockets. Construction binds and connects on that thread and throws
/// lw_error(errc::io_error) if it cannot (e.g. the port is in use); destruction stops and joins it.
class zmq_transport {
 public:
  explicit zmq_transport(transport_options opts);
  ~zmq_transport();
  zmq_transport(const zmq_transport&) = delete;
  zmq_transport& operator=(const zmq_transport&) = delete;

  /// Runs fn on the I/O thread after the jobs queued before it. The future holds fn's exception, if any;
  /// jobs that report errors as values avoid sharing an exception object between threads. Any thread.
  std::future<void> submit(std::function<void()> fn);

  /// True once the destructor has begun: a running job should stop (errc::cancelled). Any thread.
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }

  /// On close, drop frames still queued for the next rank instead of lingering (use after a failed round,
  /// when nobody waits for them). Any thread.
  void drop_queued_on_close() { drop_on_close_.store(true, std::memory_order_release); }

  /// The endpoint bound, as ZeroMQ reports it (resolves "tcp://127.0.0.1:*"). Any thread.
  const std::string& bound_endpoint() const { return bound_endpoint_; }

  // ---- I/O thread only (inside a submitted job) ----

  /// Hands [header, payload] to ZeroMQ for the next rank without blocking. Returns false and sends nothing
  /// when the next rank's queue is at the high-water mark; then wait(true, ...) until it drains.
  bool try_send(zmq::message_t& header, zmq::message_t& payload);

  /// Takes one complete message from the listening socket if one is waiting. Keeps at most max_parts parts
  /// and discards the rest (counted in extra_parts).
  bool try_recv(inbound_message& out, size_t max_parts);

  /// Blocks until a send may succeed (want_send), a message is waiting (want_recv), the connection to the
  /// next rank changes state, stopping() or `until`, whichever is first (at most 50 ms, so callers recheck).
  void wait(bool want_send, bool want_recv, std::chrono::steady_clock::time_point until);

  /// A description of the loss of the connection to the next rank, if it was lost and has not come back
  /// since, or of a failed CURVE handshake with it (a refused or unexpected key; libzmq does not retry one).
  /// A link that dropped between rounds (the next rank died while this one computed) stays lost, so
  /// the next round fails at once instead of waiting for its deadline; a reconnect forgets the loss.
  std::optional<std::string> link_lost();

 private:
  void run(std::promise<std::string>& started);
  void open_sockets();
  void close_sockets();
  void drain_monitor();
  void assert_io_thread() const;

  transport_options opts_;
  std::string bound_endpoint_;

  // Owned and used by the I/O thread only.
  std::unique_ptr<zmq::context_t> ctx_;
  std::unique_ptr<zmq::socket_t> pull_;
  std::unique_ptr<zmq::socket_t> push_;
  std::unique_ptr<zmq::socket_t> monitor_;
  std::unique_ptr<zap_handler> zap_;  // CURVE: closed before the context
  bool connected_ = false;
  int dropped_handshakes_ = 0;  // in a row, since the last handshake that succeeded
  std::optional<std::string> lost_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> jobs_;  // guarded by mu_
  bool stop_requested_ = false;                  // guarded by mu_
  std::atomic<bool> stopping_{false};
  std::atomic<bool> drop_on_close_{false};
  std::thread::id io_thread_id_;
  std::thread thread_;
};

}  // namespace longwave::comm
