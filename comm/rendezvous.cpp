// Coordinator role (see rendezvous.hpp): admits the nodes, keeps the membership by epochs, takes a running
// cluster over after a restart.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "comm/control_common.hpp"
#include "comm/rendezvous.hpp"
#include "comm/zmq_monitor.hpp"

namespace longwave::comm {

namespace {

using namespace control;
// A joined member not heard from for join_silence is taken to be gone, so a second process with its name may
// take its place.
constexpr auto join_silence = std::chrono::seconds(6);
// A live member is heard from every 2 s: a process that says hello with its name after this much silence
// replaces it (the node was restarted).
constexpr auto restart_silence = std::chrono::seconds(3);
// Dropped control messages: the first 50 are logged, then every 1000th (all are counted).
constexpr uint64_t logged_drops = 50, drop_log_every = 1000;
// Distinct connections remembered as running nodes of an earlier coordinator (each is named once).
constexpr size_t max_strangers = 1024;

/// One member's state at the coordinator.
struct member_state {
  std::optional<std::string> identity;  // ROUTER routing id once it said hello
  bool member = false;                  // in the current epoch's membership and training
  bool finished = false;                // said bye("done")
  std::string removed;                  // why it left the membership ("lost", "left", "failed"), if it did
  bool stopped = false;                 // said bye("stopped"): it stopped with the cluster (longwave stop)
  std::optional<uint64_t> stop_hold;    // a stop: the round after which it holds (its answer to the query)
  bool heard = false;                   // a heartbeat since the welcome
  bool suspected = false;               // a neighbour's ring lost it
  clock::time_point last_seen, suspected_at, told_removed;
  uint64_t round = 0;
  uint64_t resume_round = 0;  // from its hello
  bool acked = false;         // answered the fence in progress
  fence_ack_msg ack;
  std::optional<hello_msg> announce;  // its re-announcement to a restarted coordinator
  std::string state_endpoint;         // where it serves its training state to joiners
  // Joining the running cluster: fetching the state (joining), then holding the state after ready->key.
  bool joining = false;
  std::optional<join_ready_msg> ready;
  bool held = false;  // the members were held at a fence for it once
  // A second process that said hello with this live member's name, waiting for the first to fall silent.
  std::optional<std::string> contender;
  clock::time_point contender_since;
};

/// `longwave stop` in progress: the members are asked where they can stop, then told the round after which
/// all stop (the largest of their answers); each trains to it, saves its checkpoint and says bye "stopped".
struct stop_state {
  std::optional<uint64_t> round;  // the round after which every member stops, once all have answered
  clock::time_point sent;         // when the query or the round was last sent (re-sent every 2 s)
};

/// A membership change in progress: every training member must answer the fence of `epoch`.
struct fence_state {
  uint64_t epoch = 0;
  clock::time_point started;
  std::string reason;
};

class coordinator {
 public:
  explicit coordinator(const coordinator_options& o) : o_(o), specs_(o.members), members_(o.members.size()) {
    for (auto& sp : specs_) {
      sp.worker_offset = listed_workers_;
      listed_workers_ += sp.workers;
    }
    sock_.set(zmq::sockopt::linger, 1000);
    // A node keeps its routing id across reconnections (control_client sets one), so a connection that
    // comes back takes over the old one instead of being refused while the old one looks alive.
    sock_.set(zmq::sockopt::router_handover, true);
    sock_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_envelope_bytes));
    if (o_.node_keys) {
      zap_ = std::make_unique<zap_handler>(
          ctx_, o_.node_keys,
          [this](const handshake_refusal& r) {
            refused(r, n_key_refusals_, "refused keys");  // on the ZAP thread
          },
          o_.refresh_keys, o_.curve.public_key);
      try {
        make_curve_server(sock_, o_.curve);
      } catch (const zmq::error_t& e) {
        throw lw_error(errc::io_error, fmt::format("coordinator: cannot set up CURVE: {}", e.what()));
      }
      // Handshakes that fail before the ZAP handler sees a key: no CURVE, or a client that pinned another
      // server key (another cluster's).
      const char* monitor_endpoint = "inproc://longwave-coordinator-monitor";
      if (zmq_socket_monitor(sock_.handle(), monitor_endpoint,
                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) ==
          0) {
        monitor_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::pair);
        monitor_->set(zmq::sockopt::linger, 0);
        monitor_->connect(monitor_endpoint);
      }
    }
    try {
      sock_.bind(o_.bind_endpoint);
    } catch (const zmq::error_t& e) {
      throw lw_error(errc::io_error,
                     fmt::format("coordinator: cannot listen on {}: {}", o_.bind_endpoint, e.what()));
    }
  }

  ~coordinator() {
    // Stop the monitor first, so closing the ROUTER does not wait on it.
    if (monitor_) {
      zmq_socket_monitor(sock_.handle(), nullptr, 0);
      monitor_.reset();
    }
  }
  coordinator(const coordinator&) = delete;
  coordinator& operator=(const coordinator&) = delete;

  int run() {
    const auto t0 = clock::now();
    info(fmt::format("coordinator: cluster of {} nodes, waiting up to {} for them on {}", members_.size(),
                     secs(o_.join_timeout), o_.bind_endpoint));
    // Joining, or taking over nodes that are already training (this coordinator was restarted).
    for (;;) {
      if (stopped()) return call_off("the coordinator was stopped", 130);
      if (stop_) return stop_before_start();
      if (takeover_since_) {
        if (all_announced() || clock::now() - *takeover_since_ > o_.heartbeat_timeout) {
          take_over();
          break;
        }
      } else if (all_joined()) {
        break;
      } else if (clock::now() - t0 > o_.join_timeout) {
        std::vector<std::string> missing, joined;
        for (size_t i = 0; i < members_.size(); ++i)
          (members_[i].identity ? joined : missing).push_back(specs_[i].name);
        if (!joined.empty() && joined.size() >= o_.min_nodes && o_.min_nodes < members_.size()) {
          info(
              fmt::format("coordinator: join deadline of {} passed with {} of {} nodes ({}); [cluster] "
                          "min_nodes = {}: starting without {}",
                          secs(o_.join_timeout), joined.size(), members_.size(), join_names(joined),
                          o_.min_nodes, join_names(missing)));
          break;
        }
        std::string why =
            fmt::format("join deadline of {} passed: missing node(s) {}{}", secs(o_.join_timeout),
                        join_names(missing), joined.empty() ? "" : " (joined: " + join_names(joined) + ")");
        if (!running_elsewhere_.empty())
          why += fmt::format(
              "; node(s) {} are training under an earlier coordinator but did not re-announce "
              "themselves (a Longwave without takeover?): stop them and restart the whole cluster to "
              "resume from its checkpoints",
              join_names({running_elsewhere_.begin(), running_elsewhere_.end()}));
        warn("coordinator: " + why);
        return call_off(why, 1);
      }
      poll_once();
      status(t0);
    }
    if (!welcomed_) {
      // Every listed node, or (past the join deadline) at least min_nodes of them.
      for (auto& m : members_) {
        m.member = m.identity.has_value();
        if (!m.member) m.removed = "absent";
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
      if (o_.on_epoch) o_.on_epoch(epoch_, members.size(), "start");
    }
    // Training: watch the members, change the membership when one goes, until none is left training.
    while (any_training()) {
      if (stopped()) return call_off("the coordinator was stopped", 130);
      watch(clock::now());
      if (stop_) watch_stop(clock::now());
      if (quorum_deadline_ && clock::now() > *quorum_deadline_) return call_off(quorum_text(), 1);
      if (give_up_) {
        warn("coordinator: " + *give_up_);
        return call_off(*give_up_, 1);
      }
      poll_once();
      status(t0);
    }
    return outcome();
  }

 private:
  void info(const std::string& s) const {
    if (o_.info) o_.info(s);
  }
  void warn(const std::string& s) const {
    if (o_.warn) o_.warn(s);
  }
  bool stopped() const { return o_.stop && o_.stop(); }

  void status(clock::time_point t0) const {
    if (o_.on_quorum_wait)
      o_.on_quorum_wait(
          quorum_deadline_
              ? std::chrono::duration<double>(o_.quorum_timeout - (*quorum_deadline_ - clock::now())).count()
              : 0.0);
    if (!o_.on_status) return;
    const auto now = clock::now();
    std::vector<member_status> out;
    for (size_t i = 0; i < members_.size(); ++i) {
      const auto& m = members_[i];
      member_status st;
      st.name = specs_[i].name;
      st.joined = m.identity.has_value();
      st.alive = st.joined && (m.member || (!welcomed_ && m.removed.empty())) && !m.finished;
      st.age_s = std::chrono::duration<double>(now - (st.joined ? m.last_seen : t0)).count();
      out.push_back(std::move(st));
    }
    o_.on_status(out);
  }

  bool all_joined() const {
    for (const auto& m : members_)
      if (!m.identity) return false;
    return true;
  }
  bool training(size_t i) const { return members_[i].member && !members_[i].finished; }

  bool all_announced() const {
    for (const auto& m : members_)
      if (!m.announce) return false;
    return true;
  }

  /// Adopts the nodes that re-announced themselves: their epoch as it stands when they all report the same
  /// one with all its members, else a fence into the next epoch among them. Those that did not re-announce
  /// within heartbeat_timeout of the first are taken as gone.
  void take_over() {
    welcomed_ = true;
    uint64_t top = 0;
    bool same = true;
    std::vector<size_t> present;
    for (size_t i = 0; i < members_.size(); ++i) {
      auto& m = members_[i];
      if (!m.announce) {
        m.removed = "lost";
        continue;
      }
      present.push_back(i);
      m.member = m.heard = true;
      m.round = m.announce->committed.round;
      same = same && (top == 0 || m.announce->epoch == top);
      top = std::max(top, m.announce->epoch);
    }
    same = same && present.size() == members_[present.front()].announce->world_size;
    epoch_ = top;
    info(fmt::format("coordinator: took over the running cluster: {} in epoch {} (last applied round {})",
                     names_of(present), top, members_[present.front()].announce->committed.round));
    if (same) {
      // Nothing changed while there was no coordinator: the nodes carry on in their epoch.
      for (auto i : present) {
        envelope e;
        e.body = welcome_msg{0, static_cast<uint32_t>(present.size()), {}, 0, epoch_};
        send_to(i, std::move(e));
      }
      if (o_.on_epoch) o_.on_epoch(epoch_, present.size(), "start");
      return;
    }
    start_fence("takeover", "a restarted coordinator found the nodes in different epochs or some missing");
  }
  bool any_training() const {
    for (size_t i = 0; i < members_.size(); ++i)
      if (training(i)) return true;
    return false;
  }
  std::vector<size_t> training_members() const {
    std::vector<size_t> out;
    for (size_t i = 0; i < members_.size(); ++i)
      if (training(i)) out.push_back(i);
    return out;
  }
  std::string names_of(const std::vector<size_t>& idx) const {
    std::vector<std::string> names;
    for (auto i : idx) names.push_back(specs_[i].name);
    return join_names(names);
  }

  /// Silent members leave the membership; a fence completes or times out; a ring reset waits for its
  /// suspects to be heard from (alive) or to be removed.
  void watch(clock::time_point now) {
    for (size_t i = 0; i < members_.size(); ++i) {
      auto& m = members_[i];
      if (!training(i)) continue;
      const auto silence = now - m.last_seen;
      // Before its first heartbeat a member is still loading its data and model.
      const auto limit = m.heard ? o_.heartbeat_timeout : std::max(o_.heartbeat_timeout, o_.join_timeout);
      if (m.suspected && m.last_seen > m.suspected_at) m.suspected = false;
      if (m.suspected && silence > o_.suspect_silence)
        remove(i, "lost",
               fmt::format("node {} lost: its neighbour's ring dropped it and nothing heard for {} (its last "
                           "all-reduce: round {})",
                           specs_[i].name, secs(o_.suspect_silence), m.round));
      else if (silence > limit)
        remove(
            i, "lost",
            fmt::format("node {} lost: nothing heard for {} (its last all-reduce: round {})", specs_[i].name,
                        secs(std::chrono::duration_cast<std::chrono::milliseconds>(limit)), m.round));
    }
    for (size_t i = 0; i < members_.size(); ++i) {
      auto& m = members_[i];
      // A joiner fetching the state sends a heartbeat at least every few seconds.
      if (m.joining && now - m.last_seen > std::max(o_.heartbeat_timeout, o_.join_timeout)) {
        m.joining = false;
        m.ready.reset();
        warn(fmt::format("coordinator: node {} stopped joining: nothing heard for {}", specs_[i].name,
                         secs(std::max(o_.heartbeat_timeout, o_.join_timeout))));
      }
    }
    if (fence_) {
      for (size_t i = 0; i < members_.size(); ++i) {
        // A node still starting (no heartbeat yet) answers once its main loop runs.
        const auto limit = members_[i].heard ? o_.fence_timeout : std::max(o_.fence_timeout, o_.join_timeout);
        if (fence_ && training(i) && !members_[i].acked && now - fence_->started > limit)
          remove(i, "lost",
                 fmt::format("node {} lost: no answer to the fence of epoch {} within {}", specs_[i].name,
                             fence_->epoch, secs(limit)));
      }
      // Below the quorum the fence stays until joiners make it up (or quorum_timeout passes).
      // Below the quorum, or held for a slow joiner: until a joiner is ready (or the hold runs out).
      if (fence_ && (!quorum_deadline_ || any_ready()) &&
          (!hold_until_ || any_ready() || now > *hold_until_)) {
        bool all = true;
        for (auto i : training_members()) all = all && members_[i].acked;
        if (all) conclude_fence();
      }
      return;
    }
    if (reset_wanted_) {
      for (auto i : training_members())
        if (members_[i].suspected) return;
      start_fence("ring_reset", "a ring failed");
    }
  }

  /// Takes member i out of the membership and starts the next epoch without it; `why` is logged and, if it
  /// is still running, sent to it.
  void remove(size_t i, const std::string& reason, const std::string& why) {
    auto& m = members_[i];
    if (!m.member) return;
    m.member = false;
    m.removed = reason;
    warn("coordinator: " + why);
    if (o_.on_error && reason == "lost") o_.on_error("node_lost");
    if (m.identity && reason != "left") tell_removed(m, why);
    start_fence(reason, why);
  }

  void tell_removed(member_state& m, const std::string& why) {
    m.told_removed = clock::now();
    reply_error(*m.identity, errc::evicted,
                "this node was removed from the cluster (" + why +
                    "); start it again with the same command to rejoin");
  }

  void send_to(size_t i, envelope e) {
    e.cluster_id = o_.cluster_id;
    e.sender = no_rank;
    reply(*members_[i].identity, e);
  }

  /// Every training member abandons its all-reduce and reports what it holds; restarts a fence in progress.
  void start_fence(const std::string& reason, const std::string& why) {
    reset_wanted_ = false;
    const auto members = training_members();
    if (members.empty()) {
      fence_.reset();
      return;
    }
    const uint64_t epoch = std::max(epoch_, fence_ ? fence_->epoch : 0) + 1;
    fence_ = fence_state{epoch, clock::now(), fence_ ? fence_->reason + ", " + reason : reason};
    for (auto i : members) {
      members_[i].acked = false;
      envelope e;
      e.body = fence_msg{epoch};
      send_to(i, std::move(e));
    }
    info(fmt::format("coordinator: membership changes ({}): fencing epoch {} for {}", why, epoch,
                     names_of(members)));
  }

  bool any_ready() const {
    for (const auto& m : members_)
      if (m.joining && m.ready) return true;
    return false;
  }

  /// Every member answered: the next epoch's ring (file order), and the all-reduce every member holds.
  /// Joiners that hold the state after exactly that all-reduce are admitted; the others fetch again.
  void conclude_fence() {
    auto members = training_members();
    // A member holds the all-reduce it committed last, or the one in flight whose result had arrived.
    std::optional<reduce_key> commit;
    for (auto i : members) {
      const auto& a = members_[i].ack;
      const reduce_key reached = a.has_pending && a.have_result ? a.pending : a.committed;
      if (!commit || reached < *commit) commit = reached;
    }
    if (!commit) return;
    hold_until_.reset();
    if (admit_joiners(*commit, members)) {
      hold_until_ = clock::now() + max_hold;
      info(
          fmt::format("coordinator: the members wait at the fence of epoch {} (up to {}) for a joiner that "
                      "fetches the state of round {}",
                      fence_->epoch, secs(max_hold), commit->round));
      return;
    }
    members = training_members();
    if (members.size() < o_.min_nodes) {
      if (!quorum_deadline_) {
        quorum_deadline_ = clock::now() + o_.quorum_timeout;
        warn("coordinator: " + quorum_text() +
             fmt::format("; the members keep their state and wait up to {} for nodes to join",
                         secs(o_.quorum_timeout)));
      }
      return;
    }
    if (quorum_deadline_) {
      info(fmt::format("coordinator: quorum back: {} live nodes ({})", members.size(), names_of(members)));
      quorum_deadline_.reset();
    }
    // A ring that fails again and again among live members (a blocked link, say) would otherwise be reset
    // for ever: after max_resets resets without an all-reduce completing in between, the run is called off.
    if (fence_->reason == "ring_reset") {
      resets_without_progress_ =
          last_reset_commit_ && *last_reset_commit_ == *commit ? resets_without_progress_ + 1 : 1;
      last_reset_commit_ = *commit;
      if (resets_without_progress_ > max_resets) {
        give_up_ = fmt::format(
            "the ring failed {} times in a row among live nodes without completing an "
            "all-reduce (after round {} fragment {}); last failure: {}; check the links "
            "between the nodes (firewalls, endpoints)",
            resets_without_progress_, commit->round, commit->fragment, last_ring_failure_);
        return;
      }
    }
    epoch_ = fence_->epoch;
    membership_msg mm;
    mm.epoch = epoch_;
    mm.commit = *commit;
    for (size_t r = 0; r < members.size(); ++r) {
      const auto& spec = specs_[members[r]];
      mm.peers.push_back(peer_of(r, members[r]));
      mm.workers.push_back(spec.workers);
    }
    mm.keys = all_keys();
    remember_announced(mm.keys);
    for (size_t r = 0; r < members.size(); ++r) {
      mm.rank = static_cast<uint32_t>(r);
      envelope e;
      e.body = mm;
      send_to(members[r], std::move(e));
    }
    info(fmt::format("coordinator: epoch {} ({}): ring {}; all-reduces after round {} fragment {} are redone",
                     epoch_, fence_->reason, names_of(members), commit->round, commit->fragment));
    if (o_.on_epoch) o_.on_epoch(epoch_, members.size(), fence_->reason);
    fence_.reset();
  }

  /// Joiners ready with the state after `commit` become members (they answer this fence as holding it);
  /// joiners ready with another state are sent back to fetch the current one.
  /// Returns true to hold the fence: a joiner's state was stale (its fetch took longer than what was left of
  /// a round), and every member has applied `commit`, so each serves that round's state while it waits. Once
  /// per joiner: its first attempt stalls nobody, its second is waited for.
  bool admit_joiners(const reduce_key& commit, const std::vector<size_t>& members) {
    bool all_applied = true;
    for (auto j : members) all_applied = all_applied && members_[j].ack.committed == commit;
    bool hold = false;
    for (size_t i = 0; i < members_.size(); ++i) {
      auto& m = members_[i];
      if (!m.joining || !m.ready) continue;
      if (stop_) {
        cancel_join(i);
        continue;
      }
      // The members' state after `commit` is that of its round once the round's last all-reduce is in
      // (a published state covers whole rounds, and every member has reached at least its last key).
      if (m.ready->round == commit.round) {
        m.joining = false;
        m.member = true;
        m.removed.clear();
        m.heard = false;  // join_timeout applies until its first heartbeat, while it starts its workers
        m.suspected = false;
        m.last_seen = clock::now();
        m.acked = true;
        m.ack = fence_ack_msg{fence_->epoch, commit, false, {}, false};
        m.round = m.ready->round;
        info(fmt::format("coordinator: node {} admitted in epoch {} with the state of round {}",
                         specs_[i].name, fence_->epoch, m.ready->round));
        if (o_.on_join) o_.on_join(specs_[i].name, m.ready->round);
      } else {
        const bool hold_now = !m.held && all_applied;
        m.held = m.held || hold_now;
        hold = hold || hold_now;
        const auto note = fmt::format(
            "the state of round {} (all-reduce {}/{}) is stale: the members hold all-reduce {}/{}; fetch "
            "again{}",
            m.ready->round, m.ready->key.round, m.ready->key.fragment, commit.round, commit.fragment,
            hold_now ? fmt::format(" (the members wait for it up to {})", secs(max_hold)) : "");
        info(fmt::format("coordinator: node {}: {}", specs_[i].name, note));
        m.ready.reset();
        send_recover(i, note, commit.round);
      }
    }
    return hold;
  }

  /// A joiner while the cluster stops: it is not admitted, and told so (it exits 0).
  void cancel_join(size_t i) {
    auto& m = members_[i];
    m.joining = false;
    m.ready.reset();
    info(fmt::format("coordinator: node {} is not admitted: the cluster is stopping", specs_[i].name));
    if (m.identity)
      reply_error(*m.identity, errc::cancelled,
                  "the cluster is stopping (longwave stop): start this node again with the cluster");
  }

  /// Tells joiner i where to fetch the state: every training member that serves it, and the round the
  /// members hold (`want`, when its state was stale; else the round they last reported).
  void send_recover(size_t i, const std::string& note, std::optional<uint64_t> want = std::nullopt) {
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
    r.round = want.value_or(round.value_or(0));
    r.worker_offset = specs_[i].worker_offset;
    envelope e;
    e.body = std::move(r);
    send_to(i, std::move(e));
  }

  std::string quorum_text() const {
    std::vector<size_t> gone;
    for (size_t i = 0; i < members_.size(); ++i)
      if (!members_[i].removed.empty()) gone.push_back(i);
    const auto live = training_members();
    return fmt::format("quorum lost: {} live node(s) ({}), [cluster] min_nodes = {}; missing: {}",
                       live.size(), names_of(live), o_.min_nodes, names_of(gone));
  }

  /// 0 when a member finished the run, else 1; names the members that left on the way.
  int outcome() const {
    std::vector<size_t> finished, gone;
    for (size_t i = 0; i < members_.size(); ++i) (members_[i].finished ? finished : gone).push_back(i);
    if (finished.empty()) {
      info("coordinator: no node finished the run (failed, lost or left: " + names_of(gone) + ")");
      return 1;
    }
    const bool all_stopped =
        std::all_of(finished.begin(), finished.end(), [&](size_t i) { return members_[i].stopped; });
    if (gone.empty() && stop_ && stop_->round && all_stopped)
      info(fmt::format(
          "coordinator: every node stopped after round {} (longwave stop); the same commands resume the run",
          *stop_->round));
    else if (gone.empty())
      info("coordinator: every node finished");
    else {
      std::string detail;
      for (auto i : gone)
        detail += fmt::format("{}{} ({})", detail.empty() ? "" : ", ", specs_[i].name, members_[i].removed);
      info(fmt::format("coordinator: the run finished on {}; removed on the way: {}", names_of(finished),
                       detail));
    }
    return 0;
  }

  std::string ring_text(const std::vector<size_t>& members) const {
    std::string out;
    for (size_t r = 0; r < members.size(); ++r)
      out += fmt::format("{}{}={}", r ? " -> " : "", r, specs_[members[r]].name);
    return out;
  }

  void reply(const std::string& identity, const envelope& e) {
    std::vector<zmq::message_t> parts;
    parts.emplace_back(identity.data(), identity.size());
    parts.push_back(to_message(build_envelope(e)));
    (void)zmq::send_multipart(sock_, parts, zmq::send_flags::dontwait);
  }

  void reply_error(const std::string& identity, errc code, const std::string& message) {
    envelope e;
    e.cluster_id = o_.cluster_id;
    e.sender = no_rank;
    e.body = error_msg{static_cast<uint16_t>(code), message.substr(0, max_message_bytes)};
    reply(identity, e);
  }

  /// A dropped control message: logged (the first logged_drops, then every drop_log_every-th) and counted.
  void dropped(const std::string& line) {
    const uint64_t n = ++n_dropped_;
    if (n <= logged_drops || n % drop_log_every == 0)
      warn(line + (n == logged_drops ? fmt::format(" ({} control messages dropped; from now on every {}th is "
                                                   "logged)",
                                                   n, drop_log_every)
                   : n > logged_drops ? fmt::format(" ({} control messages dropped so far)", n)
                                      : std::string()));
  }

  /// A message from a connection that has not said hello. A member's heartbeat, bye or error means a node
  /// that joined an earlier coordinator (this one was restarted): named once, then only counted.
  void from_stranger(const std::string& identity, const envelope& e, const std::string& peer) {
    const bool claims_member = e.sender < members_.size() && !std::holds_alternative<hello_msg>(e.body);
    if (claims_member && strangers_.size() < max_strangers && strangers_.insert(identity).second) {
      const auto& name = specs_[e.sender].name;
      running_elsewhere_.insert(name);
      const auto* hb = std::get_if<heartbeat_msg>(&e.body);
      info(fmt::format(
          "coordinator: node {} ({}) is training under an earlier coordinator{}; waiting for it to "
          "re-announce itself",
          name, peer, hb ? fmt::format(" (heartbeat of round {})", hb->round) : ""));
      return;
    }
    if (strangers_.count(identity)) return;
    dropped(fmt::format("coordinator: dropped a control message from {}, which has not said hello", peer));
  }

  /// Tells every joined node that the cluster is off, then returns code.
  int call_off(const std::string& why, int code) {
    // A training node stops on errc::evicted; a joining one reports peer_lost.
    for (const auto& m : members_)
      if (m.identity && !m.finished && m.removed.empty())
        reply_error(*m.identity, welcomed_ ? errc::evicted : errc::peer_lost,
                    "the cluster was called off: " + why);
    return code;
  }

  /// The welcome of the member at position `rank` of `members` (file indices in ring order).
  void send_welcome(const std::vector<size_t>& members, size_t rank) {
    welcome_msg w;
    w.rank = static_cast<uint32_t>(rank);
    w.world_size = static_cast<uint32_t>(members.size());
    w.start_round = start_round();
    w.epoch = epoch_;
    for (size_t r = 0; r < members.size(); ++r) w.peers.push_back(peer_of(r, members[r]));
    w.keys = all_keys();
    remember_announced(w.keys);
    envelope e;
    e.cluster_id = o_.cluster_id;
    e.sender = no_rank;
    e.body = std::move(w);
    reply(*members_[members[rank]].identity, e);
    members_[members[rank]].last_seen = clock::now();
  }

  /// CURVE: node `name`'s public key ("" without CURVE).
  std::string key_of(const std::string& name) const { return o_.node_keys ? o_.node_keys->key_of(name) : ""; }

  /// The member at file index i, at position `rank` of a ring.
  peer_entry peer_of(size_t rank, size_t i) const {
    return {static_cast<uint32_t>(rank), specs_[i].name, specs_[i].endpoint, key_of(specs_[i].name)};
  }

  /// CURVE: every node key admitted (what members admit on their ring and state sockets).
  std::vector<peer_entry> all_keys() const {
    std::vector<peer_entry> out;
    if (o_.node_keys)
      for (const auto& [name, key] : o_.node_keys->entries()) out.push_back({0, name, "", key});
    return out;
  }

  /// The node keys the members were told of, so that a key read later is announced with a new epoch.
  void remember_announced(const std::vector<peer_entry>& keys) {
    for (const auto& k : keys) keys_announced_.insert(k.public_key);
  }

  /// Reports handshakes the monitor saw fail (CURVE only).
  void drain_monitor() {
    if (!monitor_) return;
    while (const auto ev = next_monitor_event(*monitor_)) {
      handshake_refusal r;
      r.reason = "handshake";
      r.address = "a connection to " + ev->address;
      refused(r, n_handshake_failures_, "failed handshakes");
    }
  }

  /// A refused handshake: logged sparingly (as dropped control messages are), counted by on_refused.
  void refused(const handshake_refusal& r, std::atomic<uint64_t>& counter, const char* counted) {
    const uint64_t n = ++counter;
    if (n <= logged_drops || n % drop_log_every == 0)
      warn("coordinator: " + r.describe() +
           (n > logged_drops ? fmt::format(" ({} {} so far)", n, counted) : std::string()));
    if (o_.on_refused) o_.on_refused(r);
  }

  /// The oldest of the joined members' resume rounds: a round every one of them has a checkpoint for.
  uint64_t start_round() const {
    std::optional<uint64_t> r;
    for (const auto& m : members_)
      if (m.identity) r = std::min(r.value_or(m.resume_round), m.resume_round);
    return r.value_or(0);
  }

  std::optional<size_t> rank_of_identity(const std::string& id) const {
    for (size_t i = 0; i < members_.size(); ++i)
      if (members_[i].identity && *members_[i].identity == id) return i;
    return std::nullopt;
  }

  /// Turns a hello away with an error reply, counted as a rejected join.
  void turn_away(const std::string& identity, errc code, const std::string& message) {
    if (o_.on_error) o_.on_error("rejected_join");
    reply_error(identity, code, message);
  }

  void on_hello(const std::string& identity, const hello_msg& h, const std::string& peer) {
    if (h.protocol_version != protocol_version()) {
      warn(fmt::format("coordinator: turned away node '{}' ({}): protocol version {}, ours is {}",
                       h.node_name, peer, h.protocol_version, protocol_version()));
      return turn_away(
          identity, errc::invalid_config,
          fmt::format("protocol version {} is not the coordinator's {}: build every node and the "
                      "coordinator from the same Longwave release",
                      h.protocol_version, protocol_version()));
    }
    size_t idx = members_.size();
    for (size_t i = 0; i < specs_.size(); ++i)
      if (specs_[i].name == h.node_name) idx = i;
    if (idx == members_.size() && o_.open) {
      if (!welcomed_) return;  // it joins once the cluster trains; its hello comes again every 2 s
      const auto added = add_open_node(identity, h, peer);
      if (!added) return;
      idx = *added;
    }
    if (idx == members_.size()) {
      std::vector<std::string> names;
      for (const auto& m : specs_) names.push_back(m.name);
      warn(fmt::format("coordinator: turned away unknown node '{}' ({})", h.node_name, peer));
      return turn_away(
          identity, errc::invalid_config,
          fmt::format("node '{}' is not in this cluster (nodes: {})", h.node_name, join_names(names)));
    }
    const auto& want = specs_[idx];
    if (h.n_workers != want.workers || h.data_endpoint != want.endpoint) {
      warn(fmt::format("coordinator: turned away node '{}': its cluster file differs", h.node_name));
      return turn_away(
          identity, errc::invalid_config,
          fmt::format("node '{}' says {} workers at {}, the coordinator's cluster file says {} at {}: "
                      "start every role from the same cluster file",
                      h.node_name, h.n_workers, h.data_endpoint, want.workers, want.endpoint));
    }
    if (o_.config_hash != 0 && h.config_hash != o_.config_hash) {
      warn(fmt::format("coordinator: turned away node '{}': its training settings differ", h.node_name));
      return turn_away(
          identity, errc::invalid_config,
          fmt::format("node '{}' trains with other settings than the coordinator (fingerprint "
                      "{:016x}, the coordinator's {:016x}): start every role from the same cluster "
                      "file and the same --set options",
                      h.node_name, h.config_hash, o_.config_hash));
    }
    auto& m = members_[idx];
    if (h.running) return on_reannounce(idx, identity, h);
    if (m.identity && *m.identity == identity) {
      // The same process again: its periodic hello while it waits, or one that crossed our welcome (or our
      // recover).
      m.last_seen = clock::now();
      if (welcomed_ && epoch_ == 1 && m.member) {
        const auto members = training_members();
        for (size_t r = 0; r < members.size(); ++r)
          if (members[r] == idx) send_welcome(members, r);
      }
      if (m.joining && !m.ready) send_recover(idx, "");
      return;
    }
    if (welcomed_) return on_join(idx, identity, h, peer);
    // Taking a running cluster over: the hello is answered (with where to fetch the state) once that is
    // done; the node says hello again every 2 s.
    if (takeover_since_ && !welcomed_) return;
    if (m.identity && clock::now() - m.last_seen <= join_silence) {
      warn(
          fmt::format("coordinator: turned away a second process for node '{}' ({}): that node has already "
                      "joined from another process",
                      h.node_name, peer));
      return turn_away(identity, errc::invalid_config,
                       fmt::format("node {} has already joined from another process{}; stop one of them",
                                   h.node_name, all_joined() ? " and the cluster is training" : ""));
    }
    if (m.identity)
      warn(fmt::format(
          "coordinator: node '{}' said hello from a new process ({}) after {} of silence from the "
          "first; using the new one",
          h.node_name, peer,
          secs(std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - m.last_seen))));
    m.identity = identity;
    m.last_seen = clock::now();
    m.resume_round = h.resume_round;
    m.state_endpoint = h.state_endpoint;
    size_t joined = 0;
    for (const auto& x : members_) joined += x.identity ? 1 : 0;
    info(fmt::format("coordinator: node {} joined ({} workers, ring endpoint {}) [{}/{}]", h.node_name,
                     h.n_workers, h.data_endpoint, joined, members_.size()));
  }

  /// A node not in the cluster file asks to join ([cluster] open): it gets the next free data regions
  /// (global worker ranks after the listed nodes'), kept for it if it comes back. nullopt: turned away.
  std::optional<size_t> add_open_node(const std::string& identity, const hello_msg& h,
                                      const std::string& peer) {
    uint64_t used = 0;
    for (size_t i = o_.members.size(); i < specs_.size(); ++i) used += specs_[i].workers;
    std::string problem;
    const auto& ep = h.data_endpoint;
    const auto colon = ep.rfind(':');
    const bool name_ok = !h.node_name.empty() && h.node_name.size() <= 32 &&
                         std::all_of(h.node_name.begin(), h.node_name.end(), [](char c) {
                           return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
                         });
    if (!name_ok)
      problem = "a node name is 1..32 of a-z A-Z 0-9 _ -";
    else if (ep.rfind("tcp://", 0) != 0 || colon == std::string::npos || colon <= 6 ||
             colon + 1 == ep.size() || ep.find('*') != std::string::npos)
      problem = fmt::format("ring endpoint '{}' is not tcp://HOST:PORT", ep);
    else if (h.n_workers == 0 || used + h.n_workers > o_.open_workers)
      problem = fmt::format(
          "{} workers do not fit: {} of [cluster] open_workers = {} are taken by other nodes not "
          "in the file; raise open_workers",
          h.n_workers, used, o_.open_workers);
    for (const auto& sp : specs_)
      if (sp.endpoint == h.data_endpoint)
        problem = fmt::format("node {} has ring endpoint {}", sp.name, sp.endpoint);
    if (!problem.empty()) {
      warn(fmt::format("coordinator: turned away node '{}' ({}), not in the cluster file: {}", h.node_name,
                       peer, problem));
      turn_away(identity, errc::invalid_config, fmt::format("node '{}': {}", h.node_name, problem));
      return std::nullopt;
    }
    specs_.push_back({h.node_name, h.data_endpoint, h.n_workers, listed_workers_ + used});
    members_.emplace_back();
    members_.back().removed = "absent";
    info(fmt::format(
        "coordinator: node {} is not in the cluster file ([cluster] open): {} workers, global ranks "
        "{}..{}",
        h.node_name, h.n_workers, specs_.back().worker_offset,
        specs_.back().worker_offset + h.n_workers - 1));
    return specs_.size() - 1;
  }

  /// A node asks to join the running cluster (absent at the start, removed, or restarted after a crash): it
  /// is told where to fetch the state, then admitted at a fence (join_ready).
  void on_join(size_t idx, const std::string& identity, const hello_msg& h, const std::string& peer) {
    auto& m = members_[idx];
    const auto now = clock::now();
    const auto& name = h.node_name;
    if (m.finished)
      return turn_away(identity, errc::invalid_config, fmt::format("node {} has finished the run", name));
    if (m.member || m.joining) {
      // Another process has this name. A restarted node's predecessor falls silent (it died): once it has
      // been silent for restart_silence the newcomer takes its place; a live one keeps it.
      if (now - m.last_seen < restart_silence) {
        if (!m.contender || *m.contender != identity) {
          m.contender = identity;
          m.contender_since = now;
        } else if (now - m.contender_since > join_silence) {
          m.contender.reset();
          warn(
              fmt::format("coordinator: turned away a second process for node '{}' ({}): that node is "
                          "live in the cluster",
                          name, peer));
          return turn_away(
              identity, errc::invalid_config,
              fmt::format("node {} is live in the cluster (heard from {} ago) from another "
                          "process; stop one of them",
                          name,
                          secs(std::chrono::duration_cast<std::chrono::milliseconds>(now - m.last_seen))));
        }
        return;  // no answer yet: its next hello (every 2 s) is looked at again
      }
      m.contender.reset();
      if (m.member)
        remove(idx, "lost",
               fmt::format("node {} lost: a new process ({}) said hello with its name after {} of silence "
                           "(restarted?)",
                           name, peer,
                           secs(std::chrono::duration_cast<std::chrono::milliseconds>(now - m.last_seen))));
    }
    if (training_members().empty())
      return turn_away(identity, errc::peer_lost, "no node is training in this cluster any more");
    if (stop_)
      return reply_error(identity, errc::cancelled,
                         "the cluster is stopping (longwave stop): start this node again with the cluster");
    m.identity = identity;
    m.last_seen = now;
    m.joining = true;
    m.ready.reset();
    m.held = false;
    m.state_endpoint = h.state_endpoint;
    info(fmt::format(
        "coordinator: node {} ({}) asks to join the running cluster (epoch {}{}): it fetches the "
        "state from {}",
        name, peer, epoch_, m.removed.empty() ? "" : ", it was " + m.removed, names_of(training_members())));
    send_recover(idx, "");
    // A key the members were not sent (added to nodes/ later, or a coordinator that took the cluster over):
    // their state servers admit it from the next membership on, so a fence brings one now (the joiner
    // fetches again).
    if (o_.node_keys && !fence_ && !keys_announced_.count(key_of(name)))
      start_fence(
          "join",
          fmt::format("the members learn node {}'s key, which no membership sent to them held", name));
  }

  /// A joiner holds the state after all-reduce r.key: a fence admits it (conclude_fence).
  void on_join_ready(size_t idx, const join_ready_msg& r) {
    auto& m = members_[idx];
    if (m.ready && m.ready->key == r.key) return;  // its periodic repeat
    m.ready = r;
    info(fmt::format("coordinator: node {} holds the state of round {}: admitting it at a fence",
                     specs_[idx].name, r.round));
    if (!fence_) start_fence("join", "node " + specs_[idx].name + " joins");
  }

  /// A training node re-announces itself: to a restarted coordinator (which then takes the cluster over),
  /// or to this one again after a dropped connection (it is answered with the current epoch).
  void on_reannounce(size_t idx, const std::string& identity, const hello_msg& h) {
    auto& m = members_[idx];
    const auto now = clock::now();
    if (welcomed_) {
      if (m.identity && *m.identity == identity && m.member) {
        m.last_seen = now;
        envelope e;
        e.body = welcome_msg{0, 0, {}, 0, epoch_};
        send_to(idx, std::move(e));
      } else if (!m.member && m.identity && *m.identity == identity) {
        tell_removed(m, "node " + h.node_name + " was removed in an earlier epoch");
      } else {
        reply_error(
            identity, errc::evicted,
            fmt::format("node {} re-announced itself after the coordinator had taken the cluster over "
                        "without it; start it again with the same command to rejoin",
                        h.node_name));
      }
      return;
    }
    if (!takeover_since_) {
      takeover_since_ = now;
      info(
          fmt::format("coordinator: node {} is already training (epoch {}, last applied round {}): taking "
                      "the running cluster over; waiting up to {} for its other nodes",
                      h.node_name, h.epoch, h.committed.round, secs(o_.heartbeat_timeout)));
    }
    m.identity = identity;
    m.last_seen = now;
    m.announce = h;
    m.state_endpoint = h.state_endpoint;
  }

  /// `longwave stop`: every member is asked where it can stop (watch_stop sends the query and, once all have
  /// answered, the round); the requester is told what happens. Before training began, the coordinator and
  /// the nodes that joined stop at once (run: stop_before_start).
  void on_stop_request(const std::string& identity) {
    if (stop_)
      return reply_error(identity, errc::none,
                         stop_->round ? fmt::format("the cluster is already stopping: every node stops after "
                                                    "round {}",
                                                    *stop_->round)
                                      : std::string("the cluster is already stopping: its nodes are "
                                                    "finishing their current round"));
    if (takeover_since_ && !welcomed_)
      return reply_error(identity, errc::deadline_missed,
                         "the coordinator is taking the running cluster over (its nodes are re-announcing "
                         "themselves): try again in a few seconds");
    stop_ = stop_state{};
    if (!welcomed_)
      return reply_error(identity, errc::none,
                         "the cluster had not begun training: the coordinator and the nodes that joined stop "
                         "now");
    for (size_t i = 0; i < members_.size(); ++i)
      if (members_[i].joining) cancel_join(i);
    const auto members = training_members();
    uint64_t top = 0;
    for (auto i : members) {
      members_[i].stop_hold.reset();
      top = std::max(top, members_[i].round);
    }
    info(fmt::format("coordinator: stopping the cluster (longwave stop): asking {} where they can stop",
                     names_of(members)));
    reply_error(identity, errc::none,
                fmt::format("the cluster stops at its next round boundary: {} finish their current round "
                            "(last reported round {}), save their checkpoints and exit",
                            names_of(members), top));
  }

  /// A stop in progress: once every member said where it holds, the round after which all stop is the
  /// largest of those (no member has passed it). The query, then the round, is re-sent every 2 s to the
  /// members that still need it (a dropped connection loses messages; both are idempotent at the node).
  void watch_stop(clock::time_point now) {
    const auto members = training_members();
    if (!stop_->round) {
      std::optional<uint64_t> top;
      bool all = true;
      for (auto i : members) {
        if (!members_[i].stop_hold) all = false;
        top = std::max(top.value_or(0), members_[i].stop_hold.value_or(0));
      }
      if (all && top) {
        stop_->round = *top;
        stop_->sent = {};
        info(fmt::format("coordinator: every node stops after round {} ({})", *top, names_of(members)));
      }
    }
    if (now - stop_->sent < hello_every) return;
    stop_->sent = now;
    for (auto i : members) {
      if (!stop_->round && members_[i].stop_hold) continue;
      envelope e;
      e.body = stop_msg{stop_->round.value_or(0)};
      send_to(i, std::move(e));
    }
  }

  /// Stopped (longwave stop) before training began: the nodes that joined are told, and stop too (exit 0).
  int stop_before_start() {
    for (const auto& m : members_)
      if (m.identity && m.removed.empty())
        reply_error(*m.identity, errc::cancelled,
                    "the cluster was stopped (longwave stop) before it began training");
    info("coordinator: stopped (longwave stop) before the cluster began training");
    return 0;
  }

  /// A member's theta_global CRC after a round, against the first one reported for that round: a mismatch
  /// means the members no longer train one model (named once per round, counted as theta_mismatch).
  void compare_theta(size_t i, const committed_msg& c) {
    auto [at, fresh] = theta_crcs_.emplace(c.round, std::make_pair(c.theta_crc, i));
    if (!fresh && at->second.first != c.theta_crc && mismatched_rounds_.insert(c.round).second) {
      warn(fmt::format(
          "coordinator: theta after round {} differs between nodes: {} has {:08x}, {} has {:08x}; "
          "they no longer train one model",
          c.round, specs_[at->second.second].name, at->second.first, specs_[i].name, c.theta_crc));
      if (o_.on_error) o_.on_error("theta_mismatch");
    }
    // Rounds far behind the newest are settled: keep the tables small.
    const uint64_t newest = theta_crcs_.rbegin()->first;
    while (theta_crcs_.begin()->first + 64 < newest) theta_crcs_.erase(theta_crcs_.begin());
    while (!mismatched_rounds_.empty() && *mismatched_rounds_.begin() + 64 < newest)
      mismatched_rounds_.erase(mismatched_rounds_.begin());
  }

  /// `longwave node --leave`: forwards the request to the node and answers the requester.
  void on_leave(const std::string& identity, const leave_msg& l) {
    for (size_t i = 0; i < members_.size(); ++i) {
      if (specs_[i].name != l.node) continue;
      if (!welcomed_ || !training(i))
        return reply_error(identity, errc::invalid_config,
                           fmt::format("node {} is not training in this cluster{}", l.node,
                                       members_[i].removed.empty() ? "" : " (" + members_[i].removed + ")"));
      envelope e;
      e.body = l;
      send_to(i, std::move(e));
      info(fmt::format("coordinator: node {} was asked to leave at its next round boundary", l.node));
      return reply_error(identity, errc::none,
                         fmt::format("node {} leaves at its next round boundary (last applied round {})",
                                     l.node, members_[i].round));
    }
    reply_error(identity, errc::invalid_config, fmt::format("node '{}' is not in this cluster", l.node));
  }

  void poll_once() {
    drain_monitor();
    if (!readable(sock_, std::chrono::milliseconds(100))) return;
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(sock_, std::back_inserter(parts), zmq::recv_flags::dontwait)) return;
    if (parts.size() != 2) {
      dropped(fmt::format("coordinator: dropped a control message of {} frames (want 1 after the routing id)",
                          parts.size() - 1));
      return;
    }
    const std::string identity = parts[0].to_string();
    const char* addr = zmq_msg_gets(parts[1].handle(), "Peer-Address");
    const std::string peer = addr ? addr : "unknown";
    // CURVE: the node name the connection's key belongs to (the ZAP handler's user id).
    const std::string keyed_as = o_.node_keys ? user_id_of(parts[1].handle()) : std::string();
    auto parsed = parse_envelope(parts[1].data(), parts[1].size(), o_.cluster_id);
    if (!parsed) {
      const auto& r = parsed.error();
      dropped(fmt::format("coordinator: dropped a control frame from {}: {}", peer, r.message()));
      if (o_.on_reject) o_.on_reject(to_string(r.reason));
      if (r.reason == reject_reason::wrong_cluster)
        turn_away(identity, errc::invalid_config,
                  "wrong cluster id: this coordinator serves another cluster");
      return;
    }
    const envelope& e = parsed.value();
    if (auto* h = std::get_if<hello_msg>(&e.body)) {
      if (o_.node_keys && keyed_as != h->node_name) {
        warn(
            fmt::format("coordinator: turned away a hello as node '{}' from {}: it came with node '{}''s key",
                        h->node_name, peer, keyed_as));
        return turn_away(identity, errc::invalid_config,
                         fmt::format("this connection's CURVE key is node '{}''s, not node '{}''s: each node "
                                     "uses its own keys/nodes/NAME.secret",
                                     keyed_as, h->node_name));
      }
      return on_hello(identity, *h, peer);
    }
    if (auto* l = std::get_if<leave_msg>(&e.body)) {
      if (o_.node_keys && keyed_as != l->node)
        return reply_error(
            identity, errc::invalid_config,
            fmt::format("only node '{}''s own key may ask it to leave (this connection has node "
                        "'{}''s)",
                        l->node, keyed_as));
      return on_leave(identity, *l);
    }
    const auto rank = rank_of_identity(identity);
    if (std::holds_alternative<stop_msg>(e.body) && !rank) {
      if (o_.node_keys && keyed_as != operator_user_id)
        return reply_error(identity, errc::invalid_config,
                           fmt::format("only the cluster's own key (keys/cluster.secret, the coordinator's) "
                                       "may stop the cluster; this connection has node '{}''s",
                                       keyed_as));
      return on_stop_request(identity);
    }
    if (!rank) return from_stranger(identity, e, peer);
    if (o_.node_keys && keyed_as != specs_[*rank].name) {
      // Another node's key using this member's routing id: never let it speak for the member.
      dropped(fmt::format("coordinator: dropped a message for node {} from {}: it came with node '{}''s key",
                          specs_[*rank].name, peer, keyed_as));
      return;
    }
    auto& m = members_[*rank];
    const std::string& name = specs_[*rank].name;
    m.last_seen = clock::now();
    if (m.joining) {
      if (auto* r = std::get_if<join_ready_msg>(&e.body)) {
        if (stop_) return cancel_join(*rank);
        return on_join_ready(*rank, *r);
      }
      if (std::holds_alternative<bye_msg>(e.body) || std::holds_alternative<error_msg>(e.body)) {
        m.joining = false;
        m.ready.reset();
        warn(fmt::format("coordinator: node {} gave up joining", name));
      }
      return;  // heartbeats while it fetches
    }
    if (!m.removed.empty()) {
      // Not a member any more: it stops when it hears so (said again at most every 10 s).
      if (m.removed != "left" && m.identity && clock::now() - m.told_removed > std::chrono::seconds(10) &&
          !std::holds_alternative<bye_msg>(e.body) && !std::holds_alternative<error_msg>(e.body))
        tell_removed(m, "node " + name + " was removed in an earlier epoch");
      return;
    }
    m.heard = true;  // anything but a hello comes from its main loop
    if (auto* hb = std::get_if<heartbeat_msg>(&e.body)) {
      m.round = hb->round;
    } else if (auto* st = std::get_if<stop_msg>(&e.body)) {
      if (stop_ && m.member && st->round > 0 && !m.stop_hold) m.stop_hold = st->round;
    } else if (auto* c = std::get_if<committed_msg>(&e.body)) {
      if (m.member) compare_theta(*rank, *c);
    } else if (auto* b = std::get_if<bye_msg>(&e.body)) {
      if (b->reason == "done" || b->reason == "stopped") {
        m.finished = true;
        m.stopped = b->reason == "stopped";
        info(m.stopped ? fmt::format("coordinator: node {} stopped after round {} with its checkpoint", name,
                                     stop_ && stop_->round ? *stop_->round : m.round)
                       : fmt::format("coordinator: node {} finished", name));
      } else {
        remove(*rank, "left", fmt::format("node {} left: {}", name, b->reason));
      }
    } else if (auto* er = std::get_if<error_msg>(&e.body)) {
      remove(
          *rank, "failed",
          fmt::format("node {} failed ({}): {}", name, to_string(static_cast<errc>(er->code)), er->message));
    } else if (auto* fa = std::get_if<fence_ack_msg>(&e.body)) {
      if (fence_ && fa->epoch == fence_->epoch && m.member) {
        m.acked = true;
        m.ack = *fa;
      }
    } else if (auto* rf = std::get_if<ring_failed_msg>(&e.body)) {
      if (rf->epoch != epoch_ || fence_) return;  // already being dealt with
      warn(fmt::format("coordinator: node {}'s ring failed in epoch {}{}: {}", name, rf->epoch,
                       rf->suspect.empty() ? "" : " (it lost " + rf->suspect + ")", rf->reason));
      reset_wanted_ = true;
      last_ring_failure_ = fmt::format("node {}: {}", name, rf->reason);
      for (size_t j = 0; j < members_.size(); ++j)
        if (training(j) && specs_[j].name == rf->suspect && !members_[j].suspected) {
          members_[j].suspected = true;
          members_[j].suspected_at = clock::now();
        }
    }
  }

  const coordinator_options& o_;
  std::vector<member_spec> specs_;     // the listed nodes in file order, then nodes not in the file
  std::vector<member_state> members_;  // one per spec
  uint64_t listed_workers_ = 0;
  uint64_t n_dropped_ = 0;
  std::set<std::string> strangers_;          // routing ids of running nodes of an earlier coordinator
  std::set<std::string> running_elsewhere_;  // their names
  bool welcomed_ = false;                    // training began
  uint64_t epoch_ = 1;                       // the current membership's epoch
  std::optional<fence_state> fence_;         // a membership change in progress
  std::optional<stop_state> stop_;           // longwave stop in progress
  std::map<uint64_t, std::pair<uint32_t, size_t>> theta_crcs_;  // round -> first CRC reported, by whom
  std::set<uint64_t> mismatched_rounds_;                        // rounds already named as mismatched
  std::set<std::string> keys_announced_;  // node public keys sent in a welcome or membership
  bool reset_wanted_ = false;             // a ring failed: fence once its suspects are settled
  std::optional<clock::time_point> quorum_deadline_;
  std::optional<clock::time_point> hold_until_;  // the fence is held for a slow joiner until then
  static constexpr std::chrono::seconds max_hold{30};
  std::optional<clock::time_point> takeover_since_;  // the first re-announcement of a running node
  static constexpr int max_resets = 3;
  int resets_without_progress_ = 0;
  std::optional<reduce_key> last_reset_commit_;
  std::string last_ring_failure_;
  std::optional<std::string> give_up_;  // why the run is called off
  std::atomic<uint64_t> n_handshake_failures_{0};
  std::atomic<uint64_t> n_key_refusals_{0};  // counted on the ZAP thread
  zmq::context_t ctx_{1};
  zmq::socket_t sock_{ctx_, zmq::socket_type::router};
  std::unique_ptr<zmq::socket_t> monitor_;  // CURVE: failed handshakes of sock_
  std::unique_ptr<zap_handler> zap_;        // CURVE: admits the node keys; closed before ctx_
};

}  // namespace

int run_coordinator(const coordinator_options& opts) {
  if (opts.members.empty()) throw lw_error(errc::invalid_config, "coordinator: the cluster has no nodes");
  coordinator c(opts);
  return c.run();
}

}  // namespace longwave::comm
