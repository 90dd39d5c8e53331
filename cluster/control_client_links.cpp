// A node's control connections, one per coordinator address (see control_client.hpp): opening them, their
// monitors (handshakes, drops, refusals) and reading whichever has a message.
#include <fmt/format.h>

#include <algorithm>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cluster/control_client.hpp"
#include "cluster/control_common.hpp"
#include "comm/zmq_monitor.hpp"

namespace longwave::cluster {

using namespace comm;
using namespace control;

void control_client::open() {
  links_.clear();
  leader_.reset();
  for (const auto& ep : endpoints_) links_.push_back(open_link(ep));
}

control_client::link control_client::open_link(const std::string& endpoint) {
  link l;
  l.endpoint = endpoint;
  l.sock = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::dealer);
  auto& sock = *l.sock;
  sock.set(zmq::sockopt::linger, 1000);
  sock.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_envelope_bytes));
  sock.set(zmq::sockopt::sndhwm, 16);
  // ZMTP heartbeats: a coordinator that stopped running (suspended, hung host) counts as lost after 4 s, so
  // a standby can take the cluster over; its I/O thread answers them whatever its main loop does.
  sock.set(zmq::sockopt::heartbeat_ivl, 1000);
  sock.set(zmq::sockopt::heartbeat_timeout, 4000);
  // Several addresses: only to a connection that is up, not queued for an address where no coordinator runs.
  if (endpoints_.size() > 1) sock.set(zmq::sockopt::immediate, true);
  sock.set(zmq::sockopt::routing_id, routing_id_);
  if (curve_peer_) make_curve_client(sock, curve_peer_->own, curve_peer_->server_public);
  // The monitor must be attached before connecting, or the first connection's events are missed.
  // A new name each time: the endpoint of a monitor stopped in close() may still be bound for a while.
  const std::string monitor_endpoint = fmt::format("inproc://longwave-control-monitor-{}", ++opened_);
  if (zmq_socket_monitor(sock.handle(), monitor_endpoint.c_str(),
                         ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                             ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) == 0) {
    l.monitor = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::pair);
    l.monitor->set(zmq::sockopt::linger, 0);
    l.monitor->connect(monitor_endpoint);
  }
  try {
    sock.connect(endpoint);
  } catch (const zmq::error_t& e) {
    throw lw_error(errc::invalid_config,
                   fmt::format("cannot connect to the coordinator at {}: {}", endpoint, e.what()));
  }
  return l;
}

void control_client::close() {
  // Stop each monitor first, so closing its DEALER does not wait on it.
  for (auto& l : links_) {
    if (l.monitor) {
      zmq_socket_monitor(l.sock->handle(), nullptr, 0);
      l.monitor.reset();
    }
    l.sock.reset();
  }
  links_.clear();
  leader_.reset();
}

void control_client::drain_monitor(std::vector<control_event>& out) {
  for (size_t i = 0; i < links_.size(); ++i) {
    if (!links_[i].monitor) continue;
    while (const auto e = next_monitor_event(*links_[i].monitor)) on_monitor_event(i, e->id, e->address, out);
  }
}

void control_client::on_monitor_event(size_t i, int id, const std::string& address,
                                      std::vector<control_event>& out) {
  const bool failed = id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH || id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
                      id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
  if (ever_connected_ && failed) {
    if (auto refusal = refused_again(id, address)) out.push_back(std::move(*refusal));
  } else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
    auth_refused_ = true;
  } else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
    // A protocol error (another security mechanism, a key that does not decrypt): libzmq does not
    // reconnect after it, so it is decisive at once.
    handshake_failures_ = std::max(handshake_failures_, 3);
  } else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
    ++handshake_failures_;  // the peer dropped the connection mid-handshake: maybe a restart, count
  } else if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
    links_[i].up = true;
    // Another coordinator came up while this node follows one: tell it the term (an older one steps down).
    if (leader_ && *leader_ != i && term_ > 0) tell_term(i);
    if (connected_) return;
    handshake_failures_ = 0;
    auth_refused_ = false;
    connected_ = true;
    if (ever_connected_) out.push_back({control_event::kind::connection_back, errc::none, endpoint_, 0, {}});
    ever_connected_ = true;
  } else if (id == ZMQ_EVENT_DISCONNECTED) {
    links_[i].up = false;
    if (leader_ == i) leader_.reset();  // its messages go to every connected coordinator until one speaks
    const bool any_up = std::any_of(links_.begin(), links_.end(), [](const link& l) { return l.up; });
    if (!connected_ || any_up) return;
    connected_ = false;
    out.push_back({control_event::kind::connection_lost, errc::none, endpoint_, 0, {}});
  }
}

bool control_client::recv_one(size_t& from, std::vector<zmq::message_t>& parts) {
  for (size_t i = 0; i < links_.size(); ++i) {
    parts.clear();
    try {
      if (!zmq::recv_multipart(*links_[i].sock, std::back_inserter(parts), zmq::recv_flags::dontwait))
        continue;
    } catch (const zmq::error_t&) {
      continue;  // EINTR and the like: the next call tries again
    }
    from = i;
    return true;
  }
  return false;
}

std::optional<control_event> control_client::refused_again(int id, const std::string& address) {
  // A coordinator this node was connected to now refuses it: restarted with another key directory (its ZAP
  // handler refuses this key), with another cluster's keys (it cannot read this node's hello and drops it:
  // three in a row answer), or without CURVE. libzmq retries only dropped hellos: after the others the socket
  // is opened again a little later, so the node gets back once the coordinator is fixed.
  if (id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL && ++handshake_failures_ != 3) return std::nullopt;
  if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) auth_refused_ = true;  // a join in progress stops, naming it
  if (id != ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) reopen_at_ = clock::now() + reopen_after;
  connected_ = false;
  std::string why;
  if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
    why = fmt::format(
        "the coordinator at {} now refuses this node's CURVE key (was it restarted with another key "
        "directory, "
        "or is the key revoked?)",
        address);
  else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
    why = fmt::format(
        "the handshake with the coordinator at {} failed: it runs without CURVE ([security] mode = \"none\")",
        address);
  else
    why = fmt::format(
        "the coordinator at {} drops this node's CURVE hellos: its key is not this node's "
        "keys/cluster.public "
        "(was it restarted with another cluster's keys?)",
        address);
  return control_event{control_event::kind::refused, errc::invalid_config, std::move(why), 0, {}};
}

void control_client::check_handshake() {
  drain_monitor(pending_);
  if (auth_refused_)
    throw lw_error(errc::invalid_config,
                   fmt::format("the coordinator at {} refused this node's CURVE key (its public key is not "
                               "among the coordinator's keys/nodes/*.public, or it is revoked)",
                               endpoint_));
  if (!ever_connected_ && handshake_failures_ >= 3)
    throw lw_error(
        errc::invalid_config,
        curve_ ? fmt::format("the CURVE handshake with the coordinator at {} failed {} times: the "
                             "coordinator's key is not the cluster.public in this node's [security] keys "
                             "directory (keys of another cluster?), it runs with [security] mode = \"none\", "
                             "or {} is not a Longwave coordinator (cluster.coordinator)",
                             endpoint_, handshake_failures_, endpoint_)
               : fmt::format("the handshake with the coordinator at {} failed {} times: it runs with CURVE "
                             "([security] mode = \"curve\") and this process with mode = \"none\"",
                             endpoint_, handshake_failures_));
}

}  // namespace longwave::cluster
