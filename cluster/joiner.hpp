#pragma once
// Joining a cluster: the hello and the first answer (a welcome, or where to fetch a running cluster's state),
// and the joiner that fetches the members' state and is admitted at a fence.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/training.hpp"
#include "cluster/cluster_file.hpp"
#include "cluster/control_client.hpp"
#include "cluster/state_fetcher.hpp"
#include "cluster/state_server.hpp"
#include "config/cluster_config.hpp"

namespace longwave::cluster {

/// Node `index`'s hello, with the checkpoints it holds (the newest last) and where it serves its state.
hello_msg hello_of(const config::cluster_spec& spec, size_t index,
                   const std::vector<runtime::held_round>& held, const std::string& state_endpoint);

/// Sets place's rank, epoch and every rank's name and endpoint; throws lw_error when an endpoint is malformed
/// or this node's place does not carry its own name and endpoint (another cluster file).
void place_in_ring(actors::ring_place& place, const config::cluster_node& me, uint32_t rank, uint64_t epoch,
                   const std::vector<peer_entry>& peers, const char* what);

/// Joins the cluster as node `index` with `hello` (hello_of). A cluster that is
/// starting answers with a welcome: sets its place in the ring and returns the round the cluster resumes
/// after. A cluster already training answers with where to fetch its state: returned in *recover (the node
/// then joins through its link's join). Throws lw_error when the answer is malformed or does not match
/// this cluster file, or the node is turned away.
uint64_t join(control_client& control, const config::cluster_spec& spec, size_t index, const hello_msg& hello,
              actors::ring_place& place, std::optional<recover_msg>& recover);

/// A node joining a running cluster (actors::cluster_link::join): fetches the members' state from the sources
/// the master named (or takes its own checkpoint when that is at the members' round), says it is ready, and
/// is admitted at a fence or sent to fetch again (the members moved on meanwhile).
///
/// versions (diloco.outer = "async"): the master names a version, not a round. The members hold it until
/// this node is admitted, so it fetches that version's state (waiting until they serve it), never its own
/// checkpoint, and trains from its first round on: there is no round to observe.
class joiner {
 public:
  /// same_theta: the members hold one theta after each round (not eager), so its own checkpoint of their
  /// round serves only if it holds that theta.
  joiner(control_client& control, const config::cluster_spec& spec, size_t index, hello_msg hello,
         recover_msg first, actors::ring_place& place, bool versions, bool same_theta)
      : control_(control),
        spec_(spec),
        me_(spec.nodes[index]),
        hello_(std::move(hello)),
        recover_(std::move(first)),
        place_(place),
        versions_(versions),
        same_theta_(same_theta) {}

  actors::joined_state operator()(const runtime::snapshot_shape& shape, actors::own_checkpoint own);

 private:
  /// Where the members serve their state (recover_.sources), by field.
  struct sources {
    std::vector<std::string> endpoints, names, keys;
  };
  /// The shared part and one member's worker state of one round.
  struct fetched_parts {
    std::optional<fetched_state> shared, own;
    std::string donor;  // the member whose worker state it is
  };
  /// Tests: LONGWAVE_FAULT_SLOW_JOIN_MS=N holds each fetched state N ms before saying it is ready, as a link
  /// slower than the round time would; LONGWAVE_FAULT_JOIN_GATE=PATH holds the first until PATH exists.
  void slow_link_fault();
  /// Says it holds `got` and waits to be admitted. A master restarted since the hello does not know the node
  /// (errc::not_announced): it says hello again, and says ready again while the members are still at
  /// got.round; else the new master's answer (a recover_msg) is the reply, and the caller fetches again.
  std::variant<membership_msg, recover_msg> ready(const actors::joined_state& got);
  /// Fetches the state recover_ names; the master may name another meanwhile (the members hold for this
  /// node): then that one.
  actors::joined_state fetch(const runtime::snapshot_shape& shape);
  actors::joined_state fetch_planned(const runtime::snapshot_shape& shape);
  /// Admitted with `got` into the membership `m`: its place in the ring and how it got the state.
  actors::joined_state admitted(const membership_msg& m, actors::joined_state got);
  /// One try: the shared part from every source, then the worker state from the first that serves it; the
  /// failure ("" when both came).
  std::string fetch_once(const sources& src, fetch_options& o, fetched_parts& got);
  /// Heartbeats while it fetches (the master keeps a joiner that is heard from); a stop turns it away, and
  /// the master's word that the members hold for it abandons the fetch in progress for that round's state.
  void beat();
  actors::joined_state assemble(fetched_parts& got, const runtime::snapshot_shape& shape, const sources& src,
                                double secs);

  control_client& control_;
  const config::cluster_spec& spec_;
  const config::cluster_node& me_;
  hello_msg hello_;
  recover_msg recover_;
  actors::ring_place& place_;
  bool versions_;
  bool same_theta_;
  std::chrono::steady_clock::time_point last_beat_;
  uint64_t last_fetch_bytes_ = 0;
  double last_fetch_seconds_ = 0;
  std::string last_source_;
  bool gate_passed_ = false;
};

}  // namespace longwave::cluster
