// The standby's look at the other coordinator addresses (see standby.hpp): a DEALER per address that never
// sends, whose handshakes and ZMTP heartbeats say whether a master listens there.
#include "cluster/standby.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <thread>
#include <zmq.hpp>

#include "cluster/control_common.hpp"
#include "cluster/control_text.hpp"
#include "cluster/envelope.hpp"
#include "comm/zmq_monitor.hpp"

namespace longwave::cluster {
namespace {

using clock = std::chrono::steady_clock;

struct look {
  std::string endpoint;
  std::unique_ptr<zmq::socket_t> sock;
  std::unique_ptr<zmq::socket_t> monitor;
  bool up = false;
  bool foreign = false;      // a master of another cluster answered here: it is not looked at again
  clock::time_point told{};  // the last Standby sent (at once on each handshake, then every hello_every)
};

// Connects one look; heartbeats make a hung leader (stopped, not closed) count as unreachable.
look open_look(zmq::context_t& ctx, const std::string& endpoint, const std::optional<comm::curve_key>& curve,
               int n) {
  look l;
  l.endpoint = endpoint;
  l.sock = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
  l.sock->set(zmq::sockopt::linger, 0);
  l.sock->set(zmq::sockopt::heartbeat_ivl, 1000);
  l.sock->set(zmq::sockopt::heartbeat_timeout, 3000);
  if (curve) comm::make_curve_client(*l.sock, *curve, curve->public_key);
  const std::string monitor = fmt::format("inproc://longwave-standby-monitor-{}", n);
  if (zmq_socket_monitor(l.sock->handle(), monitor.c_str(),
                         ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED) != 0)
    throw zmq::error_t();
  l.monitor = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::pair);
  l.monitor->set(zmq::sockopt::linger, 0);
  l.monitor->connect(monitor);
  l.sock->connect(endpoint);
  return l;
}

// Reads the looks' monitors; the first that answers, if any.
const look* update(std::vector<look>& looks) {
  const look* answering = nullptr;
  for (auto& l : looks) {
    while (const auto e = comm::next_monitor_event(*l.monitor)) l.up = e->id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED;
    if (l.up && !l.foreign && !answering) answering = &l;
  }
  return answering;
}

// What a master sent: the bye of a cluster that ended, or the turn-away of a master of another cluster.
struct word {
  const look* from;
  bool foreign;  // another cluster's master (another [cluster] id): it never leads this one
  std::string text;
};

// Tells each answering master that this one stands by, and reads what they sent.
std::optional<word> converse(std::vector<look>& looks, const standby_options& o, clock::time_point now) {
  envelope e;
  e.cluster_id = o.cluster_id;
  e.body = standby_msg{o.address};
  for (auto& l : looks) {
    if (l.foreign) continue;
    // Read first, up or not: a leader that says bye closes right after, and its disconnect may come first.
    zmq::message_t in;
    while (l.sock->recv(in, zmq::recv_flags::dontwait)) {
      auto parsed = parse_envelope(in.data(), in.size(), o.cluster_id);
      if (!parsed && parsed.error().reason == comm::reject_reason::wrong_cluster) {
        l.foreign = true;
        return word{&l, true, parsed.error().detail};
      }
      if (!parsed) continue;
      if (auto* b = std::get_if<bye_msg>(&parsed.value().body)) return word{&l, false, b->reason};
    }
    if (!l.up) {
      l.told = {};
    } else if (now - l.told >= control::hello_every) {
      auto msg = control::to_message(build_envelope(e));
      (void)l.sock->send(msg, zmq::send_flags::dontwait);
      l.told = now;
    }
  }
  return std::nullopt;
}

void close_looks(std::vector<look>& looks) {
  for (auto& l : looks) {
    zmq_socket_monitor(l.sock->handle(), nullptr, 0);
    l.monitor.reset();
    l.sock.reset();
  }
}

}  // namespace

standby_result stand_by(const standby_options& o) {
  if (o.others.empty()) return {};
  zmq::context_t ctx(1);
  std::vector<look> looks;
  int n = 0;  // each look's monitor gets a name of its own, a failed one's included
  for (const auto& ep : o.others) {
    try {
      looks.push_back(open_look(ctx, ep, o.curve, n++));
    } catch (const zmq::error_t& e) {  // e.g. a malformed address: nobody leads from there
      if (o.info) o.info(fmt::format("coordinator: cannot look for a coordinator at {}: {}", ep, e.what()));
    }
  }
  const auto started = clock::now();
  std::optional<clock::time_point> last_up;
  std::string leader;
  standby_result result;
  for (;;) {
    if (o.stop && o.stop()) {
      result.end = standby_end::stopped;
      break;
    }
    const auto now = clock::now();
    const look* l = update(looks);
    if (const auto said = converse(looks, o, now); said && said->foreign) {
      const auto what = fmt::format("the coordinator at {} serves a different cluster ({})",
                                    said->from->endpoint, said->text);
      // Fatal only while no master of this cluster answers: else this one stands by that one, as before.
      if (const look* own = update(looks)) {
        if (o.info)
          o.info(
              fmt::format("coordinator: {}; this one stands by the coordinator at {}", what, own->endpoint));
        continue;
      }
      result = {standby_end::foreign, what + ": start every role from the same cluster file"};
      break;
    } else if (said) {
      // A master that ended while another still answers (two led at once): that one leads on.
      const look* ended = said->from;
      const auto& why = said->text;
      if (std::none_of(looks.begin(), looks.end(), [&](const look& x) { return x.up && &x != ended; })) {
        result = {standby_end::ended, why};
        break;
      }
      if (o.info)
        o.info(
            fmt::format("coordinator: the coordinator at {} ended ({}), but another answers: this one stands "
                        "by on",
                        ended->endpoint, why));
    }
    if (l) {
      if (!last_up && o.info)
        o.info(fmt::format(
            "coordinator: the coordinator at {} leads the cluster; this one stands by until it has been "
            "unreachable for {}",
            l->endpoint, cluster::control::secs(o.silence)));
      last_up = now;
      leader = l->endpoint;
    } else if (!last_up && now - started >= o.first_look) {
      break;  // nobody else listens: this master leads
    } else if (last_up && now - *last_up >= o.silence) {
      if (o.info)
        o.info(
            fmt::format("coordinator: the coordinator at {} has been unreachable for {}: this one takes over",
                        leader, cluster::control::secs(o.silence)));
      result.end = standby_end::take_over;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  close_looks(looks);
  return result;
}

}  // namespace longwave::cluster
