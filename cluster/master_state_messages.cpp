// The master's state machine (see master_state.hpp): what a connection may send besides a hello (members'
// heartbeats, fence answers, byes and errors, joiners' readiness; stop and leave requests pass to
// master_state_requests.cpp), and the helpers that address the members.
#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <utility>

#include "cluster/master_state.hpp"

namespace longwave::cluster {

using namespace control;

namespace {
// Distinct connections remembered as running nodes of an earlier master (each is named once).
constexpr size_t max_strangers = 1024;
}  // namespace

void master_state::on_frame(const sender& from, const envelope& e, clock::time_point now) {
  now_ = now;
  if (exit_code_) return after_end(from, e);
  if (e.term > term_) {
    if (welcomed_) return step_down(from, e.term);
    newest_term_ = std::max(newest_term_, e.term);  // running nodes' master, for the takeover's term
  }
  if (auto* h = std::get_if<hello_msg>(&e.body)) {
    if (from.keyed_as && *from.keyed_as != h->node_name) {
      warn(fmt::format("coordinator: turned away a hello as node '{}' from {}: it came with node '{}''s key",
                       h->node_name, from.peer, *from.keyed_as));
      const auto why = fmt::format(
          "this connection's CURVE key is node '{}''s, not node '{}''s: each node uses its own "
          "keys/nodes/NAME.secret",
          *from.keyed_as, h->node_name);
      // The join deadline names it and exits 2, as for any hello turned away (a probe: exit 1, unnamed).
      if (index_of_name(h->node_name)) turned_away_[h->node_name] = why;
      return turn_away(from.identity, errc::invalid_config, why);
    }
    return on_hello(from, *h);
  }
  if (auto* l = std::get_if<leave_msg>(&e.body)) {
    if (from.keyed_as && *from.keyed_as != l->node) {
      warn(fmt::format("coordinator: refused a leave for node '{}' from {}: it came with node '{}''s key",
                       l->node, from.peer, *from.keyed_as));
      return reply_error(
          from.identity, errc::invalid_config,
          fmt::format("only node '{}''s own key may ask it to leave (this connection has node '{}''s)",
                      l->node, *from.keyed_as));
    }
    return on_leave(from, *l);
  }
  if (auto* sb = std::get_if<standby_msg>(&e.body)) return on_standby(from, *sb);
  const auto idx = index_of_identity(from.identity);
  if (auto* st = std::get_if<stop_msg>(&e.body); st && st->answer && !idx)
    // A member's answer, queued while its coordinator went away, reaching one that took the cluster over: the
    // member says it again once welcomed (stop_follower). It was taken for a `longwave stop`.
    return dropped(
        fmt::format("coordinator: dropped a stop answer from {}: this coordinator does not know "
                    "that node yet",
                    from.peer));
  if (std::holds_alternative<stop_msg>(e.body) && !idx) {
    if (from.keyed_as && *from.keyed_as != comm::operator_user_id)
      return reply_error(
          from.identity, errc::invalid_config,
          fmt::format("only the cluster's own key (keys/cluster.secret, the coordinator's) may stop "
                      "the cluster; this connection has node '{}''s",
                      *from.keyed_as));
    return on_stop_request(from);
  }
  if (!idx) return from_stranger(from, e);
  if (from.keyed_as && *from.keyed_as != specs_[*idx].name) {
    // Another node's key using this member's routing id: never let it speak for the member.
    return dropped(
        fmt::format("coordinator: dropped a message for node {} from {}: it came with node '{}''s key",
                    specs_[*idx].name, from.peer, *from.keyed_as));
  }
  on_member_message(*idx, e);
}

void master_state::on_bad_frame(const sender& from, const comm::rejection& why) {
  dropped(fmt::format("coordinator: dropped a control frame from {}: {}", from.peer, why.message()));
  actions_.push_back(frame_rejected{comm::to_string(why.reason)});
  if (why.reason == comm::reject_reason::wrong_cluster)
    turn_away(from.identity, errc::invalid_config,
              "wrong cluster id: this coordinator serves another cluster");
}

void master_state::on_bad_parts(size_t parts) {
  dropped(fmt::format("coordinator: dropped a control message of {} frames (want 1 after the routing id)",
                      parts));
}

/// A message from the process that holds member i's name.
void master_state::on_member_message(size_t i, const envelope& e) {
  auto& m = members_[i];
  m.last_seen = now_;
  if (m.phase == member_phase::joining || m.phase == member_phase::ready) return on_joiner_message(i, e);
  if (m.removed != removal::none) return on_removed_message(i, e);
  if (auto* hb = std::get_if<heartbeat_msg>(&e.body); hb && hb->starting) return on_starting(i);
  if (!m.heard) m.heard_at = now_;  // anything else but a hello comes from its main loop
  m.heard = true;
  if (auto* hb = std::get_if<heartbeat_msg>(&e.body)) {
    m.round = std::max(m.round, hb->round);  // a member's round never goes back (a term notice says 0)
  } else if (auto* st = std::get_if<stop_msg>(&e.body)) {
    if (!stop_ && welcomed_ && training(i) && st->answer && st->round > 0) carry_on_stop(i);
    if (stop_ && training(i) && st->round > 0 && !m.stop_hold) m.stop_hold = st->round;
  } else if (auto* p = std::get_if<pin_msg>(&e.body)) {
    if (pin_ && training(i) && p->round > 0 && !m.pin_hold) m.pin_hold = p->round;
  } else if (auto* c = std::get_if<committed_msg>(&e.body)) {
    on_committed(i, *c);
  } else if (auto* b = std::get_if<bye_msg>(&e.body)) {
    on_bye(i, *b);
  } else if (auto* er = std::get_if<error_msg>(&e.body)) {
    const auto code = static_cast<errc>(er->code);  // none: a node's exit, its message says why
    remove(i, removal::failed,
           code == errc::none
               ? fmt::format("node {} failed: {}", specs_[i].name, er->message)
               : fmt::format("node {} failed ({}): {}", specs_[i].name, to_string(code), er->message));
  } else if (auto* fa = std::get_if<fence_ack_msg>(&e.body)) {
    if (fence_ && fa->epoch == fence_->epoch && training(i)) {
      m.acked = true;
      m.ack = *fa;
    }
  } else if (auto* rf = std::get_if<ring_failed_msg>(&e.body)) {
    on_ring_failed(i, *rf);
  } else if (auto* c = std::get_if<contribute_msg>(&e.body)) {
    on_contribute(i, *c);
  } else if (auto* n = std::get_if<nccl_id_msg>(&e.body)) {
    on_nccl_id(i, *n);
  }
}

/// Member i applied round c.round (async: version c.round): its theta's CRC is compared with the others'.
void master_state::on_committed(size_t i, const committed_msg& c) {
  // Async, a takeover pending: a version applied since its re-announcement is where merges go on from.
  if (auto& m = members_[i]; s_.async && m.phase == member_phase::announced && m.announce)
    m.announce->committed.round = std::max(m.announce->committed.round, c.round);
  if (!training(i)) return;
  compare_theta(i, c);
  if (!merges_) return;
  merges_->applied(static_cast<int64_t>(c.round));  // its ring is over
  members_[i].applied_version = std::max(members_[i].applied_version, c.round);
}

/// comm.backend = "nccl": the current epoch's rank 0 made its communicator's id; the epoch's other members
/// get it. An id of another epoch, or from another rank, is dropped.
void master_state::on_nccl_id(size_t i, const nccl_id_msg& n) {
  const auto members = training_members();
  if (members.empty() || members[0] != i || n.epoch != epoch_)
    return dropped(
        fmt::format("coordinator: dropped an NCCL id of epoch {} from node {}: the current epoch is {} "
                    "and its rank 0 is {}",
                    n.epoch, specs_[i].name, epoch_, members.empty() ? "none" : specs_[members[0]].name));
  const std::vector<size_t> others(members.begin() + 1, members.end());
  for (auto j : others) send_to(j, n);
  info(fmt::format("coordinator: epoch {}'s NCCL id from {} goes to {}", epoch_, specs_[i].name,
                   others.empty() ? "no other member" : names_of(others)));
}

/// A message from a node that is not a member any more: it stops when it hears so (said again at most every
/// 10 s).
void master_state::on_removed_message(size_t i, const envelope& e) {
  auto& m = members_[i];
  const bool last_words =
      std::holds_alternative<bye_msg>(e.body) || std::holds_alternative<error_msg>(e.body);
  if (m.removed != removal::left && now_ - m.told_removed > std::chrono::seconds(10) && !last_words)
    tell_removed(m, removed_text(i));
}

/// A joiner's messages: heartbeats while it fetches, join_ready once it holds a state, bye or error when it
/// gives up. (A stop turns every joiner away first: on_stop_request.)
void master_state::on_joiner_message(size_t i, const envelope& e) {
  auto& m = members_[i];
  if (auto* r = std::get_if<join_ready_msg>(&e.body)) return on_join_ready(i, *r);
  // Its first heartbeat after it was told where to fetch (not one from its start-up): the fetch has begun.
  auto* hb = std::get_if<heartbeat_msg>(&e.body);
  if (hb && !hb->starting && m.phase == member_phase::joining && !m.fetch_from) m.fetch_from = lowest_round();
  if (std::holds_alternative<bye_msg>(e.body) || std::holds_alternative<error_msg>(e.body)) {
    m.phase = member_phase::removed;
    m.ready.reset();
    m.removed_why = fmt::format("node {} gave up joining", specs_[i].name);
    warn("coordinator: " + m.removed_why);
  }
}

void master_state::on_bye(size_t i, const bye_msg& b) {
  auto& m = members_[i];
  if (b.reason != "done" && b.reason != "stopped")
    return remove(i, removal::left, fmt::format("node {} left: {}", specs_[i].name, b.reason));
  m.phase = member_phase::finished;
  m.stopped = b.reason == "stopped";
  if (!m.stopped)
    info(fmt::format("coordinator: node {} finished", specs_[i].name));
  else if (merges_)  // async: each node stops at its own phase's end; the cluster's count is versions
    info(
        fmt::format("coordinator: node {} stopped at the end of its phase, holding version {}, with its "
                    "checkpoint",
                    specs_[i].name, m.applied_version));
  else
    info(fmt::format("coordinator: node {} stopped after round {} with its checkpoint", specs_[i].name,
                     stop_ && stop_->round ? *stop_->round : m.round));
}

/// A member's ring failed: a fence follows once the node it lost (if named) is heard from or removed. The
/// same link failing again in the ring re-formed around it (no round completed in between) while both its
/// ends answer is a cut link: the
/// node at its far end leaves the membership (and is told so), and the others go on without it.
void master_state::on_ring_failed(size_t i, const ring_failed_msg& rf) {
  if (rf.epoch != epoch_ || fence_) return;  // already being dealt with
  warn(fmt::format("coordinator: node {}'s ring failed in epoch {}{}: {}", specs_[i].name, rf.epoch,
                   rf.suspect.empty() ? "" : " (it lost " + rf.suspect + ")", rf.reason));
  last_ring_failure_ = fmt::format("node {}: {}", specs_[i].name, rf.reason);
  const auto previous = std::exchange(last_failed_link_, std::nullopt);
  if (rf.suspect.empty()) {
    reset_wanted_ = true;
    return;
  }
  last_failed_link_ = failed_link{i, rf.suspect, rf.epoch, members_[i].round};
  for (size_t j = 0; j < members_.size(); ++j) {
    if (!training(j) || specs_[j].name != rf.suspect) continue;
    // Again, in a later epoch, with no round completed in between.
    if (previous && previous->from == i && previous->to == rf.suspect && previous->epoch < rf.epoch &&
        previous->round == members_[i].round && members_[j].heard)
      return remove(
          j, removal::lost,
          fmt::format("node {} lost: the ring link {} -> {} failed in epochs {} and {} while both "
                      "nodes answer the coordinator (the link between them is cut): the cluster "
                      "goes on without {}",
                      rf.suspect, specs_[i].name, rf.suspect, previous->epoch, rf.epoch, rf.suspect));
    if (!members_[j].suspected) {
      members_[j].suspected = true;
      members_[j].suspected_at = now_;
    }
  }
  reset_wanted_ = true;
}

/// `longwave stop`: every member is asked where it can stop (watch_stop sends the query and, once all have
/// answered, the round); the requester is told what happens. Before training began, the master and the
/// nodes that joined stop at once (stop_before_start).
/// A member's theta_global CRC after a round, against the first one reported for that round: a mismatch means
/// the members no longer train one model (named once per round, counted as theta_mismatch).
void master_state::compare_theta(size_t i, const committed_msg& c) {
  auto [at, fresh] = theta_crcs_.emplace(c.round, std::make_pair(c.theta_crc, i));
  if (!fresh && at->second.first != c.theta_crc && mismatched_rounds_.insert(c.round).second) {
    warn(
        fmt::format("coordinator: theta after round {} differs between nodes: {} has {:08x}, {} has {:08x}; "
                    "they no longer "
                    "train one model",
                    c.round, specs_[at->second.second].name, at->second.first, specs_[i].name, c.theta_crc));
    count_error("theta_mismatch");
  }
  // Rounds far behind the newest are settled: keep the tables small.
  const uint64_t newest = theta_crcs_.rbegin()->first;
  while (theta_crcs_.begin()->first + 64 < newest) theta_crcs_.erase(theta_crcs_.begin());
  while (!mismatched_rounds_.empty() && *mismatched_rounds_.begin() + 64 < newest)
    mismatched_rounds_.erase(mismatched_rounds_.begin());
}

/// A message from a connection that has not said hello. A member's heartbeat, bye or error means a node that
/// joined an earlier master (this one was restarted): named once, then only counted.
void master_state::from_stranger(const sender& from, const envelope& e) {
  const bool claims_member = e.sender < members_.size() && !std::holds_alternative<hello_msg>(e.body);
  if (claims_member && strangers_.size() < max_strangers && strangers_.insert(from.identity).second) {
    const auto& name = specs_[e.sender].name;
    running_elsewhere_.insert(name);
    // No round named: the first message read may be one the node queued while no coordinator listened.
    info(fmt::format(
        "coordinator: node {} ({}) is training under an earlier coordinator; waiting for it to re-announce "
        "itself",
        name, from.peer));
    return;
  }
  if (strangers_.count(from.identity)) return;
  if (std::holds_alternative<join_ready_msg>(e.body)) {
    // A joiner that said hello to an earlier coordinator (this one restarted while it fetched): it must
    // announce itself again before it can be admitted.
    reply_error(
        from.identity, errc::not_announced,
        "this coordinator does not know this node (it was restarted while the node joined): say hello "
        "again");
    dropped(
        fmt::format("coordinator: a node at {} says it is ready to join but has not said hello to this "
                    "coordinator; told it to say hello again",
                    from.peer));
    return;
  }
  dropped(fmt::format("coordinator: dropped a control message from {}, which has not said hello", from.peer));
}

/// A dropped control message: logged (the first logged_drops, then every drop_log_every-th) and counted.
void master_state::dropped(const std::string& text) {
  const uint64_t n = ++n_dropped_;
  if (n > logged_drops && n % drop_log_every != 0) return;
  std::string note;
  if (n == logged_drops)
    note = fmt::format(" ({} control messages dropped; from now on every {}th is logged)", n, drop_log_every);
  else if (n > logged_drops)
    note = fmt::format(" ({} control messages dropped so far)", n);
  warn(text + note);
}

// ---- helpers ----

void master_state::reply(const std::string& identity, decltype(envelope::body) body) {
  envelope e;
  e.cluster_id = s_.cluster_id;
  e.sender = no_rank;
  e.term = term_;
  e.body = std::move(body);
  actions_.push_back(send{identity, std::move(e)});
}

void master_state::send_to(size_t i, decltype(envelope::body) body) {
  reply(*members_[i].identity, std::move(body));
}

void master_state::reply_error(const std::string& identity, errc code, const std::string& message) {
  reply(identity, error_msg{static_cast<uint16_t>(code), message.substr(0, max_message_bytes)});
}

/// Turns a hello away with an error reply, counted as a rejected join.
void master_state::turn_away(const std::string& identity, errc code, const std::string& message) {
  count_error("rejected_join");
  reply_error(identity, code, message);
}

/// The welcome of the member at position `rank` of `members` (file indices in ring order).
void master_state::send_welcome(const std::vector<size_t>& members, size_t rank) {
  welcome_msg w;
  w.rank = static_cast<uint32_t>(rank);
  w.world_size = static_cast<uint32_t>(members.size());
  w.start_round = start_round();
  w.epoch = epoch_;
  for (size_t r = 0; r < members.size(); ++r) w.peers.push_back(peer_of(r, members[r]));
  w.keys = all_keys();
  remember_announced(w.keys);
  send_to(members[rank], std::move(w));
  members_[members[rank]].last_seen = now_;
}

bool master_state::any_training() const {
  for (size_t i = 0; i < members_.size(); ++i)
    if (training(i)) return true;
  return false;
}

bool master_state::any_ready() const {
  return std::any_of(members_.begin(), members_.end(),
                     [](const member& m) { return m.phase == member_phase::ready; });
}

bool master_state::all_joined() const {
  return std::all_of(members_.begin(), members_.end(),
                     [](const member& m) { return m.identity.has_value(); });
}

bool master_state::all_announced() const {
  return std::all_of(members_.begin(), members_.end(),
                     [](const member& m) { return m.phase == member_phase::announced; });
}

std::vector<size_t> master_state::training_members() const {
  std::vector<size_t> out;
  for (size_t i = 0; i < members_.size(); ++i)
    if (training(i)) out.push_back(i);
  return out;
}

std::string master_state::names_of(const std::vector<size_t>& idx) const {
  std::vector<std::string> names;
  for (auto i : idx) names.push_back(specs_[i].name);
  return join_names(names);
}

std::string master_state::list_of(const std::vector<size_t>& idx) const {
  std::string out;
  for (auto i : idx) out += (out.empty() ? "" : ",") + specs_[i].name;
  return out;
}

std::string master_state::ring_text(const std::vector<size_t>& members) const {
  std::string out;
  for (size_t r = 0; r < members.size(); ++r)
    out += fmt::format("{}{}={}", r ? " -> " : "", r, specs_[members[r]].name);
  return out;
}

std::optional<size_t> master_state::index_of_identity(const std::string& id) const {
  for (size_t i = 0; i < members_.size(); ++i)
    if (members_[i].identity && *members_[i].identity == id) return i;
  return std::nullopt;
}

std::optional<size_t> master_state::index_of_name(const std::string& name) const {
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return i;
  return std::nullopt;
}

/// CURVE: node `name`'s public key ("" without CURVE).
std::string master_state::key_of(const std::string& name) const {
  return s_.node_keys ? s_.node_keys->key_of(name) : "";
}

/// The member at file index i, at position `rank` of a ring.
peer_entry master_state::peer_of(size_t rank, size_t i) const {
  return {static_cast<uint32_t>(rank), specs_[i].name, specs_[i].endpoint, key_of(specs_[i].name)};
}

/// CURVE: every node key admitted (what members admit on their ring and state sockets).
std::vector<peer_entry> master_state::all_keys() const {
  std::vector<peer_entry> out;
  if (s_.node_keys)
    for (const auto& [name, key] : s_.node_keys->entries()) out.push_back({0, name, "", key});
  return out;
}

/// The node keys the members were told of, so that a key read later is announced with a new epoch.
void master_state::remember_announced(const std::vector<peer_entry>& keys) {
  for (const auto& k : keys) keys_announced_.insert(k.public_key);
}

}  // namespace longwave::cluster
