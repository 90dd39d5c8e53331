#pragma once
// The cluster's master as a pure state machine: control messages and the passing of time go in, replies,
// log lines and metric events come out. No sockets, no threads, no clock of its own (every event carries
// `now`), so tests drive it through scripted event tables in virtual time (tests/unit/master_state_test.cpp).
// cluster/master.cpp is the ZeroMQ shell around it.
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "cluster/control_text.hpp"
#include "cluster/envelope.hpp"
#include "cluster/merge_window.hpp"
#include "comm/curve.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::cluster {

using clock = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;

using control::drop_log_every;
using control::logged_drops;

/// One node the master expects, in ring order.
struct member_spec {
  std::string name;
  std::string endpoint;  ///< the node's ring endpoint, as the cluster file gives it
  uint32_t workers = 1;
  uint64_t worker_offset = 0;  ///< global rank of its first worker (the master fills it in)
};

/// Where a member stands. Each value says when it is entered and what may follow.
enum class member_phase : uint8_t {
  /// No process has said hello as this node (every listed node at the start). -> waiting, or removed
  /// (absent) when training begins without it.
  absent,
  /// Said hello before training began; waits for its welcome. -> member (training begins), finished.
  waiting,
  /// A node already training re-announced itself to a restarted master. -> member (the takeover).
  announced,
  /// In the current epoch's membership, training. -> finished, removed (lost, left, failed).
  member,
  /// Asked to join the running cluster: fetching the state from the members. -> ready, removed (gave up).
  joining,
  /// A joiner holding a fetched state, admitted at the next fence if the members hold it. -> member,
  /// joining (its state was stale: fetch again), removed (gave up).
  ready,
  /// Said bye "done" (finished the run) or "stopped" (longwave stop). Final.
  finished,
  /// Out of the membership (`removal` says why); a new process with its name may join again. -> joining.
  removed,
};
const char* to_string(member_phase p);

/// Why a member left the membership. Kept while it joins again, cleared when it is admitted.
enum class removal : uint8_t {
  none,
  absent,  ///< it had not said hello when training began (or is a node not in the file, [cluster] open)
  lost,    ///< silent past the heartbeat timeout, its ring dropped it, or a fence went unanswered
  left,    ///< said bye with a reason other than done or stopped (`longwave node --leave`, Ctrl-C)
  failed,  ///< reported an error
};
const char* to_string(removal r);

/// One member as status lines and metrics see it.
struct member_status {
  std::string name;
  bool joined = false;  ///< said hello
  bool alive = false;   ///< joined, and neither finished, failed nor silent past heartbeat_timeout
  double age_s = 0;     ///< seconds since its last message (since the master started, before it joined)
};

/// The master's rules and limits (cluster/master.hpp's master_options carries them).
struct master_settings {
  uint64_t cluster_id = 0;
  /// The training fingerprint every hello must carry (0: not checked).
  uint64_t config_hash = 0;
  /// The settings config_hash covers (config::training_settings): a node turned away for its own is told
  /// the keys that differ.
  std::string training_settings;
  std::vector<member_spec> members;
  /// Every member must have said hello within this time of start, else the run is called off.
  ms join_timeout{60000};
  /// A member that sends nothing (heartbeats included) for this long is removed from the membership (a new
  /// epoch without it). Nodes send a heartbeat every 2 s, and say every 2 s that they are still starting
  /// from their welcome to their first heartbeat; until its first word after the welcome a member has
  /// first_word_allowance.
  ms heartbeat_timeout{6000};
  /// A member whose neighbour's ring lost it is removed once silent this long.
  ms suspect_silence{2500};
  /// A member that does not answer a fence within this time is removed.
  ms fence_timeout{4000};
  /// Nodes not in `members` may join the running cluster, with at most open_workers workers in all.
  bool open = false;
  uint32_t open_workers = 0;
  /// Fewer live members than this: the others wait up to quorum_timeout, then the run is stopped.
  size_t min_nodes = 1;
  ms quorum_timeout{60000};
  /// CURVE: the node keys admitted (each bound to its node name); nullptr without CURVE.
  std::shared_ptr<const comm::key_ring> node_keys;
  /// The position of this master's address in [cluster] coordinator: it makes the master's terms its own
  /// (term = generation * term_slots + term_slot), so two masters never share one.
  uint32_t term_slot = 0;
  /// A standby that took the place of a master gone unreachable: when no node says hello by the join
  /// deadline, the run it stood by for had ended (or its nodes are gone), and nothing failed here: exit 0.
  bool took_over = false;
  /// The event log's last end, when the cluster stopped there (longwave stop): the round its nodes stopped
  /// after and those nodes. A resume goes on from that round where one of them holds it, whatever nodes lost
  /// on the way hold: the cluster committed it (nullopt: the rule of the round most nodes hold).
  struct stopped_run {
    uint64_t round = 0;
    std::vector<std::string> nodes;
  };
  std::optional<stopped_run> stopped;
  /// diloco.outer = "async": when the members' contributions merge into a new version (nullopt: the
  /// cluster's rounds have a barrier, and contributions are dropped as unexpected).
  std::optional<merge_rules> async;
  /// Several coordinator addresses: a node drops what it has not read yet when the master's connection
  /// closes (ZMQ_IMMEDIATE), so after a call-off the master stays until each node it told answered (bye or
  /// error) or fell silent for heartbeat_timeout, telling again any that speaks (awaiting_last_words).
  bool await_last_words = false;
};

/// Terms per generation: a cluster lists at most this many coordinator addresses.
inline constexpr uint64_t term_slots = 256;

/// Who sent a control message: the ROUTER routing id, the peer's address, and (CURVE) the node name its key
/// belongs to (comm::operator_user_id for the cluster's own key).
struct sender {
  std::string identity;
  std::string peer;
  std::optional<std::string> keyed_as;
};

/// What the master does, in order: the shell carries each out.
struct send {  ///< a frame to one connection (cluster id and sender filled in)
  std::string to;
  cluster::envelope envelope;
};
struct line {  ///< a progress line, or a problem
  bool warning = false;
  std::string text;
};
struct error_counted {  ///< an error by reason ("node_lost", "rejected_join", "theta_mismatch")
  std::string reason;
};
struct frame_rejected {  ///< a dropped control frame, by comm::reject_reason name
  std::string reason;
};
struct epoch_began {  ///< a new epoch: its number, member count and why ("start", "lost", "join", ...)
  uint64_t epoch = 0;
  size_t members = 0;
  std::string reason;
};
struct node_joined {  ///< a node joined the running cluster with the state of `round`
  std::string name;
  uint64_t round = 0;
};
/// One line of the master's event log (`<run.out_dir>/coordinator.jsonl`): what happened to the cluster, as
/// flat fields. Kinds: start, epoch, removed, admitted, takeover, quorum, pin, release, end, merge, dropped
/// (docs/04-clusters.md).
struct record {
  using value = std::variant<std::string, int64_t>;
  std::string kind;
  std::vector<std::pair<std::string, value>> fields;
};
using action = std::variant<send, line, error_counted, frame_rejected, epoch_began, node_joined, record>;

class master_state {
 public:
  /// Throws lw_error(invalid_config) for a cluster without nodes.
  master_state(master_settings s, clock::time_point start);

  // ---- events ----
  /// A parsed control frame of this cluster.
  void on_frame(const sender& from, const envelope& e, clock::time_point now);
  /// A frame that did not parse (`why`: the rejection's message and reason); wrong_cluster is turned away.
  void on_bad_frame(const sender& from, const comm::rejection& why);
  /// A message of `parts` frames after the routing id (want 1).
  void on_bad_parts(size_t parts);
  /// Time passed: joins and deadlines, silent members, fences, a stop in progress.
  void tick(clock::time_point now);
  /// The process is stopping (Ctrl-C): every node is told the cluster was called off; done() is 130.
  void interrupt();
  /// The master's own loop did not run for `gap` (the process was suspended, its host hung): the members'
  /// silence, a fence and the quorum wait are not theirs, so each gets its time again from `now`.
  void on_paused(ms gap, clock::time_point now);

  // ---- outputs ----
  /// The actions since the last call, in order.
  std::vector<action> take_actions();
  /// Set once the master's work is over: 0 when a member finished the run, 1 when none did (or the run was
  /// called off), 130 after interrupt().
  std::optional<int> done() const { return exit_code_; }
  /// After done(): a node told of the call-off has neither answered nor fallen silent (await_last_words).
  bool awaiting_last_words(clock::time_point now) const;
  /// One entry per member in ring order.
  std::vector<member_status> statuses(clock::time_point now) const;
  /// Seconds the members have waited below min_nodes (0: quorum).
  double quorum_waited_s(clock::time_point now) const;
  /// Where member `name` stands (tests).
  member_phase phase_of(const std::string& name) const;
  uint64_t epoch() const { return epoch_; }
  /// This master's term, carried by every frame it sends: generation 1 at a fresh start, the next
  /// generation after the newest its nodes followed when it takes a running cluster over.
  uint64_t term() const { return term_; }

  /// A welcomed member's first word (its "still starting" beat, sent at once) may take this long after its
  /// welcome: else it died before or on its welcome, and is lost (the members waited join_timeout before).
  static constexpr ms first_word_allowance{10000};

 private:
  /// One member's state.
  struct member {
    member_phase phase = member_phase::absent;
    removal removed = removal::none;
    std::string removed_why;              // what it was told when it was removed (or stopped joining)
    bool stopped = false;                 // finished by bye("stopped"): it stopped with the cluster
    bool told_end = false;                // told of the call-off, no bye or error since (await_last_words)
    bool leaving = false;                 // asked to leave (longwave node --leave) at its next boundary
    std::optional<std::string> identity;  // ROUTER routing id once it said hello
    std::optional<uint64_t> stop_hold;    // a stop: the round after which it holds (its answer to the query)
    bool heard = false;                   // a heartbeat since the welcome
    clock::time_point heard_at;           // its first heartbeat since the welcome
    std::optional<clock::time_point> starting_since;  // its first "still starting" beat
    bool starting_said = false;                       // its long start-up was logged
    bool suspected = false;                           // a neighbour's ring lost it
    clock::time_point last_seen, suspected_at, told_removed;
    uint64_t round = 0;
    uint64_t resume_round = 0;                // from its hello
    uint64_t start_version = 0;               // async: its newest checkpoint's version (its hello's commit)
    uint64_t applied_version = 0;             // async: the newest version it said it applied (committed)
    std::vector<uint64_t> checkpoint_rounds;  // from its hello: every round it holds a checkpoint of
    std::vector<uint32_t> checkpoint_thetas;  // and the CRC of each one's theta (empty: not known)
    bool acked = false;                       // answered the fence in progress
    fence_ack_msg ack;
    std::optional<hello_msg> announce;            // its re-announcement to a restarted master
    std::string state_endpoint;                   // where it serves its training state to joiners
    std::optional<join_ready_msg> ready;          // phase ready: the state it holds
    std::optional<comm::reduce_key> turned_back;  // a joiner's state found stale (its repeats are ignored)
    bool pinned = false;                          // a joiner the members hold at a round boundary for
    std::optional<uint64_t>
        fetch_from;  // a joiner fetching: the members' lowest round at its first heartbeat
    std::optional<clock::time_point> recover_sent;  // when it was last told where to fetch the state
    std::optional<uint64_t> pin_hold;               // a pin: the round after which it holds (its answer)
    std::pair<std::string, uint64_t> contributed;   // async: the last contribution's process identity and seq
    // A second process that said hello with this live member's name, waiting for the first to fall silent.
    std::optional<std::string> contender;
    clock::time_point contender_since;
  };
  /// `longwave stop` in progress: the members are asked where they can stop, then told the round after
  /// which all stop (the largest of their answers).
  struct stop_state {
    std::optional<uint64_t> round;     // once all have answered
    clock::time_point sent;            // when the query or the round was last sent (re-sent every 2 s)
    std::vector<std::string> waiters;  // requesters told how the run ended (longwave stop --wait)
  };
  /// Joiners whose fetch was overtaken: the members hold at one round boundary (the largest of the rounds
  /// they can hold after) until those joiners fetched that round's state and were admitted.
  struct pin_state {
    std::optional<uint64_t> round;  // once all have answered
    clock::time_point sent;         // when the query or the round was last sent (re-sent every 2 s)
  };
  /// A membership change in progress: every training member must answer the fence of `epoch`.
  struct fence_state {
    uint64_t epoch = 0;
    clock::time_point started;
    std::string reason;
  };

  // master_state.cpp: start, takeover, watching the members, the end.
  void tick_before_start();
  void tick_training();
  void call_off_at_join_deadline();
  void welcome_all();
  void take_over();
  void watch();
  void watch_silence(size_t i);
  void watch_fence();
  void watch_stop();
  void decide_stop(const std::vector<size_t>& members);
  void outcome();
  void call_off(const std::string& why, int code);
  void step_down(const sender& from, uint64_t newer);
  void stop_before_start();
  bool nobody_since_takeover() const;  ///< took over, and no node has said hello since

  // master_state_fence.cpp: removals, fences, admitting joiners, holding the members for them, the quorum.
  void remove(size_t i, removal why, const std::string& text);
  void tell_removed(member& m, const std::string& why);
  /// What a removed node that speaks again is told: why it was removed.
  std::string removed_text(size_t i) const;
  void start_fence(const std::string& reason, const std::string& why);
  void conclude_fence();
  std::optional<comm::reduce_key> committed_floor(const std::vector<size_t>& members) const;
  bool ready_joiner_holds(uint64_t round) const;
  bool below_quorum(const std::vector<size_t>& members);
  bool ring_keeps_failing(const comm::reduce_key& commit);
  void send_membership(const std::vector<size_t>& members, const comm::reduce_key& commit);
  void admit_joiners(const comm::reduce_key& commit);
  void turn_back(size_t i, const comm::reduce_key& commit);
  void pin_for(size_t i);
  void admit(size_t i, const comm::reduce_key& commit);
  void cancel_join(size_t i);
  void send_recover(size_t i, const std::string& note, std::optional<uint64_t> want = std::nullopt);
  void watch_fetches();
  std::optional<uint64_t> lowest_round() const;  // of the training members (nullopt: none)
  void watch_pin();
  void release_pin();
  std::string quorum_text() const;

  // master_state_hello.cpp: hellos, joins and re-announcements.
  void on_hello(const sender& from, const hello_msg& h);
  std::optional<size_t> member_for_hello(const sender& from, const hello_msg& h);
  std::optional<std::pair<std::string, std::string>> data_mismatch(size_t idx, const hello_msg& h);
  std::optional<std::pair<std::string, std::string>> hello_mismatch(size_t idx, const hello_msg& h) const;
  void on_first_hello(size_t idx, const sender& from, const hello_msg& h);
  std::optional<size_t> add_open_node(const sender& from, const hello_msg& h);
  void on_join(size_t idx, const sender& from, const hello_msg& h);
  void start_fetch(size_t idx);
  bool second_process_waits(size_t idx, const sender& from);
  void on_join_ready(size_t idx, const join_ready_msg& r);
  void on_reannounce(size_t idx, const sender& from, const hello_msg& h);

  // master_state_messages.cpp: everything else a connection may send.
  void on_member_message(size_t i, const envelope& e);
  void on_joiner_message(size_t i, const envelope& e);
  /// A member's "still starting" beat: it is alive, but its main loop does not run yet.
  void on_starting(size_t i);
  void on_removed_message(size_t i, const envelope& e);
  /// A frame after the end: a told node's answer, or the call-off once more (await_last_words).
  void after_end(const sender& from, const envelope& e);
  void on_bye(size_t i, const bye_msg& b);
  void on_committed(size_t i, const committed_msg& c);
  void on_nccl_id(size_t i, const nccl_id_msg& n);
  void on_ring_failed(size_t i, const ring_failed_msg& rf);
  // master_state_requests.cpp: longwave stop and node --leave.
  void on_stop_request(const sender& from);
  /// A stop begins (stop_ set): joiners are turned away and every training member will be asked where it
  /// can stop. Returns those members.
  std::vector<size_t> begin_stop(const std::string& why);
  /// Member i answers a stop this coordinator did not begin: one before it did (it took the cluster over
  /// mid-stop, or a standby did), so the stop goes on from here.
  void carry_on_stop(size_t i);
  void on_standby(const sender& from, const standby_msg& sb);
  void on_leave(const sender& from, const leave_msg& l);
  void add_stop_waiter(const std::string& identity);
  void answer_stop_waiters(const std::string& outcome, const std::string& summary);
  void compare_theta(size_t i, const committed_msg& c);
  void from_stranger(const sender& from, const envelope& e);
  void dropped(const std::string& text);

  // master_state_merge.cpp: asynchronous merges (diloco.outer = "async").
  void on_contribute(size_t i, const contribute_msg& c);
  void watch_merges();
  void merge_members_changed();
  void resume_merges(const std::vector<size_t>& present);  // a takeover
  void note_drop(const drop& d);
  bool joiners_hold_merges();
  bool all_applied(uint64_t version) const;  // every training member applied it
  void hold_merges_for(size_t i);
  void resend_merges(size_t i);  // the announced merges member i has not applied (its link dropped)

  // Helpers.
  // Out of line (master_state.cpp): GCC 12 inlines a push of the action variant into callers and warns
  // falsely (-Wrestrict, GCC bug 105651).
  void info(std::string s);
  void warn(std::string s);
  void count_error(std::string reason);
  void note(std::string kind, std::vector<std::pair<std::string, record::value>> fields);
  void note_end(const std::string& outcome, std::vector<std::pair<std::string, record::value>> fields = {},
                std::string summary = {});
  void send_to(size_t i, decltype(envelope::body) body);
  void reply(const std::string& identity, decltype(envelope::body) body);
  void reply_error(const std::string& identity, errc code, const std::string& message);
  void turn_away(const std::string& identity, errc code, const std::string& message);
  void send_welcome(const std::vector<size_t>& members, size_t rank);
  bool training(size_t i) const { return members_[i].phase == member_phase::member; }
  bool any_training() const;
  bool any_ready() const;
  bool all_joined() const;
  bool all_announced() const;
  std::vector<size_t> training_members() const;
  std::string names_of(const std::vector<size_t>& idx) const;
  std::string list_of(const std::vector<size_t>& idx) const;  // "n0,n1", as records name members
  std::string ring_text(const std::vector<size_t>& members) const;
  /// The round the nodes welcomed at the start resume after (resume_plan's, once they are welcomed).
  uint64_t start_round() const { return start_round_; }
  struct resume_plan {
    uint64_t round = 0;
    uint32_t theta = 0;  // theta's CRC in the checkpoints of `round` the nodes resume from (0: not known)
    std::vector<size_t> fetch;  // joined nodes without a checkpoint of `round`: they fetch it as joiners
    std::vector<size_t> other_history;  // of those, the ones whose checkpoint of `round` holds another theta
    std::vector<size_t> ahead;          // joined nodes holding rounds after `round`: those are dropped
    bool tied = false;                  // two histories of `round` had as many holders
    bool by_stop = false;  // `round` is the one the cluster stopped after (master_settings::stopped)
  };
  resume_plan plan_resume() const;
  void say_plan(const resume_plan& plan, const std::vector<size_t>& members);
  std::optional<size_t> index_of_identity(const std::string& id) const;
  std::optional<size_t> index_of_name(const std::string& name) const;
  std::string key_of(const std::string& name) const;
  peer_entry peer_of(size_t rank, size_t i) const;
  std::vector<peer_entry> all_keys() const;
  void remember_announced(const std::vector<peer_entry>& keys);
  ms since(clock::time_point t) const { return std::chrono::duration_cast<ms>(now_ - t); }

  master_settings s_;
  clock::time_point start_, now_;
  std::vector<member_spec> specs_;  // the listed nodes in file order, then nodes not in the file
  std::vector<member> members_;     // one per spec
  uint64_t listed_workers_ = 0;
  std::vector<action> actions_;
  std::optional<int> exit_code_;
  std::pair<errc, std::string> end_notice_;  // what call_off told the nodes
  /// `longwave stop --wait`s told how the run ended, while last words are awaited: one that asks again
  /// (stop(0) every 2 s) did not get it and is told again; one silent for twice that long did.
  struct told_waiter {
    std::string identity;
    clock::time_point last_seen, told_at;
  };
  std::vector<told_waiter> told_waiters_;
  std::pair<bool, std::string> waiters_end_;  // what they were told: a bye (true) or an error, and its text
  void tell_waiter(const std::string& identity);
  uint64_t n_dropped_ = 0;
  std::map<std::string, std::string> standbys_;     // standby coordinators: address -> routing id
  std::set<std::string> strangers_;                 // routing ids of running nodes of an earlier master
  std::set<std::string> running_elsewhere_;         // their names
  std::map<std::string, std::string> turned_away_;  // a node whose hello was refused: why (its last)
  bool welcomed_ = false;                           // training began
  uint64_t start_round_ = 0;                        // the welcomed nodes resume after it (plan_resume)
  uint64_t term_ = 0;                               // this master's (see term())
  uint64_t newest_term_ = 0;                        // the newest a running node named before this master led
  uint64_t epoch_ = 1;                              // the current membership's epoch
  std::optional<fence_state> fence_;                // a membership change in progress
  std::optional<stop_state> stop_;                  // longwave stop in progress
  std::optional<pin_state> pin_;                    // members held at a boundary for overtaken joiners
  std::map<uint64_t, std::pair<uint32_t, size_t>> theta_crcs_;  // round -> first CRC reported, by whom
  std::set<uint64_t> mismatched_rounds_;                        // rounds already named as mismatched
  std::set<std::string> keys_announced_;  // node public keys sent in a welcome or membership
  std::optional<std::pair<uint64_t, std::string>> data_fingerprint_;  // the first hello's, and whose
  bool reset_wanted_ = false;  // a ring failed: fence once its suspects are settled
  std::optional<clock::time_point> quorum_deadline_;
  std::optional<clock::time_point> takeover_since_;  // the first re-announcement of a running node
  int resets_without_progress_ = 0;
  std::optional<comm::reduce_key> last_reset_commit_;
  std::string last_ring_failure_;
  struct failed_link {
    size_t from = 0;     // the member that reported it
    std::string to;      // the node it lost
    uint64_t epoch = 0;  // the epoch whose ring failed
    uint64_t round = 0;  // the last round the reporter had completed
  };
  std::optional<failed_link> last_failed_link_;  // the last ring failure that named a node
  std::optional<merge_window> merges_;           // s_.async: the merge rule, its version and pending work
  std::deque<merge_msg> announced_;  // the newest merges announced, for a member whose link dropped
};

}  // namespace longwave::cluster
