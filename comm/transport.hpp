#pragma once
// A ring member's links as the ring sees them (gloo's Pair, for a ring): frames to the next rank, messages
// from the previous one, and one I/O thread that runs the ring's work. ZeroMQ (comm/zmq_transport) and an
// in-process hub (comm/inproc_transport) implement it; test faults and rate limits wrap it
// (comm/fault_transport), chosen once when the ring is built, never a branch of the ring's loop.
// Frames are zmq::message_t: owned bytes that move between threads without a copy.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "comm/curve.hpp"

namespace longwave::comm {

/// Endpoints and limits of a transport.
struct transport_options {
  /// Where this node listens for the previous rank, e.g. "tcp://127.0.0.1:5601".
  std::string bind_endpoint;
  /// The next rank's bind endpoint; empty for a node that only receives.
  std::string connect_endpoint;
  /// Messages queued towards the next rank before try_send reports a full queue.
  int send_hwm = 64;
  /// Messages queued per incoming connection before the transport stops reading that connection.
  int recv_hwm = 64;
  /// A peer's message larger than this is dropped before it is buffered (ZeroMQ: the peer is disconnected;
  /// -1: no limit).
  int64_t max_frame_bytes = -1;
  /// How long closing waits for frames still queued for the next rank.
  std::chrono::milliseconds linger{30000};
  /// A link that goes silent is dropped after about this long (0: never): the listening side drops a
  /// connection that delivered no complete frame within it (ZMTP heartbeats), the sending side one whose data
  /// went unacknowledged that long (TCP_USER_TIMEOUT; idle, its pings are that data), and a next rank that
  /// stays unconnected this long is reported by link_lost. A live link must deliver a chunk well within it.
  std::chrono::milliseconds link_timeout{0};
  /// CURVE (ZeroMQ only): the listening socket admits the ring's node keys, and the next rank must hold
  /// server_public.
  std::optional<curve_server_keys> curve;
  std::string server_public;
};

/// One complete multipart message taken from the listening side.
struct inbound_message {
  std::vector<zmq::message_t> parts;  ///< at most the max_parts given to try_recv
  size_t extra_parts = 0;             ///< parts beyond that, read and discarded
  size_t bytes = 0;                   ///< bytes of all parts, discarded ones included
  std::string peer;                   ///< the sender's address, e.g. "127.0.0.1"
};

/// A ring member's links and I/O thread. Construction binds and connects (lw_error(errc::io_error) if it
/// cannot, e.g. the endpoint is taken); destruction stops and joins the thread.
class transport {
 public:
  virtual ~transport() = default;

  /// Runs fn on the I/O thread after the jobs queued before it; the future holds fn's exception. Any thread.
  virtual std::future<void> submit(std::function<void()> fn) = 0;
  /// True once destruction has begun: a running job should stop (errc::cancelled). Any thread.
  virtual bool stopping() const = 0;
  /// On close, drop frames still queued for the next rank instead of lingering. Any thread.
  virtual void drop_queued_on_close() = 0;
  /// The endpoint bound (resolves a wildcard port). Any thread.
  virtual const std::string& bound_endpoint() const = 0;

  // ---- I/O thread only (inside a submitted job) ----

  /// Hands [header, payload] over for the next rank without blocking; false (nothing sent) when the queue
  /// towards it is full: then wait(true, ...) until it drains.
  virtual bool try_send(zmq::message_t& header, zmq::message_t& payload) = 0;
  /// Takes one complete message if one is waiting, keeping at most max_parts parts (the rest counted).
  virtual bool try_recv(inbound_message& out, size_t max_parts) = 0;
  /// Blocks until a send may succeed (want_send), a message is waiting (want_recv), the link to the next
  /// rank changes, stopping() or `until`, whichever is first: at most 50 ms, so callers recheck.
  virtual void wait(bool want_send, bool want_recv, std::chrono::steady_clock::time_point until) = 0;
  /// Why the link to the next rank is down (lost after it was up, a refused handshake, or no connection for
  /// link_timeout), if it is; a reconnect forgets the loss.
  virtual std::optional<std::string> link_lost() = 0;
};

/// Builds a ring member's transport: ring_options::transport (empty means ZeroMQ).
using transport_factory = std::function<std::unique_ptr<transport>(transport_options)>;

/// The ZeroMQ transport (TCP, CURVE): what a ring uses unless told otherwise.
std::unique_ptr<transport> make_zmq_transport(transport_options opts);

}  // namespace longwave::comm
