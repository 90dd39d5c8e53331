// The master's state machine (see master_state.hpp): asynchronous merges (diloco.outer = "async"). The
// members report each contribution as they finish their inner steps; cluster/merge_window.hpp decides when a
// merge closes, and every training member is told which contributions version v merges, so the members run
// its all-reduce together (the others relaying zeros). No merge is announced while a fence or a stop is in
// progress, nor while a node joins: the members serve the state of the version it was told to fetch (they
// train on meanwhile, folding their phases into the contributions they hold) until it is admitted at a fence.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "cluster/master_state.hpp"

namespace longwave::cluster {

namespace {

/// Merges kept for resend_merges: with async.max_in_flight = 1 a member misses at most one.
constexpr size_t k_resent_merges = 16;

double seconds_between(clock::time_point from, clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

bool same_entries(const std::vector<merge_entry>& a, const std::vector<merge_entry>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const merge_entry& x, const merge_entry& y) {
    return x.node == y.node && x.v_start == y.v_start && x.tokens == y.tokens && x.parts == y.parts;
  });
}

merge_entry entry_of(const contribution& c) {
  return {c.node, static_cast<uint64_t>(c.v_start), static_cast<uint64_t>(c.tokens),
          static_cast<uint32_t>(c.parts)};
}

}  // namespace

void master_state::on_contribute(size_t i, const contribute_msg& c) {
  if (!merges_ || !training(i)) {
    dropped(fmt::format("coordinator: dropped a contribution of node {}: {}", specs_[i].name,
                        merges_ ? "it is not training" : "this cluster's outer steps are not asynchronous"));
    return;
  }
  // A phase's counts lie far below 2^53; a confused or hostile peer's larger ones would overflow the window's
  // sums and differences.
  constexpr uint64_t most = uint64_t{1} << 53;
  if (c.tokens == 0 || c.tokens > most || c.v_start > most) {
    dropped(
        fmt::format("coordinator: dropped a contribution of node {}: version {} and {} tokens are no phase's",
                    specs_[i].name, c.v_start, c.tokens));
    return;
  }
  // One sent again (on a welcome, after a takeover or a dropped link) is taken once, merged or not.
  auto& m = members_[i];
  if (c.seq != 0 && m.identity && m.contributed.first == *m.identity && c.seq <= m.contributed.second) return;
  if (c.seq != 0 && m.identity) m.contributed = {*m.identity, c.seq};
  const contribution got{specs_[i].name, static_cast<int64_t>(c.v_start), static_cast<int64_t>(c.tokens), 1};
  if (auto d = merges_->arrive(got, seconds_between(start_, now_))) {
    note_drop(*d);
    send_to(i, merge_msg{static_cast<uint64_t>(merges_->version()), {}, {entry_of(d->c)}});
  }
}

void master_state::note_drop(const drop& d) {
  std::string why = to_string(d.reason);
  if (d.reason == drop_reason::stale) {
    why = fmt::format("{} versions old, above async.max_staleness", d.staleness);
  } else if (d.reason == drop_reason::left) {  // the membership lost it: say how (a SIGKILL is "lost")
    if (const auto i = index_of_name(d.c.node); i && members_[*i].removed != removal::none)
      why = fmt::format("its node is no longer a member ({})", to_string(members_[*i].removed));
  }
  if (d.reason == drop_reason::past_end)  // a phase that ended as the last version merged: expected
    info(
        fmt::format("coordinator: node {}'s contribution from version {} is not merged: version {} was the "
                    "run's last",
                    d.c.node, d.c.v_start, merges_->version()));
  else
    warn(fmt::format("coordinator: dropped node {}'s contribution from version {} ({} tokens): {}", d.c.node,
                     d.c.v_start, d.c.tokens, why));
  note("dropped", {{"node", d.c.node},
                   {"reason", to_string(d.reason)},
                   {"v_start", d.c.v_start},
                   {"staleness", d.staleness},
                   {"tokens", d.c.tokens}});
}

void master_state::watch_merges() {
  if (!merges_ || fence_ || stop_) return;  // a stop: the members apply what was announced, nothing more
  if (joiners_hold_merges()) return;
  auto m = merges_->poll(seconds_between(start_, now_));
  if (!m) return;
  merge_msg msg{static_cast<uint64_t>(m->version), {}, {}};
  int64_t tokens = 0, oldest = m->version - 1;
  std::string names;
  for (const auto& c : m->merged) {
    msg.merged.push_back(entry_of(c));
    tokens += c.tokens;
    oldest = std::min(oldest, c.v_start);
    names += (names.empty() ? "" : ",") + c.node;
  }
  for (size_t i = 0; i < members_.size(); ++i)
    if (training(i)) send_to(i, msg);
  announced_.push_back(msg);
  while (announced_.size() > k_resent_merges) announced_.pop_front();
  note("merge", {{"version", m->version},
                 {"nodes", names},
                 {"tokens", tokens},
                 {"max_staleness", m->version - 1 - oldest},
                 {"grace_ms", static_cast<int64_t>(std::llround((m->due_s - m->opened_s) * 1000))},
                 {"held_ms", static_cast<int64_t>(std::llround((m->closed_s - m->due_s) * 1000))}});
  if (m->version == s_.async->last_version)
    info(fmt::format("coordinator: version {} is the run's last (train.rounds): no merge follows it",
                     m->version));
}

/// A node joining: the members' version stays where it is until it is admitted (or gives up or falls silent),
/// so the state it fetches is the one the members hold. A joiner ready with that version is admitted at a
/// fence once every member applied it (no all-reduce is left that the joiner would have to take part in).
bool master_state::joiners_hold_merges() {
  bool joining = false;
  for (size_t i = 0; i < members_.size(); ++i) {
    const auto& m = members_[i];
    if (m.phase == member_phase::joining) joining = true;
    if (m.phase != member_phase::ready) continue;
    joining = true;
    if (all_applied(m.ready->round)) {
      start_fence("join", "node " + specs_[i].name + " joins");
      return true;
    }
  }
  return joining;
}

/// A member that re-announced itself after its link dropped may have missed announcements (a ROUTER drops
/// what it sends to a peer without a connection): the ones it has not applied go again, which it takes once.
void master_state::resend_merges(size_t i) {
  for (const auto& m : announced_)
    if (m.version > members_[i].applied_version) send_to(i, m);
}

bool master_state::all_applied(uint64_t version) const {
  for (auto j : training_members())
    if (members_[j].applied_version < version) return false;
  return true;
}

/// Joiner i is told to fetch the members' newest version (announced: every member applies it); no merge
/// comes before it is admitted.
void master_state::hold_merges_for(size_t i) {
  const auto v = static_cast<uint64_t>(merges_->version());
  info(fmt::format("coordinator: merges wait at version {} while node {} fetches the members' state", v,
                   specs_[i].name));
  send_recover(
      i, fmt::format("fetch the state of version {}: no merge comes before this node is admitted", v), v);
}

void master_state::resume_merges(const std::vector<size_t>& present) {
  if (!s_.async) return;
  // Merges go on from the newest version a member applied (its last all-reduce's round), or from the newest
  // the earlier master announced that a member still holds unapplied: those go again (a member that missed
  // one takes it, the others hold it), so no other merge gets their version. The contributions pending at
  // the earlier master are reported again by their nodes.
  uint64_t newest = 0, told = 0;
  for (auto i : present) {
    members_[i].applied_version = members_[i].announce->committed.round;
    newest = std::max(newest, members_[i].applied_version);
    told = std::max(told, members_[i].announce->newest_told);
  }
  std::map<uint64_t, merge_msg> held;
  for (auto i : present)
    for (const auto& m : members_[i].announce->merging) {
      if (m.version <= newest || m.merged.empty()) continue;
      const auto [at, first] = held.emplace(m.version, merge_msg{m.version, m.merged, {}});
      if (!first && !same_entries(at->second.merged, m.merged))
        warn(
            fmt::format("coordinator: node {} holds another merge of version {} than an earlier node: the "
                        "earlier node's is announced",
                        specs_[i].name, m.version));
    }
  announced_.clear();
  uint64_t top = newest;
  for (const auto& [v, m] : held) {
    if (v != top + 1) break;  // past a gap none can be applied
    top = v;
    announced_.push_back(m);
  }
  // Merges past the hellos' lists (more than max_held_merges in flight) are applied by those told of them.
  top = std::max(top, told);
  if (top > newest)
    info(
        fmt::format("coordinator: the members hold the earlier coordinator's merges of versions {} to {}, "
                    "not yet applied: announcing them again; merges go on after version {}",
                    newest + 1, top, top));
  merges_.emplace(*s_.async, static_cast<int64_t>(top), static_cast<int64_t>(newest));
  merge_members_changed();
}

void master_state::merge_members_changed() {
  if (!s_.async) return;
  if (!merges_) {
    // A cluster restarted from its checkpoints merges on from the newest version a member holds.
    uint64_t newest = 0;
    for (const auto& m : members_) newest = std::max(newest, m.start_version);
    merges_.emplace(*s_.async, static_cast<int64_t>(newest));
  }
  std::set<std::string> names;
  for (size_t i = 0; i < members_.size(); ++i)
    if (training(i)) names.insert(specs_[i].name);
  for (const auto& d : merges_->set_members(names, seconds_between(start_, now_))) note_drop(d);
}

}  // namespace longwave::cluster
