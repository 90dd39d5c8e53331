// The master's state machine (see master_state.hpp): the start of training, the takeover of a running
// cluster, watching the members, and the end of the run.
#include "cluster/master_state.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace longwave::cluster {

using namespace control;

const char* to_string(member_phase p) {
  switch (p) {
    case member_phase::absent: return "absent";
    case member_phase::waiting: return "waiting";
    case member_phase::announced: return "announced";
    case member_phase::member: return "member";
    case member_phase::joining: return "joining";
    case member_phase::ready: return "ready";
    case member_phase::finished: return "finished";
    case member_phase::removed: return "removed";
  }
  return "?";
}

const char* to_string(removal r) {
  switch (r) {
    case removal::none: return "";
    case removal::absent: return "absent";
    case removal::lost: return "lost";
    case removal::left: return "left";
    case removal::failed: return "failed";
  }
  return "?";
}

master_state::master_state(master_settings s, clock::time_point start)
    : s_(std::move(s)), start_(start), now_(start), specs_(s_.members), members_(s_.members.size()) {
  if (specs_.empty()) throw lw_error(errc::invalid_config, "coordinator: the cluster has no nodes");
  if (s_.term_slot >= term_slots)
    throw lw_error(errc::invalid_config,
                   fmt::format("coordinator: at most {} coordinator addresses", term_slots));
  term_ = term_slots + s_.term_slot;
  std::vector<size_t> all;
  for (auto& sp : specs_) {
    sp.worker_offset = listed_workers_;
    listed_workers_ += sp.workers;
    all.push_back(all.size());
  }
  note("start", {{"term", static_cast<int64_t>(term_)},
                 {"nodes", list_of(all)},
                 {"min_nodes", static_cast<int64_t>(s_.min_nodes)}});
}

void master_state::info(std::string s) {
  actions_.push_back(line{false, std::move(s)});
}
void master_state::warn(std::string s) {
  actions_.push_back(line{true, std::move(s)});
}
void master_state::count_error(std::string reason) {
  actions_.push_back(error_counted{std::move(reason)});
}
void master_state::note(std::string kind, std::vector<std::pair<std::string, record::value>> fields) {
  actions_.push_back(record{std::move(kind), std::move(fields)});
}

std::vector<action> master_state::take_actions() {
  std::vector<action> out;
  out.swap(actions_);
  return out;
}

void master_state::tick(clock::time_point now) {
  now_ = now;
  if (exit_code_) return;
  if (!welcomed_)
    tick_before_start();
  else
    tick_training();
}

void master_state::on_paused(ms gap, clock::time_point now) {
  now_ = now;
  if (exit_code_ || !welcomed_) return;
  warn(fmt::format(
      "coordinator: this process did not run for {} (suspended?); the members get {} to be heard again "
      "before any is judged lost",
      secs(gap), secs(s_.heartbeat_timeout)));
  for (auto& m : members_) m.last_seen = std::max(m.last_seen, now_);
  if (fence_) fence_->started += gap;
  if (quorum_deadline_) *quorum_deadline_ += gap;
}

void master_state::interrupt() {
  if (exit_code_) return;
  warn("coordinator: interrupted (Ctrl-C or SIGTERM): calling the cluster off; its nodes are told");
  call_off("the coordinator was stopped", 130);
}

/// Joining, or taking over nodes that are already training (this master was restarted); then the welcome.
void master_state::tick_before_start() {
  if (stop_) return stop_before_start();
  if (takeover_since_) {
    if (all_announced() || now_ - *takeover_since_ > s_.heartbeat_timeout) take_over();
    return;
  }
  if (all_joined()) return welcome_all();
  if (now_ - start_ > s_.join_timeout) call_off_at_join_deadline();
}

/// The join deadline passed: training begins with the nodes that joined if they make min_nodes, else the
/// run is called off naming the missing ones.
void master_state::call_off_at_join_deadline() {
  std::vector<std::string> missing, joined;
  for (size_t i = 0; i < members_.size(); ++i)
    (members_[i].identity ? joined : missing).push_back(specs_[i].name);
  if (!joined.empty() && joined.size() >= s_.min_nodes && s_.min_nodes < members_.size()) {
    info(
        fmt::format("coordinator: join deadline of {} passed with {} of {} nodes ({}); [cluster] min_nodes = "
                    "{}: starting "
                    "without {}",
                    secs(s_.join_timeout), joined.size(), members_.size(), join_names(joined), s_.min_nodes,
                    join_names(missing)));
    return welcome_all();
  }
  if (s_.took_over && joined.empty() && turned_away_.empty() && running_elsewhere_.empty()) {
    info(fmt::format(
        "coordinator: no node said hello within {} of this standby taking over: the run it stood by for has "
        "ended (or its nodes are gone); nothing to lead",
        secs(s_.join_timeout)));
    exit_code_ = 0;
    return note_end("nothing_to_lead");
  }
  std::string why =
      fmt::format("join deadline of {} passed: missing node(s) {}{}", secs(s_.join_timeout),
                  join_names(missing), joined.empty() ? "" : " (joined: " + join_names(joined) + ")");
  // A missing node that said hello and was turned away: its settings or this coordinator's are wrong.
  std::vector<std::string> refused, elsewhere;
  for (const auto& name : missing)
    if (turned_away_.count(name)) refused.push_back(name);
  for (const auto& name : running_elsewhere_)
    if (!turned_away_.count(name)) elsewhere.push_back(name);
  if (!refused.empty())
    why += fmt::format("; node(s) {} said hello and were turned away: {}", join_names(refused),
                       turned_away_.at(refused.front()));
  if (!elsewhere.empty())
    why += fmt::format(
        "; node(s) {} are training under an earlier coordinator but did not re-announce themselves (a "
        "Longwave without takeover?): stop them and restart the whole cluster to resume from its checkpoints",
        join_names(elsewhere));
  warn("coordinator: " + why);
  call_off(why, refused.empty() ? 1 : 2);
}

/// Every listed node, or (past the join deadline) at least min_nodes of them, begins training.
void master_state::welcome_all() {
  const auto plan = plan_resume();
  start_round_ = plan.round;
  for (size_t i = 0; i < members_.size(); ++i) {
    auto& m = members_[i];
    if (std::find(plan.fetch.begin(), plan.fetch.end(), i) != plan.fetch.end()) continue;  // below
    if (m.phase == member_phase::waiting) {
      m.phase = member_phase::member;
      m.round = std::max(m.round, start_round());  // until it reports: a joiner fetches no older round
    } else if (m.phase == member_phase::absent) {
      m.phase = member_phase::removed;
      m.removed = removal::absent;
      m.removed_why = "node " + specs_[i].name + " had not said hello when training began";
      note("removed",
           {{"node", specs_[i].name}, {"reason", "absent"}, {"epoch", static_cast<int64_t>(epoch_)}});
    }
  }
  welcomed_ = true;
  const auto members = training_members();
  for (size_t r = 0; r < members.size(); ++r) send_welcome(members, r);
  info(fmt::format("coordinator: {} nodes joined; ring {}; {}",
                   members.size() == members_.size()
                       ? fmt::format("all {}", members.size())
                       : fmt::format("{} of {}", members.size(), members_.size()),
                   ring_text(members),
                   start_round() == 0 ? std::string("starting at round 1")
                                      : fmt::format("resuming after round {}", start_round())));
  actions_.push_back(epoch_began{epoch_, members.size(), "start"});
  note("epoch", {{"epoch", static_cast<int64_t>(epoch_)},
                 {"reason", "start"},
                 {"members", list_of(members)},
                 {"round", static_cast<int64_t>(start_round())}});
  merge_members_changed();
  // Those without a checkpoint of the round fetch the members' state and are admitted at a fence (on_join).
  say_plan(plan, members);
  for (auto i : plan.fetch) start_fetch(i);
  // Fewer holders of the round than min_nodes: they hold at a fence, keeping their state, until the nodes
  // that fetch it make the quorum up (or quorum_timeout_s passes), as after a loss.
  if (!plan.fetch.empty() && members.size() < s_.min_nodes)
    start_fence("quorum",
                fmt::format("{} of the nodes hold round {}, below [cluster] min_nodes = {}; {} fetch it",
                            names_of(members), start_round(), s_.min_nodes, names_of(plan.fetch)));
}

/// Adopts the nodes that re-announced themselves: their epoch as it stands when they all report the same
/// one with all its members, else a fence into the next epoch among them. Those that did not re-announce
/// within heartbeat_timeout of the first are taken as gone.
void master_state::take_over() {
  welcomed_ = true;
  term_ = (std::max(term_, newest_term_) / term_slots + 1) * term_slots + s_.term_slot;
  uint64_t top = 0;
  bool same = true;
  std::vector<size_t> present;
  for (size_t i = 0; i < members_.size(); ++i) {
    auto& m = members_[i];
    if (m.phase != member_phase::announced) {
      m.phase = member_phase::removed;
      m.removed = removal::lost;
      m.removed_why = "node " + specs_[i].name +
                      " did not announce itself to this coordinator, which took the cluster over";
      note("removed", {{"node", specs_[i].name},
                       {"reason", "lost"},
                       {"why", "it did not announce itself to this coordinator, which took the cluster over"},
                       {"epoch", static_cast<int64_t>(epoch_)}});
      continue;
    }
    present.push_back(i);
    m.phase = member_phase::member;
    m.heard = true;
    m.round = m.announce->committed.round;
    same = same && (top == 0 || m.announce->epoch == top);
    top = std::max(top, m.announce->epoch);
  }
  same = same && present.size() == members_[present.front()].announce->world_size;
  epoch_ = top;
  info(fmt::format(
      "coordinator: took over the running cluster: {} in epoch {} (last applied round {}, term {})",
      names_of(present), top, members_[present.front()].announce->committed.round, term_));
  note("takeover", {{"epoch", static_cast<int64_t>(top)},
                    {"members", list_of(present)},
                    {"round", static_cast<int64_t>(members_[present.front()].announce->committed.round)},
                    {"term", static_cast<int64_t>(term_)}});
  // A hold the earlier master set for a joiner (Pin) is not this one's: the members go on.
  for (auto i : present) send_to(i, pin_msg{0, true});
  resume_merges(present);
  // The welcome: on it an async node reports its unanswered contribution again, after the merges it missed
  // (one of them may answer it). Through a fence too, under async: a membership is no welcome.
  welcome_msg w;
  w.world_size = static_cast<uint32_t>(present.size());
  w.epoch = epoch_;
  if (same || merges_)
    for (auto i : present) {
      if (merges_) resend_merges(i);
      send_to(i, w);
    }
  if (same) {
    // Nothing changed while there was no master: the nodes carry on in their epoch.
    actions_.push_back(epoch_began{epoch_, present.size(), "start"});
    return;
  }
  start_fence("takeover", "a restarted coordinator found the nodes in different epochs or some missing");
}

/// A node follows a master of a newer term: another master took the cluster over (it was cut off from this
/// one, or both started at once). This one leads no more: it says so and ends without a run summary.
void master_state::step_down(const sender& from, uint64_t newer) {
  const auto idx = index_of_identity(from.identity);
  warn(fmt::format(
      "coordinator: {} follows the coordinator of term {}, newer than this one's ({}): another coordinator "
      "leads the cluster; this one steps down",
      idx ? "node " + specs_[*idx].name : "a node at " + from.peer, newer, term_));
  exit_code_ = 0;
  note_end("stepped_down", {{"newer_term", static_cast<int64_t>(newer)}},
           fmt::format("this coordinator stepped down: a newer one (term {}) leads the cluster", newer));
}

/// Training: watch the members and change the membership when one goes, until none is left training.
void master_state::tick_training() {
  if (!any_training()) return outcome();
  watch();
  if (stop_) watch_stop();
  watch_fetches();
  watch_pin();
  watch_merges();
  if (quorum_deadline_ && now_ > *quorum_deadline_) {
    const auto why =
        quorum_text() + fmt::format(": no node joined within quorum_timeout_s ({})", secs(s_.quorum_timeout));
    warn("coordinator: " + why + "; calling the run off");
    return call_off(why, 1);
  }
}

/// Silent members leave the membership; a fence completes or times out; a ring reset waits for its
/// suspects to be heard from (alive) or to be removed.
void master_state::watch() {
  for (size_t i = 0; i < members_.size(); ++i)
    if (training(i)) watch_silence(i);
  const auto join_limit = std::max(s_.heartbeat_timeout, s_.join_timeout);
  for (size_t i = 0; i < members_.size(); ++i) {
    auto& m = members_[i];
    // A joiner fetching the state sends a heartbeat at least every few seconds.
    const bool joiner = m.phase == member_phase::joining || m.phase == member_phase::ready;
    if (joiner && now_ - m.last_seen > join_limit) {
      m.phase = member_phase::removed;
      m.removed = removal::lost;  // (an earlier `left` would keep it from being told)
      m.ready.reset();
      m.removed_why =
          fmt::format("node {} stopped joining: nothing heard for {}", specs_[i].name, secs(join_limit));
      warn("coordinator: " + m.removed_why);
    }
  }
  if (fence_) return watch_fence();
  if (!reset_wanted_) return;
  for (auto i : training_members())
    if (members_[i].suspected) return;
  start_fence("ring_reset", "a ring failed");
}

/// Removes member i once silent past its limit (shorter once a neighbour's ring lost it).
void master_state::watch_silence(size_t i) {
  auto& m = members_[i];
  const auto silence = since(m.last_seen);
  // From its welcome on, a member says every 2 s that it is still starting (building its model, loading its
  // checkpoint), then heartbeats; before its first word after the welcome, its way there is allowed for.
  const auto limit = m.heard || m.starting_since ? s_.heartbeat_timeout
                                                 : std::max(s_.heartbeat_timeout, first_word_allowance);
  if (m.suspected && m.last_seen > m.suspected_at && m.heard) m.suspected = false;
  // A member still starting (no heartbeat yet: loading its data and model) is not lost for a ring that could
  // not reach it; the reset waits for its first heartbeat.
  // The round its last heartbeat (every 2 s) said: rounds may be faster than that.
  if (m.suspected && m.heard && silence > s_.suspect_silence)
    remove(i, removal::lost,
           fmt::format("node {} lost: its neighbour's ring dropped it and nothing heard for {} (its last "
                       "heartbeat said round {})",
                       specs_[i].name, secs(s_.suspect_silence), m.round));
  else if (silence > limit)
    remove(i, removal::lost,
           fmt::format("node {} lost: nothing heard for {} (its last heartbeat said round {})",
                       specs_[i].name, secs(limit), m.round));
}

/// A fence in progress: members that do not answer in time are removed; it concludes once every member
/// answered, unless the quorum is short.
void master_state::watch_fence() {
  for (size_t i = 0; i < members_.size() && fence_; ++i) {
    // A node still starting (no heartbeat yet) answers once its main loop runs; one that says it is still
    // starting is waited for while it does (watch_silence removes it when it falls silent), and its limit
    // counts from its first heartbeat.
    const auto& m = members_[i];
    const auto limit = m.heard ? s_.fence_timeout : std::max(s_.fence_timeout, s_.join_timeout);
    const bool starting = m.starting_since && !m.heard;
    if (training(i) && !m.acked && !starting && now_ - std::max(fence_->started, m.heard_at) > limit)
      remove(i, removal::lost,
             fmt::format("node {} lost: no answer to the fence of epoch {} within {}", specs_[i].name,
                         fence_->epoch, secs(limit)));
  }
  // Below the quorum: until a joiner is ready, the cluster is stopping (or quorum_timeout passes).
  if (!fence_ || (quorum_deadline_ && !any_ready() && !stop_)) return;
  for (auto i : training_members())
    if (!members_[i].acked) return;
  conclude_fence();
}

/// A stop in progress: once every member said where it holds, the round after which all stop is the
/// largest of those (no member has passed it). The query, then the round, is re-sent every 2 s to the
/// members that still need it (a dropped connection loses messages; both are idempotent at the node).
void master_state::watch_stop() {
  const auto members = training_members();
  if (!stop_->round) decide_stop(members);
  if (now_ - stop_->sent < hello_every) return;
  stop_->sent = now_;
  // async: a node's rounds are its own phases; each stops after the one it holds after.
  for (auto i : members)
    if (stop_->round || !members_[i].stop_hold)
      send_to(i, stop_msg{stop_->round ? (merges_ ? *members_[i].stop_hold : *stop_->round) : 0});
}

/// Once every member said where it holds: the round after which all stop.
void master_state::decide_stop(const std::vector<size_t>& members) {
  std::optional<uint64_t> top;
  for (auto i : members) {
    if (!members_[i].stop_hold) return;
    // async: no merge is announced during a stop, and a node leaves no ring behind: each waits until every
    // member applied the last merge announced.
    if (merges_ && static_cast<int64_t>(members_[i].applied_version) < merges_->version()) return;
    top = std::max(top.value_or(0), *members_[i].stop_hold);
  }
  if (!top) return;
  stop_->round = *top;
  stop_->sent = {};
  info(merges_ ? fmt::format("coordinator: every node stops where it holds, at version {} ({})",
                             merges_->version(), names_of(members))
               : fmt::format("coordinator: every node stops after round {} ({})", *top, names_of(members)));
}

/// No member is left training: 0 when one finished the run, else 1; names the members that left on the way.
void master_state::outcome() {
  std::vector<size_t> finished, gone;
  for (size_t i = 0; i < members_.size(); ++i)
    (members_[i].phase == member_phase::finished ? finished : gone).push_back(i);
  // A joiner still fetching or waiting for its fence: nothing is left to join. Told so, it exits 0.
  for (auto i : gone) {
    const auto& m = members_[i];
    if (!m.identity || (m.phase != member_phase::joining && m.phase != member_phase::ready)) continue;
    info(fmt::format("coordinator: node {} was still joining when the run ended: it is told so",
                     specs_[i].name));
    reply_error(
        *m.identity, errc::cancelled,
        finished.empty()
            ? "the run ended before this node was admitted: no member is left training (failed, lost or "
              "left), so nothing is left to join"
            : fmt::format("the run ended before this node was admitted: its members trained to the end, "
                          "so nothing is left to join; {} hold{} the run's final state",
                          names_of(finished), finished.size() == 1 ? "s" : ""));
  }
  // Why each did not finish: lost, left or failed, else what it was doing (a node not in the file of an open
  // cluster counts as absent until admitted: it was still joining).
  const auto why_gone = [&](size_t i) {
    const auto& m = members_[i];
    if (m.removed != removal::none && m.removed != removal::absent) return std::string(to_string(m.removed));
    if (m.phase == member_phase::joining || m.phase == member_phase::ready)
      return std::string("still joining");
    return std::string(m.removed == removal::absent ? "absent" : to_string(m.phase));
  };
  std::string removed;  // "n2:lost,n3:left"
  for (auto i : gone)
    removed += fmt::format("{}{}:{}", removed.empty() ? "" : ",", specs_[i].name, why_gone(i));
  if (finished.empty()) {
    const auto line = "no node finished the run (failed, lost or left: " + names_of(gone) + ")";
    info("coordinator: " + line);
    exit_code_ = 1;
    return note_end("none_finished", {{"removed", removed}}, line);
  }
  // Stopped: every node that finished stopped where `longwave stop` asked, whoever left on the way.
  const bool stopped = stop_ && stop_->round && std::all_of(finished.begin(), finished.end(), [&](size_t i) {
                         return members_[i].stopped;
                       });
  std::string detail;  // "n2 (lost), n3 (left)"
  for (auto i : gone)
    detail += fmt::format("{}{} ({})", detail.empty() ? "" : ", ", specs_[i].name, why_gone(i));
  const std::string on_the_way = gone.empty() ? "" : "; removed on the way: " + detail;
  const std::string who = gone.empty() ? "every node" : names_of(finished);
  std::string line;
  if (stopped)
    line = merges_
               ? fmt::format(
                     "{} stopped at the end of its phase, at version {} (longwave stop){}; the "
                     "same commands resume the run",
                     who, merges_->version(), on_the_way)
               : fmt::format("{} stopped after round {} (longwave stop){}; the same commands resume the run",
                             who, *stop_->round, on_the_way);
  else
    line = gone.empty() ? "every node finished"
                        : fmt::format("the run finished on {}{}", names_of(finished), on_the_way);
  info("coordinator: " + line);
  exit_code_ = 0;
  std::vector<std::pair<std::string, record::value>> fields{{"finished", list_of(finished)},
                                                            {"removed", removed}};
  if (stopped) fields.emplace_back("stop_round", static_cast<int64_t>(*stop_->round));
  note_end(stopped ? "stopped" : "finished", std::move(fields), line);
}

/// The event log's last record: how the master's work ended (`outcome`) and its exit code; `longwave stop
/// --wait` is told `summary`.
void master_state::note_end(const std::string& outcome,
                            std::vector<std::pair<std::string, record::value>> fields, std::string summary) {
  fields.insert(fields.begin(),
                {{"outcome", outcome}, {"exit_code", static_cast<int64_t>(exit_code_.value_or(0))}});
  fields.emplace_back("epoch", static_cast<int64_t>(epoch_));
  note("end", std::move(fields));
  const auto said = summary.empty() ? "the coordinator ended: " + outcome : summary;
  answer_stop_waiters(outcome, said);
  // The cluster ends with this master, unless another leads it now: its standbys end too.
  if (outcome != "stepped_down")
    for (const auto& [address, identity] : standbys_)
      reply(identity, bye_msg{("the cluster ended (" + outcome + "): " + said).substr(0, max_message_bytes)});
}

/// Tells every joined node that the cluster is off; done() is `code`.
void master_state::call_off(const std::string& why, int code) {
  // A training node stops on errc::evicted; a joining one reports peer_lost. A removed node's new process
  // fetching the state is told too (a probe's went on asking for it for 2 minutes).
  end_notice_ = {welcomed_ ? errc::evicted : errc::peer_lost, "the cluster was called off: " + why};
  for (auto& m : members_)
    if (m.identity && m.phase != member_phase::finished &&
        (m.removed == removal::none || m.phase == member_phase::joining || m.phase == member_phase::ready)) {
      reply_error(*m.identity, end_notice_.first, end_notice_.second);
      m.told_end = s_.await_last_words;
      m.told_removed = now_;
    }
  exit_code_ = code;
  note_end(code == 130 ? "interrupted" : "called_off", {{"why", why}}, "the cluster was called off: " + why);
}

bool master_state::awaiting_last_words(clock::time_point now) const {
  for (const auto& m : members_)
    if (m.told_end && now - m.last_seen <= s_.heartbeat_timeout) return true;
  for (const auto& w : told_waiters_)
    if (now - w.last_seen <= 2 * hello_every) return true;
  return false;
}

void master_state::after_end(const sender& from, const envelope& e) {
  for (auto& w : told_waiters_)
    if (w.identity == from.identity && std::holds_alternative<stop_msg>(e.body)) {
      // It asks again: the end did not reach it. At most once a second.
      w.last_seen = now_;
      if (now_ - w.told_at < std::chrono::seconds(1)) return;
      w.told_at = now_;
      return tell_waiter(w.identity);
    }
  const auto idx = index_of_identity(from.identity);
  if (!idx || !members_[*idx].told_end) return;
  auto& m = members_[*idx];
  m.last_seen = now_;
  if (std::holds_alternative<bye_msg>(e.body) || std::holds_alternative<error_msg>(e.body)) {
    m.told_end = false;
    return;
  }
  // It speaks on: the call-off did not reach it (lost with a closed connection); at most once a second.
  if (now_ - m.told_removed < std::chrono::seconds(1)) return;
  m.told_removed = now_;
  reply_error(*m.identity, end_notice_.first, end_notice_.second);
}

std::vector<member_status> master_state::statuses(clock::time_point now) const {
  std::vector<member_status> out;
  for (size_t i = 0; i < members_.size(); ++i) {
    const auto& m = members_[i];
    member_status st;
    st.name = specs_[i].name;
    st.joined = m.identity.has_value();
    const bool starting = m.phase == member_phase::waiting || m.phase == member_phase::announced;
    st.alive = st.joined && (m.phase == member_phase::member || (!welcomed_ && starting));
    st.age_s = std::chrono::duration<double>(now - (st.joined ? m.last_seen : start_)).count();
    out.push_back(std::move(st));
  }
  return out;
}

double master_state::quorum_waited_s(clock::time_point now) const {
  if (!quorum_deadline_) return 0.0;
  return std::chrono::duration<double>(s_.quorum_timeout - (*quorum_deadline_ - now)).count();
}

member_phase master_state::phase_of(const std::string& name) const {
  if (const auto i = index_of_name(name)) return members_[*i].phase;
  throw lw_error(errc::invalid_config, "no member named " + name);
}

}  // namespace longwave::cluster
