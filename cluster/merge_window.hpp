#pragma once
// When an asynchronous outer step merges (diloco.outer = "async", issue 39): the master's rule, as Decoupled
// DiLoCo's syncer has it. Nodes report contributions as they finish their inner steps; a merge closes once
// a minimum quorum has arrived and a grace window has passed, the window sized by the arrival times seen so
// that a node due soon is waited for and one far off is not. A contribution older than the staleness cap is
// dropped when it arrives. Pure: no sockets, no clock of its own (every event carries `now`), so the tests
// drive it through event tables in virtual time (tests/unit/merge_window_test.cpp).
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace longwave::cluster {

/// The merge rule's settings ([async] in the config).
struct merge_rules {
  int64_t quorum = 1;         ///< contributions that open a merge's grace window (at most the live nodes)
  double grace_min_s = 0;     ///< the window's least length once the quorum is in
  double grace_max_s = 5;     ///< its longest: a node not due within it is not waited for
  int64_t max_staleness = 4;  ///< a contribution started more than this many versions ago is dropped
  /// Merges announced and not yet applied by any member before the next may close (0: no limit). A merge's
  /// all-reduce takes the members' links; what arrives meanwhile joins the next merge instead of queueing
  /// behind it as rings of its own.
  int64_t max_in_flight = 1;
  /// The run's last version (train.rounds, which every node's fingerprint shares): no merge past it, which no
  /// node would apply (0: no limit). async.tokens may end the run earlier; only the nodes know the tokens
  /// their all-reduces lost.
  int64_t last_version = 0;
};

/// A node's pseudo-gradient, ready to merge: it trained `tokens` tokens from version `v_start`.
struct contribution {
  std::string node;
  int64_t v_start = 0;
  int64_t tokens = 0;
  int64_t parts = 1;  ///< reports folded into this one (a node that reported again before a merge took it)
};

/// A closed merge: version `version` is the previous one plus these contributions.
struct merge {
  int64_t version = 0;
  std::vector<contribution> merged;  ///< in node-name order, the order every node applies them in
  double opened_s = 0;               ///< when its quorum was in
  /// When the rule let it close: opened_s + its grace window, at most grace_max_s.
  double due_s = 0;
  /// When it closed: later than due_s while a merge in flight, a fence or a joiner held it.
  double closed_s = 0;
};

/// Why a contribution was not merged.
enum class drop_reason : uint8_t {
  stale,           ///< started more than max_staleness versions before the current one
  left,            ///< its node left the membership before a merge took it
  not_member,      ///< from a node outside the membership
  future_version,  ///< names a start version not yet made (a confused or hostile peer)
  past_end,        ///< the run's last version is made: no merge follows (merge_rules::last_version)
};
const char* to_string(drop_reason r);

/// A contribution refused.
struct drop {
  contribution c;
  drop_reason reason = drop_reason::stale;
  int64_t staleness = 0;  ///< versions between its start and the current one
};

/// Where the window stands. Each value says when it is entered and what may follow.
enum class window_phase : uint8_t {
  /// Fewer contributions than the quorum are pending (none at the start, and after each merge). -> grace.
  gathering,
  /// The quorum is in; the merge closes at `closes_at()`, or at once when every node it waits for has come,
  /// and never while max_in_flight merges are not yet applied. -> gathering (the merge closed).
  grace,
};
const char* to_string(window_phase p);

class merge_window {
 public:
  explicit merge_window(merge_rules rules, int64_t version = 0) : merge_window(rules, version, version) {}
  /// Versions after `applied` up to `version` are announced and not yet applied by any member (a master that
  /// took over a cluster in the middle of its merges).
  merge_window(merge_rules rules, int64_t version, int64_t applied);

  /// The nodes that may contribute (the epoch's membership). A node's pending contribution is dropped when
  /// it leaves (its bytes left with it); the quorum counts at most the members.
  std::vector<drop> set_members(const std::set<std::string>& members, double now_s);
  /// A node's contribution has arrived. Returns a drop when it is staler than the cap or comes after the last
  /// version; the pending one again (v_start and tokens equal) is a repeat and changes nothing; another
  /// report of a node before a merge takes the first folds into it (tokens add, the older start stays).
  std::optional<drop> arrive(const contribution& c, double now_s);
  /// Closes the merge when its time has come (call at `closes_at()`, or after any event).
  std::optional<merge> poll(double now_s);
  /// A member applied `version` (its all-reduce is over): the merges after it may close.
  void applied(int64_t version);

  window_phase phase() const { return phase_; }
  int64_t version() const { return version_; }
  /// When poll() must next be called: the grace window's end, or infinity while gathering, held or past the
  /// last version.
  double closes_at() const;
  const std::map<std::string, contribution>& pending() const { return pending_; }

 private:
  /// What the window knows of a node's arrivals: the last one and the mean interval between them.
  struct cadence {
    double last_s = -1;
    double period_s = 0;  ///< 0: fewer than two arrivals seen
  };
  int64_t effective_quorum() const;
  /// Seconds from now_s until `node` is due by its mean interval (negative: late); nullopt when it has a
  /// contribution pending or no interval is known yet.
  std::optional<double> due_in(const std::string& node, double now_s) const;
  /// The quorum is in: the grace window waits for each node due within grace_max_s, a tenth of its interval
  /// more, and lasts grace_min_s..grace_max_s.
  void open(double now_s);
  bool waited_all_in() const;
  /// max_in_flight merges are announced and not yet applied, or the last version is made.
  bool held() const;
  /// Called after the pending set or the membership changed: notes when the last waited node came in.
  void note_all_in(double now_s);
  /// When the open window's rule lets it close, merges in flight aside.
  double due_at() const;

  merge_rules rules_;
  int64_t version_;
  int64_t applied_;  ///< the newest version a member applied
  window_phase phase_ = window_phase::gathering;
  std::set<std::string> members_;
  std::map<std::string, contribution> pending_;
  std::map<std::string, cadence> cadence_;
  std::set<std::string> waited_;  ///< the nodes the open window waits for
  double opened_s_ = 0, closes_s_ = std::numeric_limits<double>::infinity();
  double all_in_s_ = std::numeric_limits<double>::infinity();  ///< when every waited node was in
};

}  // namespace longwave::cluster
