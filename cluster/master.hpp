#pragma once
// The cluster's master: a ROUTER socket (with ZAP and a handshake monitor under CURVE) around the
// membership state machine (cluster/master_state.hpp). It admits the configured nodes, hands out ring
// positions, keeps the membership by epochs, and watches heartbeats until every node has finished. The user
// knows it as the `coordinator` subcommand.
#include <functional>
#include <string>
#include <vector>

#include "cluster/master_state.hpp"
#include "comm/curve.hpp"

namespace longwave::cluster {

/// Settings of the master role: its rules (master_settings), its socket, and what it reports.
struct master_options : master_settings {
  std::string bind_endpoint;  ///< e.g. "tcp://127.0.0.1:5600"
  /// CURVE: the master's key pair (the node keys it admits are master_settings::node_keys).
  comm::curve_key curve;
  /// Called before an unknown key is refused: true when it admitted new node keys (the master reads key files
  /// added to its key directory since it started: comm::node_key_refresh).
  std::function<bool()> refresh_keys;
  /// A refused handshake (a key not admitted, revoked, or no CURVE at all); from any thread.
  std::function<void(const comm::handshake_refusal&)> on_refused;
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
  /// One line of the event log (a JSON object, no newline): see cluster::record.
  std::function<void(const std::string& json)> on_record;
};

/// Runs the master until no member is left training: 0 when at least one finished the run, 1 when none did
/// (every one failed, was lost, or some never joined, or the quorum was lost), 130 on stop(). Membership goes
/// by epochs: a member that is silent past heartbeat_timeout, fails, or leaves is removed; the others get a
/// fence (abandon the all-reduce in flight, report what they hold) and then the next epoch's membership, with
/// the all-reduce every one of them holds the result of (see comm/elastic_ring.hpp). A removed member that
/// speaks again is told it was removed (errc::evicted). A listed node that is not training (absent at the
/// start, removed, restarted) may join the running cluster: it is told which members serve the state
/// (recover_msg), fetches it, says join_ready, and is admitted at the next fence if its state is the one the
/// members hold (else sent to fetch again). A hello with a live member's name from another process waits
/// until that member has been silent 3 s (then it is removed and the newcomer joins) and is turned away if
/// the member is still heard from 6 s later. Throws lw_error(errc::io_error) if bind_endpoint cannot be bound
/// (e.g. in use), lw_error(invalid_config) for a cluster without nodes.
int run_master(const master_options& opts);

}  // namespace longwave::cluster
