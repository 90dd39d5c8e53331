#pragma once
// The control plane of a cluster: the coordinator role (a ROUTER socket that admits the configured nodes,
// hands out ring positions, then watches heartbeats until every node has finished) and the node side
// (control_client: hello -> welcome, heartbeats, bye or error). One Envelope frame per message
// (comm/wire.capnp); every frame is validated by parse_envelope before use.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "comm/curve.hpp"
#include "comm/frame.hpp"
#include "runtime/errors/errors.hpp"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace longwave::comm {

/// One node the coordinator expects, in ring order.
struct member_spec {
  std::string name;
  std::string endpoint;  ///< the node's ring endpoint, as the cluster file gives it
  uint32_t workers = 1;
  uint64_t worker_offset = 0;  ///< global rank of its first worker (the coordinator fills it in)
};

/// One member as the coordinator sees it.
struct member_status {
  std::string name;
  bool joined = false;  ///< said hello
  bool alive = false;   ///< joined, and neither finished, failed nor silent past heartbeat_timeout
  double age_s = 0;     ///< seconds since its last message (since the coordinator started, before it joined)
};

/// Settings of the coordinator role.
struct coordinator_options {
  std::string bind_endpoint;  ///< e.g. "tcp://127.0.0.1:5600"
  uint64_t cluster_id = 0;
  /// The training fingerprint every hello must carry (0: not checked).
  uint64_t config_hash = 0;
  std::vector<member_spec> members;
  /// Every member must have said hello within this time of start, else the run is called off.
  std::chrono::milliseconds join_timeout{60000};
  /// A member that sends nothing (heartbeats included) for this long is removed from the membership (a new
  /// epoch without it). Nodes send a heartbeat every 2 s; before a member's first heartbeat after the
  /// welcome (while it loads its data and model) join_timeout applies instead.
  std::chrono::milliseconds heartbeat_timeout{6000};
  /// A member whose neighbour's ring lost it is removed once silent this long.
  std::chrono::milliseconds suspect_silence{2500};
  /// A member that does not answer a fence within this time is removed.
  std::chrono::milliseconds fence_timeout{4000};
  /// Nodes not in `members` may join the running cluster, with at most open_workers workers in all.
  bool open = false;
  uint32_t open_workers = 0;
  /// Fewer live members than this: the others wait up to quorum_timeout, then the run is stopped.
  size_t min_nodes = 1;
  std::chrono::milliseconds quorum_timeout{60000};
  /// CURVE: the coordinator's key pair, and the node keys it admits (each bound to its node name: a hello
  /// must come with its name's key). nullptr: no CURVE.
  curve_key curve;
  std::shared_ptr<const key_ring> node_keys;
  /// Called before an unknown key is refused: true when it admitted new node keys (the coordinator reads key
  /// files added to its key directory since it started: comm::node_key_refresh).
  std::function<bool()> refresh_keys;
  /// A refused handshake (a key not admitted, revoked, or no CURVE at all); from any thread.
  std::function<void(const handshake_refusal&)> on_refused;
  std::function<void(const std::string&)> info;  ///< progress lines (joins, finishes)
  std::function<void(const std::string&)> warn;  ///< problems (rejections, failures, missing nodes)
  std::function<bool()> stop;                    ///< polled every 100 ms; true ends the role (exit code 130)
  /// Membership, about every 100 ms: one entry per member in ring order.
  std::function<void(const std::vector<member_status>&)> on_status;
  /// A dropped control frame (its reject_reason name), and errors by reason ("node_lost", "rejected_join").
  std::function<void(const std::string& reason)> on_reject;
  std::function<void(const std::string& reason)> on_error;
  /// A new epoch began: its number, its member count, and why ("lost", "left", "failed", "ring_reset").
  std::function<void(uint64_t epoch, size_t members, const std::string& reason)> on_epoch;
  /// A node joined the running cluster with the state of `round`.
  std::function<void(const std::string& name, uint64_t round)> on_join;
  /// About every 100 ms: seconds the members have waited below min_nodes (0: quorum).
  std::function<void(double waited_s)> on_quorum_wait;
};

/// Runs the coordinator until no member is left training: 0 when at least one finished the run, 1 when none
/// did (every one failed, was lost, or some never joined, or the quorum was lost), 130 on stop(). Membership
/// goes by epochs: a member that is silent past heartbeat_timeout, fails, or leaves is removed; the others
/// get a fence (abandon the all-reduce in flight, report what they hold) and then the next epoch's
/// membership, with the all-reduce every one of them holds the result of (see comm/elastic_ring.hpp). A
/// removed member that speaks again is told it was removed (errc::evicted). A listed node that is not
/// training (absent at the start, removed, restarted) may join the running cluster: it is told which
/// members serve the state (recover_msg), fetches it, says join_ready, and is admitted at the next fence if
/// its state is the one the members hold (else sent to fetch again). A hello with a live member's name from
/// another process waits until that member has been silent restart_silence (3 s; then it is removed and the
/// newcomer joins) and is turned away if the member is still heard from 6 s later. Throws
/// lw_error(errc::io_error) if bind_endpoint cannot be bound (e.g. in use).
int run_coordinator(const coordinator_options& opts);

/// Something a node's control connection brought since the last control_client::poll.
struct control_event {
  enum class kind {
    notice,           ///< an error envelope from the coordinator: code and text (errc::none: information)
    fence,            ///< membership is changing to `epoch`
    membership,       ///< the members of a new epoch (`membership`)
    welcome,          ///< a (restarted) coordinator took this running node on in `epoch`
    leave,            ///< this node is asked to leave at its next round boundary
    stop,             ///< the cluster stops: round 0 asks where this node can stop, else stop after `round`
    connection_lost,  ///< the connection to the coordinator dropped (e.g. it was killed); text: its endpoint
    connection_back,  ///< connected again after a drop; text: its endpoint
    refused,          ///< the coordinator this node was connected to refuses its handshake now; text: why
  };
  kind what = kind::notice;
  errc code = errc::none;
  std::string text;
  uint64_t epoch = 0;
  membership_msg membership;
  uint64_t round = 0;  ///< kind::stop
};

/// A node's connection to the coordinator. Not thread-safe: one thread (the node's main thread) uses it.
class control_client {
 public:
  /// Connects (lazily; ZeroMQ retries) to the coordinator's endpoint.
  control_client(std::string coordinator_endpoint, uint64_t cluster_id);
  /// Connects to every address a coordinator may run at; messages go to the one that is connected (a
  /// message sent while none is, is dropped: hellos and heartbeats are repeated anyway). With `curve`, the
  /// connection is CURVE with this node's keys, pinned to the coordinator's public key.
  control_client(std::vector<std::string> coordinator_endpoints, uint64_t cluster_id,
                 std::optional<curve_peer> curve = std::nullopt);
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
  /// The answer to a stop query: this node holds after completing `round`. Never blocks.
  void stop_ack(uint64_t round);
  /// theta_global after `round` has CRC-32C theta_crc (the coordinator compares the members'). Never blocks.
  void committed(uint64_t round, uint32_t theta_crc);
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

 private:
  void send(const envelope& e);
  /// Sends e now and again every 2 s, and passes each control frame that arrives to `done` until it returns
  /// true (then true) or timeout passes (false). A frame of another cluster throws lw_error(invalid_config);
  /// other malformed frames are dropped.
  bool converse(const envelope& e, std::chrono::milliseconds timeout,
                const std::function<bool(const envelope&)>& done);
  /// One control frame from the coordinator, parsed, if one arrives within wait (nullopt: none, or a message
  /// of more than one frame).
  std::optional<frame_result<envelope>> receive(std::chrono::milliseconds wait);
  /// Sends body as this node (cluster id and rank filled in).
  void send_body(decltype(envelope::body) body);
  /// Opens the DEALER (and its monitor) and connects it to every endpoint; close() undoes it.
  void open();
  void close();
  void drain_monitor(std::vector<control_event>& out);
  /// Throws lw_error(invalid_config) naming the cause when the coordinator refused this node's key, or when
  /// handshakes keep failing before this node ever connected (keys of another cluster, CURVE on one side).
  void check_handshake();

  static constexpr std::chrono::seconds reopen_after{5};
  std::string endpoint_;
  std::vector<std::string> endpoints_;
  uint64_t cluster_id_;
  std::optional<curve_peer> curve_peer_;
  std::string routing_id_;
  std::optional<std::chrono::steady_clock::time_point> reopen_at_;  // open the socket again then
  unsigned opened_ = 0;                                             // times open() ran
  uint32_t rank_ = 0xffffffffu;
  std::unique_ptr<zmq::context_t> ctx_;
  std::unique_ptr<zmq::socket_t> sock_;
  std::unique_ptr<zmq::socket_t> monitor_;  // events of sock_: handshakes and disconnects
  bool connected_ = false, ever_connected_ = false;
  bool curve_ = false;
  bool auth_refused_ = false;           // the coordinator's ZAP handler refused this node's key
  int handshake_failures_ = 0;          // since the last successful handshake
  std::vector<control_event> pending_;  // drained by check_handshake, returned by the next poll
};

}  // namespace longwave::comm
