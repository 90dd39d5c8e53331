// The master's state machine (see master_state.hpp): removals, fences, admitting joiners, holding the members
// at a round boundary for them, the quorum.
#include <fmt/format.h>

#include <algorithm>

#include "cluster/master_state.hpp"

namespace longwave::cluster {

using namespace control;

namespace {
// A ring that fails again and again among live members (a blocked link, say) would be reset for ever: after
// this many resets without an all-reduce completing in between, the run is called off.
constexpr int max_resets = 3;
}  // namespace

/// Takes member i out of the membership and starts the next epoch without it; `text` is logged and, if it
/// is still running, sent to it.
void master_state::remove(size_t i, removal why, const std::string& text) {
  auto& m = members_[i];
  if (m.phase != member_phase::member) return;
  m.phase = member_phase::removed;
  m.removed = why;
  m.removed_why = text;
  warn("coordinator: " + text);
  note("removed", {{"node", specs_[i].name},
                   {"reason", to_string(why)},
                   {"why", text},
                   {"epoch", static_cast<int64_t>(epoch_)}});
  if (why == removal::lost) count_error("node_lost");
  if (m.identity && why != removal::left) tell_removed(m, text);
  start_fence(to_string(why), text);
}

void master_state::tell_removed(member& m, const std::string& why) {
  m.told_removed = now_;
  reply_error(
      *m.identity, errc::evicted,
      "this node was removed from the cluster (" + why + "); start it again with the same command to rejoin");
}

std::string master_state::removed_text(size_t i) const {
  const auto& why = members_[i].removed_why;
  return why.empty() ? "node " + specs_[i].name + " was removed in an earlier epoch" : why;
}

/// Every training member abandons its all-reduce and reports what it holds; restarts a fence in progress.
void master_state::start_fence(const std::string& reason, const std::string& why) {
  reset_wanted_ = false;
  const auto members = training_members();
  if (members.empty()) {
    fence_.reset();
    return;
  }
  const uint64_t epoch = std::max(epoch_, fence_ ? fence_->epoch : 0) + 1;
  fence_ = fence_state{epoch, now_, fence_ ? fence_->reason + ", " + reason : reason};
  for (auto i : members) {
    members_[i].acked = false;
    send_to(i, fence_msg{epoch});
  }
  info(fmt::format("coordinator: membership changes ({}): fencing epoch {} for {}", why, epoch,
                   names_of(members)));
}

/// Every member answered: the next epoch's ring (file order), and the all-reduce every member holds.
/// Joiners that hold the state after exactly that all-reduce are admitted; the others fetch again.
void master_state::conclude_fence() {
  auto members = training_members();
  // A member holds the all-reduce it committed last, or the one in flight whose result had arrived.
  std::optional<comm::reduce_key> commit;
  for (auto i : members) {
    const auto& a = members_[i].ack;
    const comm::reduce_key reached = a.has_pending && a.have_result ? a.pending : a.committed;
    if (!commit || reached < *commit) commit = reached;
  }
  if (!commit) return;
  // A joiner holding the state before an all-reduce whose result every member holds, none having committed
  // it (a node killed inside it, back from its checkpoint): they redo that all-reduce with it. Turned back,
  // it would fetch a state the members publish only once the fence lets them go on: below quorum, never (a
  // probe's run was called off).
  if (const auto floor = committed_floor(members); !merges_ && floor && *floor < *commit &&
                                                   ready_joiner_holds(floor->round) &&
                                                   !ready_joiner_holds(commit->round))
    commit = *floor;
  admit_joiners(*commit);
  members = training_members();
  if (below_quorum(members)) return;
  if (fence_->reason == "ring_reset" && ring_keeps_failing(*commit)) return;
  send_membership(members, *commit);
}

/// The all-reduce every member committed last, when they all committed the same one (an in-flight one's
/// result aside); none when they differ: a member that applied a later all-reduce cannot redo it.
std::optional<comm::reduce_key> master_state::committed_floor(const std::vector<size_t>& members) const {
  std::optional<comm::reduce_key> floor;
  for (auto i : members) {
    if (floor && members_[i].ack.committed != *floor) return std::nullopt;
    floor = members_[i].ack.committed;
  }
  return floor;
}

/// Whether a joiner ready to be admitted holds the state of `round`.
bool master_state::ready_joiner_holds(uint64_t round) const {
  return std::any_of(members_.begin(), members_.end(), [&](const member& m) {
    return m.phase == member_phase::ready && m.ready && m.ready->round == round;
  });
}

/// Fewer members than min_nodes: the fence stays (the members keep their state) until joiners make the
/// quorum up or quorum_timeout passes. A stop needs no quorum: while `longwave stop` is in progress the wait
/// (if any) ends, and the members finish the round in flight among themselves, then stop.
bool master_state::below_quorum(const std::vector<size_t>& members) {
  if (members.size() < s_.min_nodes && stop_) {
    quorum_deadline_.reset();
    info(
        fmt::format("coordinator: {} live node(s) ({}), below [cluster] min_nodes = {}, but the cluster is "
                    "stopping: they finish the round in flight among themselves, then stop",
                    members.size(), names_of(members), s_.min_nodes));
    return false;
  }
  if (members.size() < s_.min_nodes) {
    if (!quorum_deadline_) {
      quorum_deadline_ = now_ + s_.quorum_timeout;
      warn("coordinator: " + quorum_text() +
           fmt::format("; the members keep their state and wait up to {} for nodes to join",
                       secs(s_.quorum_timeout)));
      note("quorum", {{"state", "lost"},
                      {"members", list_of(members)},
                      {"min_nodes", static_cast<int64_t>(s_.min_nodes)}});
    }
    return true;
  }
  if (quorum_deadline_) {
    info(fmt::format("coordinator: quorum back: {} live nodes ({})", members.size(), names_of(members)));
    note("quorum", {{"state", "back"},
                    {"members", list_of(members)},
                    {"min_nodes", static_cast<int64_t>(s_.min_nodes)}});
    quorum_deadline_.reset();
  }
  return false;
}

/// A ring reset among live members: true (and the run is called off) after max_resets in a row without an
/// all-reduce completing in between.
bool master_state::ring_keeps_failing(const comm::reduce_key& commit) {
  resets_without_progress_ =
      last_reset_commit_ && *last_reset_commit_ == commit ? resets_without_progress_ + 1 : 1;
  last_reset_commit_ = commit;
  if (resets_without_progress_ <= max_resets) return false;
  const auto why = fmt::format(
      "the ring failed {} times in a row among live nodes without completing an all-reduce (after {}); last "
      "failure: {}; check the links between the nodes (firewalls, endpoints)",
      resets_without_progress_, comm::label_text(commit), last_ring_failure_);
  warn("coordinator: " + why);
  call_off(why, 1);
  return true;
}

/// The next epoch begins: every member gets its ring, its rank and the all-reduce they all keep.
void master_state::send_membership(const std::vector<size_t>& members, const comm::reduce_key& commit) {
  epoch_ = fence_->epoch;
  membership_msg mm;
  mm.epoch = epoch_;
  mm.commit = commit;
  for (size_t r = 0; r < members.size(); ++r) {
    mm.peers.push_back(peer_of(r, members[r]));
    mm.workers.push_back(specs_[members[r]].workers);
  }
  mm.keys = all_keys();
  remember_announced(mm.keys);
  for (size_t r = 0; r < members.size(); ++r) {
    mm.rank = static_cast<uint32_t>(r);
    send_to(members[r], mm);
  }
  info(fmt::format("coordinator: epoch {} ({}): ring {}; all-reduces after {} are redone", epoch_,
                   fence_->reason, names_of(members), comm::label_text(commit)));
  actions_.push_back(epoch_began{epoch_, members.size(), fence_->reason});
  note("epoch", {{"epoch", static_cast<int64_t>(epoch_)},
                 {"reason", fence_->reason},
                 {"members", list_of(members)},
                 {"round", static_cast<int64_t>(commit.round)},
                 {"fragment", static_cast<int64_t>(commit.fragment)}});
  fence_.reset();
  merge_members_changed();
}

/// Joiners ready with the state after `commit` become members (they answer this fence as holding it); the
/// others' fetch was overtaken (it took longer than what was left of a round): turn_back.
void master_state::admit_joiners(const comm::reduce_key& commit) {
  for (size_t i = 0; i < members_.size(); ++i) {
    auto& m = members_[i];
    if (m.phase != member_phase::ready) continue;
    // The members' state after `commit` is that of its round once the round's last all-reduce is in (a
    // published state covers whole rounds, and every member has reached at least its last key). async: the
    // newest version, once every member applied it (merges wait for the joiner; till then it stays ready).
    const uint64_t members_hold = merges_ ? static_cast<uint64_t>(merges_->version()) : commit.round;
    if (m.ready->round != members_hold)
      turn_back(i, commit);
    else if (!merges_ || all_applied(members_hold))
      admit(i, commit);
  }
}

/// Joiner i's state is stale. Fetching the newest again could be overtaken for ever (a slow link, fast
/// rounds), so the members hold at their next round boundary (watch_pin) and the joiner fetches that round's
/// state; it hears which once every member has said where it holds.
void master_state::turn_back(size_t i, const comm::reduce_key& commit) {
  auto& m = members_[i];
  if (merges_) {  // async: the members' version waits for it: fetch that one
    m.turned_back = m.ready->key;
    m.ready.reset();
    m.phase = member_phase::joining;
    return hold_merges_for(i);
  }
  const auto note = fmt::format(
      "the state of round {} (all-reduce {}/{}) is stale: the members hold all-reduce {}/{}; they hold at a "
      "round "
      "boundary for it",
      m.ready->round, m.ready->key.round, m.ready->key.fragment, commit.round, commit.fragment);
  info(fmt::format("coordinator: node {}: {}", specs_[i].name, note));
  m.turned_back = m.ready->key;
  m.ready.reset();
  m.phase = member_phase::joining;
  pin_for(i);
}

/// The members hold at a round boundary for joiner i (watch_pin): once they all said where, it is told to
/// fetch that round's state (at once when a pin already holds them).
void master_state::pin_for(size_t i) {
  members_[i].pinned = true;
  if (!pin_) {
    pin_ = pin_state{};
    for (auto& x : members_) x.pin_hold.reset();
  }
  if (pin_->round)
    send_recover(
        i, fmt::format("fetch the state of round {}: the members hold after it for this node", *pin_->round),
        *pin_->round);
}

/// Joiner i holds the members' state: a member from this fence's epoch on (it answers this fence).
void master_state::admit(size_t i, const comm::reduce_key& commit) {
  auto& m = members_[i];
  m.phase = member_phase::member;
  m.removed = removal::none;
  m.heard = false;  // join_timeout applies until its first heartbeat, while it starts its workers
  m.starting_since.reset();
  m.starting_said = false;
  m.suspected = false;
  m.leaving = false;
  m.last_seen = now_;
  m.acked = true;
  m.pinned = false;
  m.fetch_from.reset();
  m.turned_back.reset();
  m.ack = fence_ack_msg{fence_->epoch, commit, false, {}, false};
  m.round = m.ready->round;
  if (merges_) m.applied_version = m.ready->round;
  info(fmt::format("coordinator: node {} admitted in epoch {} with the state of {} {}", specs_[i].name,
                   fence_->epoch, merges_ ? "version" : "round", m.ready->round));
  actions_.push_back(node_joined{specs_[i].name, m.ready->round});
  note("admitted", {{"node", specs_[i].name},
                    {"round", static_cast<int64_t>(m.ready->round)},
                    {"epoch", static_cast<int64_t>(fence_->epoch)}});
}

/// A joiner while the cluster stops: it is not admitted, and told so (it exits 0).
void master_state::cancel_join(size_t i) {
  auto& m = members_[i];
  m.phase = member_phase::removed;
  m.ready.reset();
  m.removed_why = "node " + specs_[i].name + " is not admitted: the cluster is stopping";
  info("coordinator: " + m.removed_why);
  if (m.identity)
    reply_error(*m.identity, errc::cancelled,
                "the cluster is stopping (longwave stop): start this node again with the cluster");
}

/// Tells joiner i where to fetch the state: every training member that serves it, and the round the
/// members hold (`want`, when its state was stale; else the round they last reported).
void master_state::send_recover(size_t i, const std::string& note, std::optional<uint64_t> want) {
  recover_msg r;
  r.epoch = epoch_;
  r.note = note;
  std::optional<uint64_t> round;
  for (auto j : training_members()) {
    round = std::min(round.value_or(members_[j].round), members_[j].round);
    if (!members_[j].state_endpoint.empty())
      r.sources.push_back(
          {static_cast<uint32_t>(j), specs_[j].name, members_[j].state_endpoint, key_of(specs_[j].name)});
  }
  // async: a version, which every member reaches (merges wait for the joiner), not a round.
  r.round = want.value_or(merges_ ? static_cast<uint64_t>(merges_->version()) : round.value_or(0));
  r.worker_offset = specs_[i].worker_offset;
  if (const auto it = theta_crcs_.find(r.round);
      !merges_ && it != theta_crcs_.end() && mismatched_rounds_.count(r.round) == 0)
    r.theta_crc = it->second.first;
  members_[i].fetch_from.reset();  // its next heartbeat says it fetches
  members_[i].recover_sent = now_;
  send_to(i, std::move(r));
}

/// Joiners whose fetch was overtaken: once every member said where it can hold, all hold after the largest of
/// those rounds (R), and the joiners are told to fetch R's state; the query, then R, is re-sent every 2 s.
/// Once no joiner waits for it (admitted, gave up, or silent), the members go on.
std::optional<uint64_t> master_state::lowest_round() const {
  std::optional<uint64_t> low;
  for (auto j : training_members()) low = std::min(low.value_or(members_[j].round), members_[j].round);
  return low;
}

/// A joiner still fetching after the members completed two more rounds than when its fetch began: its
/// download is slower than their rounds, and a member serves only its two newest states, so each try would
/// be overtaken before it ends. The members hold at a round boundary for it, as for a stale state.
void master_state::watch_fetches() {
  const auto low = lowest_round();
  if (!low || stop_ || merges_) return;  // async: the members' version does not move while it fetches
  for (size_t i = 0; i < members_.size(); ++i) {
    auto& m = members_[i];
    if (m.phase != member_phase::joining || m.pinned || !m.fetch_from || *low < *m.fetch_from + 2) continue;
    info(fmt::format(
        "coordinator: node {} is still fetching the state it began with at round {}, and the members "
        "completed round {}: they hold at a round boundary for it",
        specs_[i].name, *m.fetch_from, *low));
    pin_for(i);
  }
}

void master_state::watch_pin() {
  if (!pin_) return;
  const bool waiting = std::any_of(members_.begin(), members_.end(), [](const member& m) {
    return m.pinned && (m.phase == member_phase::joining || m.phase == member_phase::ready);
  });
  if (!waiting) return release_pin();
  const auto members = training_members();
  const bool all_answered =
      std::all_of(members.begin(), members.end(), [&](size_t i) { return members_[i].pin_hold; });
  if (!pin_->round && all_answered) {
    uint64_t top = 0;
    for (auto i : members) top = std::max(top, *members_[i].pin_hold);
    pin_->round = top;
    pin_->sent = {};
    std::vector<size_t> joiners;
    for (size_t i = 0; i < members_.size(); ++i)
      if (members_[i].pinned && members_[i].phase == member_phase::joining) joiners.push_back(i);
    info(fmt::format("coordinator: the members ({}) hold after round {} while {} {} their state",
                     names_of(members), top, names_of(joiners), joiners.size() == 1 ? "fetches" : "fetch"));
    note(
        "pin",
        {{"round", static_cast<int64_t>(top)}, {"members", list_of(members)}, {"joiners", list_of(joiners)}});
    for (auto i : joiners)
      send_recover(
          i, fmt::format("fetch the state of round {}: the members hold after it for this node", top), top);
  }
  if (now_ - pin_->sent < hello_every) return;
  pin_->sent = now_;
  for (auto i : members)
    if (pin_->round || !members_[i].pin_hold) send_to(i, pin_msg{pin_->round.value_or(0), false});
}

/// No joiner waits for the pin any more: the members go on.
void master_state::release_pin() {
  for (auto i : training_members()) send_to(i, pin_msg{0, true});
  for (auto& m : members_) m.pin_hold.reset();
  if (pin_->round) {
    info(fmt::format("coordinator: the members go on after round {}", *pin_->round));
    note("release", {{"round", static_cast<int64_t>(*pin_->round)}});
  }
  pin_.reset();
}

std::string master_state::quorum_text() const {
  std::vector<size_t> gone;  // removed, or still fetching the state (a resume's)
  for (size_t i = 0; i < members_.size(); ++i)
    if (!training(i)) gone.push_back(i);
  const auto live = training_members();
  return fmt::format("quorum lost: {} live node(s) ({}), [cluster] min_nodes = {}; missing: {}", live.size(),
                     names_of(live), s_.min_nodes, names_of(gone));
}

}  // namespace longwave::cluster
