// The master's state machine (see master_state.hpp): requests from outside the cluster. `longwave stop`
// stops every node at one round boundary (and, with --wait, is told how the run ended); `longwave node
// --leave` makes one node leave at its next.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "cluster/master_state.hpp"

namespace longwave::cluster {

using namespace control;

namespace {
// Stop requesters remembered for the end's answer: one operator asks, a few retry.
constexpr size_t max_stop_waiters = 16;
// Standby coordinators remembered, one per address (a cluster file lists at most 8).
constexpr size_t max_standbys = 64;
}  // namespace

/// A standby coordinator stands by (standby.hpp): it is told when the cluster ends (note_end), so it ends
/// too instead of taking an ended cluster over. Only the cluster's own key may (it is a coordinator's).
void master_state::on_standby(const sender& from, const standby_msg& sb) {
  if (from.keyed_as && *from.keyed_as != comm::operator_user_id)
    return dropped(
        fmt::format("coordinator: dropped a standby's word from {}: it came with node '{}''s key, "
                    "not the cluster's",
                    from.peer, *from.keyed_as));
  // By its address: a standby that reconnects comes with a new routing id, which replaces the old one.
  const auto it = standbys_.find(sb.address);
  if (it != standbys_.end()) {
    it->second = from.identity;
    return;
  }
  if (standbys_.size() >= max_standbys) return;
  standbys_.emplace(sb.address, from.identity);
  info(fmt::format("coordinator: a standby coordinator ({}) stands by at {}", from.peer, sb.address));
}

void master_state::add_stop_waiter(const std::string& identity) {
  auto& w = stop_->waiters;
  if (w.size() < max_stop_waiters && std::find(w.begin(), w.end(), identity) == w.end())
    w.push_back(identity);
}

void master_state::on_stop_request(const sender& from) {
  if (stop_) {
    add_stop_waiter(from.identity);
    return reply_error(
        from.identity, errc::none,
        stop_->round
            ? fmt::format("the cluster is already stopping: every node stops after round {}", *stop_->round)
            : std::string("the cluster is already stopping: its nodes are finishing their "
                          "current round"));
  }
  if (takeover_since_ && !welcomed_)
    return reply_error(from.identity, errc::deadline_missed,
                       "the coordinator is taking the running cluster over (its nodes are re-announcing "
                       "themselves): try again in a few seconds");
  stop_ = stop_state{};
  add_stop_waiter(from.identity);
  pin_.reset();  // the stop's hold takes over from a pin: the members hold at the same boundary
  if (!welcomed_)
    return reply_error(
        from.identity, errc::none,
        nobody_since_takeover()
            ? "this coordinator took over from another and no node has said hello since: the run "
              "it stood by for has ended, or its nodes have not found this coordinator yet; it stops now"
            : "the cluster had not begun training: the coordinator and the nodes that joined stop "
              "now");
  const auto members = begin_stop("longwave stop");
  uint64_t top = 0;
  for (auto i : members) top = std::max(top, members_[i].round);
  const bool one = members.size() == 1;
  reply_error(from.identity, errc::none,
              fmt::format("the cluster stops at its next round boundary: {} {} current round (last reported "
                          "round {}), {} and {}",
                          names_of(members), one ? "finishes its" : "finish their", top,
                          one ? "saves its checkpoint" : "save their checkpoints", one ? "exits" : "exit"));
}

std::vector<size_t> master_state::begin_stop(const std::string& why) {
  for (size_t i = 0; i < members_.size(); ++i)
    if (members_[i].phase == member_phase::joining || members_[i].phase == member_phase::ready)
      cancel_join(i);
  const auto members = training_members();
  for (auto i : members) members_[i].stop_hold.reset();
  info(fmt::format("coordinator: stopping the cluster ({}): asking {} where they can stop", why,
                   names_of(members)));
  return members;
}

void master_state::carry_on_stop(size_t i) {
  stop_ = stop_state{};
  pin_.reset();
  begin_stop(fmt::format("node {} holds for a stop that an earlier coordinator began", specs_[i].name));
}

/// `longwave node --leave`: forwards the request to the node and answers the requester.
void master_state::on_leave(const sender& from, const leave_msg& l) {
  for (size_t i = 0; i < members_.size(); ++i) {
    if (specs_[i].name != l.node) continue;
    if (!welcomed_ || !training(i))
      return reply_error(from.identity, errc::invalid_config,
                         fmt::format("node {} is not training in this cluster{}", l.node,
                                     members_[i].removed == removal::none
                                         ? ""
                                         : fmt::format(" ({})", to_string(members_[i].removed))));
    // The members that would train on: below min_nodes the run would be called off after quorum_timeout_s.
    size_t staying = 0;
    for (auto j : training_members()) staying += j != i && !members_[j].leaving;
    if (staying < s_.min_nodes)
      return reply_error(
          from.identity, errc::invalid_config,
          fmt::format("node {} cannot leave: {} node{} would train on, below [cluster] min_nodes = "
                      "{} (the cluster would wait, then be called off); `longwave stop` stops "
                      "every node with a checkpoint",
                      l.node, staying, staying == 1 ? "" : "s", s_.min_nodes));
    members_[i].leaving = true;
    send_to(i, l);
    info(fmt::format("coordinator: node {} was asked to leave at its next round boundary", l.node));
    return reply_error(from.identity, errc::none,
                       fmt::format("node {} leaves at its next round boundary (last applied round {})",
                                   l.node, members_[i].round));
  }
  reply_error(from.identity, errc::invalid_config, fmt::format("node '{}' is not in this cluster", l.node));
}

bool master_state::nobody_since_takeover() const {
  return s_.took_over &&
         std::none_of(members_.begin(), members_.end(), [](const auto& m) { return m.identity.has_value(); });
}

/// Stopped (longwave stop) before training began: the nodes that joined are told, and stop too (exit 0). A
/// standby that took over and heard from no node has nothing to lead: the run it stood by for may have
/// finished (its end record is already in the event log).
void master_state::stop_before_start() {
  if (nobody_since_takeover()) {
    info("coordinator: stopped (longwave stop) with no node since this standby took over: nothing to lead");
    exit_code_ = 0;
    return note_end("nothing_to_lead", {},
                    "no node has said hello since this standby took over: the run it stood by for has ended "
                    "(its end record is in coordinator.jsonl), or its nodes have not found it yet");
  }
  for (const auto& m : members_)
    if (m.identity && m.removed == removal::none)
      reply_error(*m.identity, errc::cancelled,
                  "the cluster was stopped (longwave stop) before it began training");
  const std::string line = "stopped (longwave stop) before the cluster began training";
  info("coordinator: " + line);
  exit_code_ = 0;
  note_end("stopped_before_start", {}, line);
}
/// The end of the run, told to each `longwave stop` that asked: a bye when the nodes stopped or finished,
/// an error naming why otherwise. A requester that did not wait is gone, and the socket drops its copy.
void master_state::answer_stop_waiters(const std::string& outcome, const std::string& summary) {
  if (!stop_) return;
  waiters_end_ = {outcome == "stopped" || outcome == "finished" || outcome == "stopped_before_start",
                  summary};
  for (const auto& identity : stop_->waiters) {
    tell_waiter(identity);
    // Several coordinator addresses: its client drops what it has not read when this one's connection
    // closes (ZMQ_IMMEDIATE), so this one stays until it stops asking (after_end).
    if (s_.await_last_words) told_waiters_.push_back({identity, now_, now_});
  }
  stop_->waiters.clear();
}

void master_state::tell_waiter(const std::string& identity) {
  if (waiters_end_.first)
    reply(identity, bye_msg{waiters_end_.second.substr(0, max_message_bytes)});
  else
    reply_error(identity, errc::evicted, waiters_end_.second);
}

}  // namespace longwave::cluster
