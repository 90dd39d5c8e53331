#pragma once
// A node's side of the control plane: its connection to the cluster's master (cluster/master.hpp): hello ->
// welcome, heartbeats, fence answers, bye or error. One Envelope frame per message (comm/wire.capnp); every
// frame is validated by parse_envelope before use.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "cluster/envelope.hpp"
#include "comm/curve.hpp"
#include "runtime/errors/errors.hpp"

namespace zmq {
class context_t;
class message_t;
class socket_t;
}  // namespace zmq

namespace longwave::cluster {

/// Something a node's control connection brought since the last control_client::poll.
struct control_event {
  enum class kind {
    notice,           ///< an error envelope from the coordinator: code and text (errc::none: information)
    fence,            ///< membership is changing to `epoch`
    membership,       ///< the members of a new epoch (`membership`)
    welcome,          ///< a (restarted) coordinator took this running node on in `epoch`
    leave,            ///< this node is asked to leave at its next round boundary
    stop,             ///< the cluster stops: round 0 asks where this node can stop, else stop after `round`
    pin,              ///< hold for a joiner: round 0 asks where this node can hold, else hold after `round`;
                      ///< `release`: go on
    connection_lost,  ///< the connection to the coordinator dropped (e.g. it was killed); text: its endpoint
    connection_back,  ///< connected again after a drop; text: its endpoint
    refused,          ///< the coordinator this node was connected to refuses its handshake now; text: why
    older_coordinator,  ///< a coordinator of an older term than this node follows spoke (ignored; once per
                        ///< term): `round` is its term, `epoch` the term followed
    recover,            ///< a joiner: fetch the state `recover` names instead (the members hold for it)
    merge,              ///< diloco.outer = "async": a merge (or drops) the coordinator announced (`merge`)
    nccl_id,            ///< comm.backend = "nccl": `epoch`'s communicator id from its rank 0 (`text`)
  };
  kind what = kind::notice;
  errc code = errc::none;
  std::string text;
  uint64_t epoch = 0;
  membership_msg membership;
  uint64_t round = 0;     ///< kind::stop, kind::pin
  bool release = false;   ///< kind::pin
  recover_msg recover{};  ///< kind::recover
  merge_msg merge{};      ///< kind::merge
};

/// A node's connection to the coordinator. Not thread-safe: one thread (the node's main thread) uses it.
class control_client {
 public:
  /// Connects (lazily; ZeroMQ retries) to the coordinator's endpoint.
  control_client(std::string coordinator_endpoint, uint64_t cluster_id);
  /// Connects to every address a coordinator may run at, a connection each; messages go to the coordinator
  /// this node follows (the one whose term is the newest it heard), or to every connected one before it
  /// follows any (a message sent while none is connected is dropped: hellos and heartbeats are repeated
  /// anyway). With `curve`, the connections are CURVE with this node's keys, pinned to the coordinator's
  /// public key.
  control_client(std::vector<std::string> coordinator_endpoints, uint64_t cluster_id,
                 std::optional<comm::curve_peer> curve = std::nullopt);
  ~control_client();
  control_client(const control_client&) = delete;
  control_client& operator=(const control_client&) = delete;

  /// Sends hello (again every 2 s, which tells the coordinator this process is still there) and waits for
  /// the answer. Throws lw_error with errc::deadline_missed ("cannot reach the
  /// coordinator at ... within N s"), errc::invalid_config (turned away: other cluster id, protocol version,
  /// unknown node name, a name another process has joined with; the message says which) or errc::peer_lost
  /// (the cluster was called off, e.g. other nodes missing at the join deadline).
  /// A cluster already training answers with recover_msg instead (the members to fetch the state from): the
  /// node then fetches it and calls join_ready.
  std::variant<welcome_msg, recover_msg> join(const hello_msg& hello, std::chrono::milliseconds timeout);
  /// A joiner holds the state after `ready.key`: waits (re-sending every 2 s) for its membership (admitted;
  /// this node's rank in it) or a new recover_msg (the state it fetched is stale: fetch again). Throws
  /// lw_error with the coordinator's reason when it is turned away, errc::deadline_missed on no answer.
  std::variant<membership_msg, recover_msg> join_ready(const join_ready_msg& ready,
                                                       std::chrono::milliseconds timeout);

  /// Tells the coordinator this node is alive, in `round` and `epoch`. Never blocks.
  void heartbeat(uint64_t round, uint64_t epoch = 0);
  /// Tells the coordinator this node is alive but still starting: its main loop, whose heartbeats say it
  /// trains, does not run yet (model, checkpoint, communicator). Never blocks.
  void starting();
  /// The answer to a fence (once the node's ring is idle). Never blocks.
  void fence_ack(const fence_ack_msg& ack);
  /// A training node re-announces itself (hello with running set) after its connection to the coordinator
  /// came back, e.g. to a restarted coordinator. Never blocks.
  void reannounce(const hello_msg& hello);
  /// Asks the coordinator to make node `name` leave at its next round boundary (`longwave node --leave`);
  /// returns the coordinator's answer: errc::none and what will happen, or the reason it cannot (e.g. the
  /// node is not training). Throws lw_error(errc::deadline_missed) when no answer comes within timeout.
  std::pair<errc, std::string> request_leave(const std::string& name, std::chrono::milliseconds timeout);
  /// Asks the coordinator to stop the whole cluster (`longwave stop`): every member finishes its current
  /// round, saves its checkpoint and exits. Returns the coordinator's answer (errc::none and what happens,
  /// or why it cannot); re-sent every 2 s until answered. Throws lw_error(errc::deadline_missed) when no
  /// answer comes within timeout, lw_error(invalid_config) when the handshake is refused.
  std::pair<errc, std::string> request_stop(std::chrono::milliseconds timeout);
  /// After request_stop was accepted (`longwave stop --wait`): asks again every 2 s until the coordinator
  /// says how the run ended: errc::none and its line once the nodes stopped or finished, another code and
  /// why otherwise. Each "still stopping" answer goes to `progress`. Throws lw_error(errc::deadline_missed)
  /// when the coordinator is silent for `silence` (gone before it said so).
  std::pair<errc, std::string> wait_stopped(std::chrono::milliseconds silence,
                                            const std::function<void(const std::string&)>& progress);
  /// The answer to a pin query: this node holds after completing `round`. Never blocks.
  void pin_ack(uint64_t round);
  /// The answer to a stop query: this node holds after completing `round`. Never blocks.
  void stop_ack(uint64_t round);
  /// theta_global after `round` has CRC-32C theta_crc (the coordinator compares the members'). Never blocks.
  void committed(uint64_t round, uint32_t theta_crc);
  /// diloco.outer = "async": this node's pseudo-gradient from version v_start is ready to merge (`tokens`
  /// trained). Never blocks.
  void contribute(const contribute_msg& c);
  /// comm.backend = "nccl": this node, rank 0 of `epoch`, made its communicator's unique id (hex) for the
  /// coordinator to hand to the other members. Never blocks.
  void nccl_id(uint64_t epoch, const std::string& id);
  /// comm.backend = "nccl": waits for `epoch`'s communicator id from its rank 0, which the coordinator hands
  /// on, saying every 2 s that this node is still starting; what else arrives meanwhile is kept for the next
  /// poll(). Throws lw_error(peer_lost) when none comes within timeout.
  std::string wait_nccl_id(uint64_t epoch, std::chrono::milliseconds timeout);
  /// A ring call failed without a fence. Never blocks.
  void ring_failed(const ring_failed_msg& failure);
  /// This node finished (reason "done") or stopped (e.g. "interrupted"). Waits up to 1 s for delivery.
  void bye(const std::string& reason);
  /// This node failed. Waits up to 1 s for delivery.
  void error(errc code, const std::string& message);

  /// What the coordinator sent since the last call (its verdicts, e.g. "node c lost") and drops of the
  /// connection and reconnections (a socket monitor). After a refused handshake (kind::refused) the socket
  /// is opened again 5 s later, since libzmq does not reconnect after one. Never blocks.
  std::vector<control_event> poll();

  const std::string& endpoint() const { return endpoint_; }
  /// The newest coordinator term this node has heard (0: none yet). Every message it sends carries it; a
  /// coordinator's message of an older term is ignored (two coordinators: the newer leads).
  uint64_t term() const { return term_; }

 private:
  /// Sends e with this node's term: over link `only` when given, else to the coordinator it follows while
  /// that connection is up, else to every connected one.
  void send(const envelope& e, std::optional<size_t> only = std::nullopt);
  /// Sends e now and again every 2 s, and passes each control frame that arrives to `done` until it returns
  /// true (then true) or timeout passes (false). A frame of another cluster throws lw_error(invalid_config);
  /// other malformed frames are dropped.
  bool converse(const envelope& e, std::chrono::milliseconds timeout,
                const std::function<bool(const envelope&)>& done);
  /// One control frame from the coordinator, parsed, if one arrives within wait (nullopt: none, or a message
  /// of more than one frame).
  std::optional<comm::frame_result<envelope>> receive(std::chrono::milliseconds wait);
  /// Sends body as this node (cluster id and rank filled in), as send() does.
  void send_body(decltype(envelope::body) body, std::optional<size_t> only = std::nullopt);
  /// One coordinator address: its DEALER and the monitor of that DEALER's handshakes.
  struct link {
    std::string endpoint;
    std::unique_ptr<zmq::socket_t> sock;
    std::unique_ptr<zmq::socket_t> monitor;
    bool up = false;
  };
  /// Opens a DEALER (and its monitor) per endpoint and connects it; close() undoes it.
  void open();
  link open_link(const std::string& endpoint);
  void close();
  void drain_monitor(std::vector<control_event>& out);
  void on_monitor_event(size_t i, int id, const std::string& address, std::vector<control_event>& out);
  /// One message from any connection, if one is waiting: its parts and the link it came by.
  bool recv_one(size_t& from, std::vector<zmq::message_t>& parts);
  /// A handshake of a node that was connected failed (monitor event `id`): the refusal event to report, once
  /// it is decisive.
  std::optional<control_event> refused_again(int id, const std::string& address);
  /// Throws lw_error(invalid_config) naming the cause when the coordinator refused this node's key, or when
  /// handshakes keep failing before this node ever connected (keys of another cluster, CURVE on one side).
  void check_handshake();
  /// Follows a newer term (and the link it came by); false for an older one, whose coordinator is then told
  /// the newer term (so it steps down) and, once per term, an older_coordinator event.
  bool follows(const envelope& e, size_t from);
  /// Sends the term this node follows to the coordinator at link i (a heartbeat of round 0).
  void tell_term(size_t i);

  static constexpr std::chrono::seconds reopen_after{5};
  std::string endpoint_;
  std::vector<std::string> endpoints_;
  uint64_t cluster_id_;
  std::optional<comm::curve_peer> curve_peer_;
  std::string routing_id_;
  std::optional<std::chrono::steady_clock::time_point> reopen_at_;  // open the socket again then
  unsigned opened_ = 0;                                             // times open() ran
  uint32_t rank_ = 0xffffffffu;
  uint64_t term_ = 0;
  uint64_t older_told_ = 0;  // the older term last reported
  std::unique_ptr<zmq::context_t> ctx_;
  std::vector<link> links_;                          // one per endpoint
  std::optional<size_t> leader_;                     // the link of the coordinator this node follows
  bool connected_ = false, ever_connected_ = false;  // some link is up; one was, once
  bool curve_ = false;
  bool auth_refused_ = false;           // the coordinator's ZAP handler refused this node's key
  int handshake_failures_ = 0;          // since the last successful handshake
  std::vector<control_event> pending_;  // drained by check_handshake, returned by the next poll
};

}  // namespace longwave::cluster
