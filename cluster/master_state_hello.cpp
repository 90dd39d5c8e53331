// The master's state machine (see master_state.hpp): hellos, joins of the running cluster, and the
// re-announcements of nodes that train under a restarted master.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <set>

#include "cluster/master_state.hpp"
#include "config/cluster_config.hpp"

namespace longwave::cluster {

using namespace control;

namespace {
// A second process with a live member's name waits this long for the first to fall silent, then is turned
// away.
constexpr auto join_silence = std::chrono::seconds(6);
// A live member is heard from every 2 s: a process that says hello with its name after this much silence
// replaces it (the node was restarted).
constexpr auto restart_silence = std::chrono::seconds(3);
// A joiner's repeated hello (every 2 s) is answered with where to fetch again at most this often: hellos it
// queued while the master did not read (suspended, or a link that stalled) arrive together, and a recover for
// each made it fetch the same state again until it gave up (a probe).
constexpr auto recover_again_after = std::chrono::seconds(1);
}  // namespace

void master_state::on_hello(const sender& from, const hello_msg& h) {
  const auto idx = member_for_hello(from, h);
  if (!idx) return;
  auto problem = hello_mismatch(*idx, h);
  if (!problem) problem = data_mismatch(*idx, h);
  if (problem) {
    warn(problem->first);
    turned_away_[h.node_name] = problem->second;
    return turn_away(from.identity, errc::invalid_config, problem->second);
  }
  turned_away_.erase(h.node_name);
  auto& m = members_[*idx];
  if (h.running) return on_reannounce(*idx, from, h);
  if (m.identity && *m.identity == from.identity) {
    // The same process again: its periodic hello while it waits, or one that crossed our welcome (or our
    // recover).
    m.last_seen = now_;
    if (welcomed_ && epoch_ == 1 && training(*idx)) {
      const auto members = training_members();
      for (size_t r = 0; r < members.size(); ++r)
        if (members[r] == *idx) send_welcome(members, r);
    }
    if (m.phase == member_phase::joining &&
        (!m.recover_sent || now_ - *m.recover_sent >= recover_again_after))
      send_recover(*idx, "");
    return;
  }
  if (welcomed_) return on_join(*idx, from, h);
  // Taking a running cluster over: the hello is answered (with where to fetch the state) once that is done;
  // the node says hello again every 2 s.
  if (takeover_since_) return;
  on_first_hello(*idx, from, h);
}

/// The member a hello speaks for: a listed node, or (open cluster, training) a node added now. nullopt: the
/// hello was turned away (other protocol version, unknown node) or is answered later.
std::optional<size_t> master_state::member_for_hello(const sender& from, const hello_msg& h) {
  if (h.protocol_version != comm::protocol_version()) {
    warn(fmt::format("coordinator: turned away node '{}' ({}): protocol version {}, ours is {}", h.node_name,
                     from.peer, h.protocol_version, comm::protocol_version()));
    turn_away(
        from.identity, errc::invalid_config,
        fmt::format("protocol version {} is not the coordinator's {}: build every node and the coordinator "
                    "from the same Longwave release",
                    h.protocol_version, comm::protocol_version()));
    return std::nullopt;
  }
  if (const auto i = index_of_name(h.node_name)) return i;
  if (s_.open) {
    if (!welcomed_) return std::nullopt;  // it joins once the cluster trains; its hello comes again every 2 s
    return add_open_node(from, h);
  }
  std::vector<std::string> names;
  for (const auto& m : specs_) names.push_back(m.name);
  warn(fmt::format("coordinator: turned away unknown node '{}' ({})", h.node_name, from.peer));
  turn_away(from.identity, errc::invalid_config,
            fmt::format("node '{}' is not in this cluster (nodes: {})", h.node_name, join_names(names)));
  return std::nullopt;
}

/// Why a hello for listed node idx is turned away, as the master's line and as the reply: its cluster file or
/// its training settings differ.
std::optional<std::pair<std::string, std::string>> master_state::hello_mismatch(size_t idx,
                                                                                const hello_msg& h) const {
  const auto& want = specs_[idx];
  // An epoch no cluster reaches (one a second): the next one would wrap around to 0 (a probe's 2^64 - 1).
  if (constexpr uint64_t most_epoch = uint64_t{1} << 40; h.running && h.epoch > most_epoch)
    return std::make_pair(
        fmt::format("coordinator: turned away node '{}': its re-announcement names epoch {}", h.node_name,
                    h.epoch),
        fmt::format("node '{}' re-announced epoch {}, which no cluster reaches (at most 2^40): a damaged or "
                    "forged hello",
                    h.node_name, h.epoch));
  if (h.n_workers != want.workers || h.data_endpoint != want.endpoint) {
    return std::make_pair(
        fmt::format("coordinator: turned away node '{}': its cluster file differs", h.node_name),
        fmt::format(
            "node '{}' says {} workers at {}, the coordinator's cluster file says {} at {}: start every "
            "role from the same cluster file",
            h.node_name, h.n_workers, h.data_endpoint, want.workers, want.endpoint));
  }
  // A listed node places its data by its own file's order: one that differs would read another's.
  if (h.worker_offset >= 0 && idx < s_.members.size() &&
      static_cast<uint64_t>(h.worker_offset) != want.worker_offset) {
    const auto ranks = [&](uint64_t first) { return fmt::format("{}..{}", first, first + want.workers - 1); };
    return std::make_pair(
        fmt::format("coordinator: turned away node '{}': its cluster file lists the nodes in another order",
                    h.node_name),
        fmt::format("node '{}' would read the data of global ranks {} by its cluster file, the coordinator's "
                    "gives it {}: its file lists the nodes in another order; start every role from the same "
                    "cluster file",
                    h.node_name, ranks(static_cast<uint64_t>(h.worker_offset)), ranks(want.worker_offset)));
  }
  if (s_.config_hash != 0 && h.config_hash != s_.config_hash) {
    // The keys that differ, when both sides sent their settings (an older node does not).
    const auto differ = h.training_settings.empty() || s_.training_settings.empty()
                            ? std::vector<std::string>{}
                            : config::settings_differences(h.training_settings, s_.training_settings);
    std::string keys, listed;
    for (const auto& d : differ) {
      keys += (keys.empty() ? "" : ", ") + d.substr(0, d.find(' '));
      listed += (listed.empty() ? "" : "; ") + d;
    }
    return std::make_pair(
        fmt::format("coordinator: turned away node '{}': its training settings differ{}", h.node_name,
                    keys.empty() ? "" : " (" + keys + ")"),
        listed.empty()
            ? fmt::format(
                  "node '{}' trains with other settings than the coordinator (fingerprint {:016x}, the "
                  "coordinator's {:016x}): start every role from the same cluster file and the same "
                  "--set options",
                  h.node_name, h.config_hash, s_.config_hash)
            : fmt::format(
                  "node '{}' trains with other settings than the coordinator: {} (this node's value, "
                  "the coordinator's in parentheses): start every role from the same cluster file and "
                  "the same --set options",
                  h.node_name, listed));
  }
  return std::nullopt;
}

/// Why a hello is turned away for its training data: another fingerprint than the first node's that said
/// hello with one (the master reads no data itself). Records the first.
std::optional<std::pair<std::string, std::string>> master_state::data_mismatch(size_t idx,
                                                                               const hello_msg& h) {
  if (h.data_fingerprint == 0) return std::nullopt;
  if (!data_fingerprint_) data_fingerprint_ = std::make_pair(h.data_fingerprint, specs_[idx].name);
  const auto& [want, first] = *data_fingerprint_;
  if (h.data_fingerprint == want) return std::nullopt;
  return std::make_pair(
      fmt::format("coordinator: turned away node '{}': it reads other training data than node {}",
                  h.node_name, first),
      fmt::format(
          "node '{}' reads other training data than node {} (data fingerprint {:016x}, {}'s {:016x}): "
          "give every node the same corpus (data.path)",
          h.node_name, first, h.data_fingerprint, first, want));
}

/// A hello before training began: the node waits for its welcome. A second process with a joined node's name
/// waits while the first is heard from (second_process_waits): it takes the place of one that died.
void master_state::on_first_hello(size_t idx, const sender& from, const hello_msg& h) {
  auto& m = members_[idx];
  if (m.identity && second_process_waits(idx, from)) return;
  if (m.identity)
    warn(fmt::format(
        "coordinator: node '{}' said hello from a new process ({}) after {} of silence from the first; using "
        "the new one",
        h.node_name, from.peer, secs(since(m.last_seen))));
  m.identity = from.identity;
  m.phase = member_phase::waiting;
  m.last_seen = now_;
  m.resume_round = h.resume_round;
  m.start_version = m.applied_version = h.committed.round;
  m.checkpoint_rounds = h.checkpoint_rounds;
  m.checkpoint_thetas = h.checkpoint_thetas;
  m.state_endpoint = h.state_endpoint;
  size_t joined = 0;
  for (const auto& x : members_) joined += x.identity ? 1 : 0;
  info(fmt::format("coordinator: node {} joined ({} workers, ring endpoint {}) [{}/{}]", h.node_name,
                   h.n_workers, h.data_endpoint, joined, members_.size()));
}

/// A node not in the cluster file asks to join ([cluster] open): it gets the next free data regions (global
/// worker ranks after the listed nodes'), kept for it if it comes back. nullopt: turned away.
std::optional<size_t> master_state::add_open_node(const sender& from, const hello_msg& h) {
  uint64_t used = 0;
  for (size_t i = s_.members.size(); i < specs_.size(); ++i) used += specs_[i].workers;
  std::string problem;
  if (!config::valid_node_name(h.node_name))
    problem = "a node name is 1..32 of a-z A-Z 0-9 _ -";
  else if (auto p = config::endpoint_problem(h.data_endpoint); !p.empty())  // the cluster file's own rules
    problem = fmt::format("ring endpoint '{}': {}", h.data_endpoint, p);
  else if (h.n_workers == 0 || used + h.n_workers > s_.open_workers)
    problem = fmt::format(
        "{} workers do not fit: {} of [cluster] open_workers = {} are taken by other nodes not in the file; "
        "raise open_workers",
        h.n_workers, used, s_.open_workers);
  for (const auto& sp : specs_)
    if (sp.endpoint == h.data_endpoint)
      problem = fmt::format("node {} has ring endpoint {}", sp.name, sp.endpoint);
  if (!problem.empty()) {
    warn(fmt::format("coordinator: turned away node '{}' ({}), not in the cluster file: {}", h.node_name,
                     from.peer, problem));
    turn_away(from.identity, errc::invalid_config, fmt::format("node '{}': {}", h.node_name, problem));
    return std::nullopt;
  }
  specs_.push_back({h.node_name, h.data_endpoint, h.n_workers, listed_workers_ + used});
  members_.emplace_back();
  members_.back().phase = member_phase::removed;
  members_.back().removed = removal::absent;
  info(fmt::format(
      "coordinator: node {} is not in the cluster file ([cluster] open): {} workers, global ranks {}..{}",
      h.node_name, h.n_workers, specs_.back().worker_offset, specs_.back().worker_offset + h.n_workers - 1));
  return specs_.size() - 1;
}

/// A node asks to join the running cluster (absent at the start, removed, or restarted after a crash): it is
/// told where to fetch the state, then admitted at a fence (join_ready).
void master_state::on_join(size_t idx, const sender& from, const hello_msg& h) {
  auto& m = members_[idx];
  const auto& name = h.node_name;
  if (m.phase == member_phase::finished)
    return turn_away(from.identity, errc::invalid_config, fmt::format("node {} has finished the run", name));
  const bool joiner = m.phase == member_phase::joining || m.phase == member_phase::ready;
  if (training(idx) || joiner) {
    if (second_process_waits(idx, from)) return;
    if (training(idx))
      remove(idx, removal::lost,
             fmt::format(
                 "node {} lost: a new process ({}) said hello with its name after {} of silence (restarted?)",
                 name, from.peer, secs(since(m.last_seen))));
  }
  if (training_members().empty())
    return turn_away(from.identity, errc::peer_lost, "no node is training in this cluster any more");
  if (stop_)
    return reply_error(from.identity, errc::cancelled,
                       "the cluster is stopping (longwave stop): start this node again with the cluster");
  m.identity = from.identity;
  m.last_seen = now_;
  m.state_endpoint = h.state_endpoint;
  // absent: a listed node the cluster started without, or a node not in the file (never a member)
  const std::string before =
      m.removed == removal::none ? ""
      : m.removed != removal::absent
          ? fmt::format("; it was removed: {}", to_string(m.removed))
          : (idx < s_.members.size() ? "; absent when the cluster started" : "; new to the cluster");
  info(fmt::format(
      "coordinator: node {} ({}) asks to join the running cluster (epoch {}{}): it fetches the state "
      "from {}",
      name, from.peer, epoch_, before, names_of(training_members())));
  start_fetch(idx);
  // A key the members were not sent (added to nodes/ later, or a master that took the cluster over): their
  // state servers admit it from the next membership on, so a fence brings one now (the joiner fetches again).
  if (s_.node_keys && !fence_ && !keys_announced_.count(key_of(name)))
    start_fence("join",
                fmt::format("the members learn node {}'s key, which no membership sent to them held", name));
}

/// Joiner idx begins afresh (no state held, no pin, none found stale): it is told where to fetch the state,
/// or (async) the members' merges wait for it.
void master_state::start_fetch(size_t idx) {
  auto& m = members_[idx];
  m.phase = member_phase::joining;
  m.ready.reset();
  m.pinned = false;
  m.turned_back.reset();
  if (merges_)
    hold_merges_for(idx);
  else
    send_recover(idx, "");
}

/// Another process has the name of a member or joiner idx. A restarted node's predecessor falls silent (it
/// died): once it has been silent for restart_silence the newcomer takes its place (false); a live one keeps
/// it (true: the newcomer waits, and is turned away after join_silence).
bool master_state::second_process_waits(size_t idx, const sender& from) {
  auto& m = members_[idx];
  if (now_ - m.last_seen >= restart_silence) {
    m.contender.reset();
    return false;
  }
  if (!m.contender || *m.contender != from.identity) {
    m.contender = from.identity;
    m.contender_since = now_;
  } else if (now_ - m.contender_since > join_silence) {
    m.contender.reset();
    const auto* where = welcomed_ ? "is live in the cluster" : "has already joined";
    warn(fmt::format("coordinator: turned away a second process for node '{}' ({}): that node {}",
                     specs_[idx].name, from.peer, where));
    turn_away(from.identity, errc::invalid_config,
              fmt::format("node {} {} from another process (heard from {} ago); stop one of them",
                          specs_[idx].name, where, secs(since(m.last_seen))));
  }
  return true;  // no answer yet: its next hello (every 2 s) is looked at again
}

/// A joiner holds the state after all-reduce r.key: a fence admits it (conclude_fence).
void master_state::on_join_ready(size_t idx, const join_ready_msg& r) {
  auto& m = members_[idx];
  if (m.ready && m.ready->key == r.key) return;          // its periodic repeat
  if (m.turned_back && *m.turned_back == r.key) return;  // a repeat of a state found stale
  if (!merges_ && m.pinned && pin_ && pin_->round && r.round != *pin_->round) {
    // The state of a fetch it began before it was told to fetch the held round: it fetches that now.
    info(
        fmt::format("coordinator: node {} holds the state of round {}, but was told to fetch round {}: "
                    "waiting for that one",
                    specs_[idx].name, r.round, *pin_->round));
    m.turned_back = r.key;
    return;
  }
  m.ready = r;
  m.phase = member_phase::ready;
  if (merges_ && !all_applied(r.round)) {  // watch_merges fences once they have
    info(
        fmt::format("coordinator: node {} holds the state of version {}: admitting it at a fence once every "
                    "member applied it",
                    specs_[idx].name, r.round));
    return;
  }
  info(fmt::format("coordinator: node {} holds the state of {} {}: admitting it at a fence", specs_[idx].name,
                   merges_ ? "version" : "round", r.round));
  if (!fence_) start_fence("join", "node " + specs_[idx].name + " joins");
}

/// A training node re-announces itself: to a restarted master (which then takes the cluster over), or to this
/// one again after a dropped connection (it is answered with the current epoch).
void master_state::on_reannounce(size_t idx, const sender& from, const hello_msg& h) {
  auto& m = members_[idx];
  const bool same_process = m.identity && *m.identity == from.identity;
  if (welcomed_) {
    if (same_process && (training(idx) || m.phase == member_phase::finished)) {
      m.last_seen = now_;
      // Before the welcome, on which the node sends its unanswered contribution again: one a resent merge
      // answers is not sent twice.
      if (merges_ && training(idx)) resend_merges(idx);
      welcome_msg w;
      w.epoch = epoch_;
      send_to(idx, w);
    } else if (same_process) {
      tell_removed(m, removed_text(idx));
    } else {
      reply_error(from.identity, errc::evicted,
                  fmt::format("node {} re-announced itself after the coordinator had taken the cluster over "
                              "without it; start it again with the same command to rejoin",
                              h.node_name));
    }
    return;
  }
  if (!takeover_since_) {
    takeover_since_ = now_;
    info(
        fmt::format("coordinator: node {} is already training (epoch {}, last applied round {}): taking the "
                    "running cluster over; waiting up to {} for its other nodes",
                    h.node_name, h.epoch, h.committed.round, secs(s_.heartbeat_timeout)));
  }
  m.identity = from.identity;
  m.phase = member_phase::announced;
  m.last_seen = now_;
  m.announce = h;
  m.state_endpoint = h.state_endpoint;
}

/// Until its main loop runs (its model built, its checkpoint loaded, its communicator made), a member says
/// every 2 s that it is still starting: it is not silent (watch_silence), and the members wait for it.
void master_state::on_starting(size_t i) {
  auto& m = members_[i];
  if (m.phase != member_phase::member) return;  // e.g. a joiner that gave up: nobody waits for it
  if (!m.starting_since) m.starting_since = now_;
  if (m.starting_said || since(*m.starting_since) <= std::max(s_.heartbeat_timeout, s_.join_timeout)) return;
  m.starting_said = true;
  info(fmt::format(
      "coordinator: node {} is still starting after {} (building its model, loading its checkpoint); it says "
      "so every 2 s, and the members wait for it",
      specs_[i].name, secs(since(*m.starting_since))));
}

/// Where the joined nodes resume. Their hellos list the rounds of their checkpoints: the round the most of
/// them hold (the newest of those), so that a node whose checkpoints are older than the others' (it left, or
/// was lost, while they trained on and pruned theirs) does not drag the cluster back to a round they no
/// longer hold, nor a node without checkpoints (a new disk, --fresh) back to round 1. The nodes without a
/// checkpoint of that round fetch the members' state, as a joiner does. Without lists (an older node), on
/// NCCL (no state servers) or async (every node resumes its own newest): the newest round all of them hold,
/// else the oldest newest round, 0 when one holds none. A round counts with its theta: two nodes that reached
/// it apart (each trained on without the other) hold two histories, and the minority's fetch the majority's.
master_state::resume_plan master_state::plan_resume() const {
  std::vector<size_t> joined;
  for (size_t i = 0; i < members_.size(); ++i)
    if (members_[i].identity && members_[i].phase == member_phase::waiting) joined.push_back(i);
  bool lists = !s_.async, thetas = true;
  for (auto i : joined) {
    const auto& m = members_[i];
    lists = lists && (m.resume_round == 0 || !m.checkpoint_rounds.empty()) && !m.state_endpoint.empty();
    thetas = thetas && m.checkpoint_thetas.size() == m.checkpoint_rounds.size();
  }
  // What a node holds: (round, theta's CRC), the CRC 0 when a node does not say it. Two nodes that reached
  // one round apart (each trained on without the other) hold two histories of it.
  const auto held = [&](const member& m) {
    std::set<std::pair<uint64_t, uint32_t>> out;
    for (size_t k = 0; k < m.checkpoint_rounds.size(); ++k)
      if (m.checkpoint_rounds[k] != 0)
        out.insert({m.checkpoint_rounds[k], thetas ? m.checkpoint_thetas[k] : 0});
    return out;
  };
  std::map<uint64_t, size_t> holders;                         // per round
  std::map<std::pair<uint64_t, uint32_t>, size_t> histories;  // per round and theta
  std::optional<uint64_t> oldest_newest;
  std::optional<std::set<uint64_t>> common;
  for (auto i : joined) {
    const auto& m = members_[i];
    oldest_newest = std::min(oldest_newest.value_or(m.resume_round), m.resume_round);
    std::set<uint64_t> mine;
    for (const auto& h : held(m)) {
      ++histories[h];
      if (mine.insert(h.first).second) ++holders[h.first];
    }
    if (!common) {
      common = std::move(mine);
    } else {
      std::set<uint64_t> both;
      std::set_intersection(common->begin(), common->end(), mine.begin(), mine.end(),
                            std::inserter(both, both.begin()));
      common = std::move(both);
    }
  }
  resume_plan plan;
  if (!lists) {
    if (oldest_newest && *oldest_newest > 0)
      plan.round = common && !common->empty() ? *common->rbegin() : *oldest_newest;
    return plan;
  }
  size_t most = 0;
  for (const auto& [r, n] : holders)  // ascending rounds: a later one of as many holders wins
    if (n >= most) most = n, plan.round = r;
  // The cluster stopped after a round (its event log): where a node that stopped there holds it, that round
  // and its history, though nodes lost before hold older rounds and outnumber it.
  std::map<uint32_t, size_t> stopped_there;  // theta's CRC -> how many of those nodes hold it
  // Not when a node holds a later round, or most hold one: the cluster trained after it (its log did not
  // say, as when another machine's coordinator led it).
  const bool after_stop = std::any_of(joined.begin(), joined.end(), [&](size_t i) {
    return s_.stopped && members_[i].resume_round > s_.stopped->round;
  });
  if (s_.stopped && !after_stop && s_.stopped->round >= plan.round)
    for (auto i : joined)
      if (std::count(s_.stopped->nodes.begin(), s_.stopped->nodes.end(), specs_[i].name))
        for (const auto& h : held(members_[i]))
          if (h.first == s_.stopped->round) ++stopped_there[h.second];
  if (!stopped_there.empty()) {
    plan.round = s_.stopped->round;
    plan.by_stop = true;
  }
  if (plan.round == 0) return plan;
  // Of that round's histories, the one most of its holders hold (of as many, the larger CRC: a tie is named).
  most = 0;
  for (auto it = histories.lower_bound({plan.round, 0});
       it != histories.end() && it->first.first == plan.round; ++it) {
    const auto n = plan.by_stop ? stopped_there[it->first.second] : it->second;
    if (n >= most) plan.tied = n == most, most = n, plan.theta = it->first.second;
  }
  for (auto i : joined) {
    const auto mine = held(members_[i]);
    if (members_[i].resume_round > plan.round) plan.ahead.push_back(i);
    if (mine.count({plan.round, plan.theta})) continue;
    plan.fetch.push_back(i);
    const auto it = mine.lower_bound({plan.round, 0});
    if (it != mine.end() && it->first == plan.round) plan.other_history.push_back(i);
  }
  return plan;
}

/// The resume plan's lines: nodes whose later rounds are dropped, a tie between two histories, and each node
/// that fetches the members' state, and why.
void master_state::say_plan(const resume_plan& plan, const std::vector<size_t>& members) {
  if (plan.by_stop)
    info(
        fmt::format("coordinator: the cluster stopped after round {} on {} (its event log): it resumes there",
                    plan.round, fmt::join(s_.stopped->nodes, ", ")));
  for (auto i : plan.ahead)
    warn(
        fmt::format("coordinator: node {} holds checkpoints up to round {}, past round {}, which the cluster "
                    "resumes after ({}): its later rounds are not the cluster's, and it sets them aside",
                    specs_[i].name, members_[i].resume_round, plan.round,
                    plan.by_stop ? "where it stopped" : "the round most nodes hold"));
  if (plan.tied)
    warn(
        fmt::format("coordinator: as many nodes hold one history of round {} as another: the cluster resumes "
                    "from {}'s, and the others fetch it",
                    plan.round, names_of(members)));
  for (auto i : plan.fetch) {
    const auto& m = members_[i];
    const bool other =
        std::find(plan.other_history.begin(), plan.other_history.end(), i) != plan.other_history.end();
    const std::string text = fmt::format(
        "coordinator: node {} {}: it fetches the state from {} and joins", specs_[i].name,
        other ? fmt::format("holds a checkpoint of round {} with another theta than {} (another training "
                            "history)",
                            plan.round, names_of(members))
              : fmt::format("holds no checkpoint of round {} (its newest: {})", plan.round,
                            m.resume_round == 0 ? std::string("none") : std::to_string(m.resume_round)),
        names_of(members));
    if (other)
      warn(text);
    else
      info(text);
  }
}

}  // namespace longwave::cluster
