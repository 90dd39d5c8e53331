// The master's ZeroMQ shell (see master.hpp): one ROUTER socket, the ZAP handler and handshake monitor under
// CURVE, and the loop that feeds the state machine frames and time and carries out what it does.
#include "cluster/master.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cluster/control_common.hpp"
#include "comm/zmq_monitor.hpp"
#include "runtime/json/json_line.hpp"

namespace longwave::cluster {

using namespace control;

namespace {

class master_shell {
 public:
  explicit master_shell(const master_options& o) : o_(o), state_(o, clock::now()) {
    sock_.set(zmq::sockopt::linger, 1000);
    // A node keeps its routing id across reconnections (control_client sets one), so a connection that comes
    // back takes over the old one instead of being refused while the old one looks alive.
    sock_.set(zmq::sockopt::router_handover, true);
    sock_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_envelope_bytes));
    if (o_.node_keys) set_up_curve();
    try {
      sock_.bind(o_.bind_endpoint);
    } catch (const zmq::error_t& e) {
      // A port another process holds, or an address no interface has: the cluster file's or --bind's, as for
      // a node's ring endpoint (exit 2).
      const bool taken = e.num() == EADDRINUSE, elsewhere = e.num() == EADDRNOTAVAIL;
      throw lw_error(
          taken || elsewhere ? errc::invalid_config : errc::io_error,
          fmt::format("coordinator: cannot listen on {}: {}{}", o_.bind_endpoint, e.what(),
                      taken       ? " (another process holds the port: is a coordinator already running?)"
                      : elsewhere ? " (no interface of this machine has that address)"
                                  : ""));
    }
  }

  ~master_shell() {
    // Stop the monitor first, so closing the ROUTER does not wait on it.
    if (monitor_) {
      zmq_socket_monitor(sock_.handle(), nullptr, 0);
      monitor_.reset();
    }
  }
  master_shell(const master_shell&) = delete;
  master_shell& operator=(const master_shell&) = delete;

  int run() {
    if (o_.info)
      o_.info(fmt::format("coordinator: cluster of {} nodes, waiting up to {} for them on {}",
                          o_.members.size(), secs(o_.join_timeout), o_.bind_endpoint));
    auto last = clock::now();
    for (;;) {
      if (o_.stop && o_.stop()) state_.interrupt();
      // The loop turns every 100 ms or so: a much longer gap means this process was not running.
      const auto now = clock::now();
      if (now - last > o_.heartbeat_timeout / 2)
        state_.on_paused(std::chrono::duration_cast<ms>(now - last), now);
      last = now;
      state_.tick(now);
      carry_out();
      if (const auto code = state_.done()) {
        // Its last words read (or their nodes gone) before its connections close (await_last_words); a node
        // that speaks on and never acts on them holds it at most twice heartbeat_timeout.
        const auto at_most = clock::now() + 2 * o_.heartbeat_timeout;
        while (state_.awaiting_last_words(clock::now()) && clock::now() < at_most) {
          poll_once();
          carry_out();
        }
        return *code;
      }
      poll_once();
      carry_out();
      report_status();
    }
  }

 private:
  void set_up_curve() {
    zap_ = std::make_unique<comm::zap_handler>(
        ctx_, o_.node_keys,
        [this](const comm::handshake_refusal& r) {
          refused(r, n_key_refusals_, "refused keys");  // on the ZAP thread
        },
        o_.refresh_keys, o_.curve.public_key);
    try {
      comm::make_curve_server(sock_, o_.curve);
    } catch (const zmq::error_t& e) {
      throw lw_error(errc::io_error, fmt::format("coordinator: cannot set up CURVE: {}", e.what()));
    }
    // Handshakes that fail before the ZAP handler sees a key: no CURVE, or a client that pinned another
    // server key (another cluster's).
    const char* monitor_endpoint = "inproc://longwave-coordinator-monitor";
    if (zmq_socket_monitor(sock_.handle(), monitor_endpoint,
                           ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) == 0) {
      monitor_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::pair);
      monitor_->set(zmq::sockopt::linger, 0);
      monitor_->connect(monitor_endpoint);
    }
  }

  /// One frame (or none within 100 ms) into the state machine.
  void poll_once() {
    drain_monitor();
    if (!readable(sock_, std::chrono::milliseconds(100))) return;
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(sock_, std::back_inserter(parts), zmq::recv_flags::dontwait)) return;
    if (parts.size() != 2) return state_.on_bad_parts(parts.size() - 1);
    sender from;
    from.identity = parts[0].to_string();
    const char* addr = zmq_msg_gets(parts[1].handle(), "Peer-Address");
    from.peer = addr ? addr : "unknown";
    // CURVE: the node name the connection's key belongs to (the ZAP handler's user id).
    if (o_.node_keys) from.keyed_as = comm::user_id_of(parts[1].handle());
    auto parsed = parse_envelope(parts[1].data(), parts[1].size(), o_.cluster_id);
    if (!parsed) return state_.on_bad_frame(from, parsed.error());
    state_.on_frame(from, parsed.value(), clock::now());
  }

  /// Sends the state machine's frames and passes its lines and events on.
  void carry_out() {
    for (auto& a : state_.take_actions()) std::visit([this](auto& x) { carry(x); }, a);
  }
  void carry(const send& s) {
    std::vector<zmq::message_t> parts;
    parts.emplace_back(s.to.data(), s.to.size());
    parts.push_back(to_message(build_envelope(s.envelope)));
    (void)zmq::send_multipart(sock_, parts, zmq::send_flags::dontwait);
  }
  void carry(const line& l) {
    const auto& out = l.warning ? o_.warn : o_.info;
    if (out) out(l.text);
  }
  void carry(const error_counted& e) {
    if (o_.on_error) o_.on_error(e.reason);
  }
  void carry(const frame_rejected& r) {
    if (o_.on_reject) o_.on_reject(r.reason);
  }
  void carry(const epoch_began& e) {
    if (o_.on_epoch) o_.on_epoch(e.epoch, e.members, e.reason);
  }
  void carry(const node_joined& j) {
    if (o_.on_join) o_.on_join(j.name, j.round);
  }
  void carry(const record& r) {
    if (!o_.on_record) return;
    runtime::json_line out(r.kind);
    for (const auto& [key, value] : r.fields)
      std::visit([&, &k = key](const auto& v) { out.add(k, v); }, value);
    o_.on_record(out.str());
  }

  void report_status() {
    const auto now = clock::now();
    if (o_.on_quorum_wait) o_.on_quorum_wait(state_.quorum_waited_s(now));
    if (o_.on_status) o_.on_status(state_.statuses(now));
  }

  /// Reports handshakes the monitor saw fail (CURVE only).
  void drain_monitor() {
    if (!monitor_) return;
    while (const auto ev = comm::next_monitor_event(*monitor_)) {
      comm::handshake_refusal r;
      r.reason = "handshake";
      r.address = "a connection on " + ev->address;  // its own endpoint: the monitor names no peer
      refused(r, n_handshake_failures_, "failed handshakes");
    }
  }

  /// A refused handshake: logged sparingly (as dropped control messages are), counted by on_refused.
  void refused(const comm::handshake_refusal& r, std::atomic<uint64_t>& counter, const char* counted) {
    const uint64_t n = ++counter;
    if ((n <= logged_drops || n % drop_log_every == 0) && o_.warn)
      o_.warn("coordinator: " + r.describe() +
              (n > logged_drops ? fmt::format(" ({} {} so far)", n, counted) : std::string()));
    if (o_.on_refused) o_.on_refused(r);
  }

  const master_options& o_;
  master_state state_;
  std::atomic<uint64_t> n_handshake_failures_{0};
  std::atomic<uint64_t> n_key_refusals_{0};  // counted on the ZAP thread
  zmq::context_t ctx_{1};
  zmq::socket_t sock_{ctx_, zmq::socket_type::router};
  std::unique_ptr<zmq::socket_t> monitor_;  // CURVE: failed handshakes of sock_
  std::unique_ptr<comm::zap_handler> zap_;  // CURVE: admits the node keys; closed before ctx_
};

}  // namespace

int run_master(const master_options& opts) {
  master_shell m(opts);
  return m.run();
}

}  // namespace longwave::cluster
