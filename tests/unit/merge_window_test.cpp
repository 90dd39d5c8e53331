// The asynchronous merge rule (cluster/merge_window.hpp) as scripted event tables in virtual time: each row
// is a moment and an event, and what the window must answer. No sockets, no clock.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <cmath>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cluster/merge_window.hpp"

#if defined(ZMQ_VERSION_MAJOR) || defined(CAF_VERSION) || defined(CAPNP_VERSION_MAJOR) || \
    defined(TORCH_VERSION)
#error "cluster/merge_window.hpp must not include ZeroMQ, CAF, Cap'n Proto or libtorch"
#endif

using namespace longwave::cluster;

namespace {

/// One row: at `t` seconds, `what` happens; then the window is polled at `t`. `expect` lists texts the
/// answers must contain, each in one answer ("!text": in none of them).
/// what: members N,N,... | arrive NODE v=V tokens=T | applied V | tick
/// Answers read: "merge 3 [n0@2x100 n1@2x100]" (node@v_start x tokens, "*2" for two folded reports),
/// "drop n1 stale 4", "state grace closes 30.50 version 2".
struct row {
  double t;
  std::string what;
  std::vector<std::string> expect;
};

std::string describe(const merge& m) {
  std::string out = fmt::format("merge {} [", m.version);
  for (size_t i = 0; i < m.merged.size(); ++i) {
    const auto& c = m.merged[i];
    out += fmt::format("{}{}@{}x{}{}", i ? " " : "", c.node, c.v_start, c.tokens,
                       c.parts > 1 ? fmt::format("*{}", c.parts) : "");
  }
  return out + fmt::format("] opened {:.2f} closed {:.2f} due {:.2f}", m.opened_s, m.closed_s, m.due_s);
}

std::string describe(const drop& d) {
  return fmt::format("drop {} {} {}", d.c.node, to_string(d.reason), d.staleness);
}

std::vector<std::string> apply(merge_window& w, const row& r) {
  std::vector<std::string> out;
  std::istringstream in(r.what);
  std::string verb;
  in >> verb;
  if (verb == "members") {
    std::string list;
    in >> list;
    std::set<std::string> members;
    for (size_t at = 0; at <= list.size();) {
      const auto comma = std::min(list.find(',', at), list.size());
      members.insert(list.substr(at, comma - at));
      at = comma + 1;
    }
    for (const auto& d : w.set_members(members, r.t)) out.push_back(describe(d));
  } else if (verb == "arrive") {
    contribution c;
    std::string v, tokens;
    in >> c.node >> v >> tokens;
    c.v_start = std::stoll(v.substr(2));
    c.tokens = std::stoll(tokens.substr(7));
    if (auto d = w.arrive(c, r.t)) out.push_back(describe(*d));
  } else if (verb == "applied") {
    int64_t v = 0;
    in >> v;
    w.applied(v);
  } else {
    CATCH_REQUIRE(verb == "tick");
  }
  if (auto m = w.poll(r.t)) out.push_back(describe(*m));
  const double closes = w.closes_at();
  out.push_back(fmt::format("state {} closes {} version {} pending {}", to_string(w.phase()),
                            std::isinf(closes) ? std::string("never") : fmt::format("{:.2f}", closes),
                            w.version(), w.pending().size()));
  return out;
}

void play(merge_window& w, const std::vector<row>& table) {
  for (const auto& r : table) {
    const auto out = apply(w, r);
    std::string all;
    for (const auto& o : out) all += "\n  " + o;
    CATCH_INFO("t=" << r.t << " " << r.what << " answered:" << all);
    for (const auto& e : r.expect) {
      const bool negate = !e.empty() && e[0] == '!';
      const auto text = negate ? e.substr(1) : e;
      bool found = false;
      for (const auto& o : out) found = found || o.find(text) != std::string::npos;
      CATCH_INFO("expected " << (negate ? "no " : "") << "'" << text << "'");
      CATCH_CHECK(found != negate);
    }
  }
}

}  // namespace

CATCH_TEST_CASE("a merge opens at the quorum and waits for a node due soon, never for one late or far off",
                "[merge_window]") {
  merge_window w({.quorum = 2, .grace_min_s = 0.5, .grace_max_s = 5, .max_staleness = 3, .max_in_flight = 0});
  play(w, {
              {0, "members n0,n1,n2", {"state gathering closes never version 0 pending 0"}},
              {10, "arrive n0 v=0 tokens=100", {"state gathering"}},
              // The quorum is in; no cadence is known yet, so the window is grace_min.
              {10, "arrive n1 v=0 tokens=100", {"state grace closes 10.50"}},
              {10, "arrive n2 v=0 tokens=50", {"pending 3", "!merge"}},
              {10.5,
               "tick",
               {"merge 1 [n0@0x100 n1@0x100 n2@0x50] opened 10.00 closed 10.50", "state gathering"}},
              {20, "arrive n0 v=1 tokens=100", {"state gathering"}},
              {20, "arrive n1 v=1 tokens=100", {"state grace closes 20.50"}},  // n2: one arrival, no cadence
              {20.5, "tick", {"merge 2 [n0@1x100 n1@1x100]"}},
              {23,
               "arrive n2 v=1 tokens=50",
               {"state gathering closes never version 2 pending 1"}},  // n2's period: 13 s
              // n1 is due at 30 (every 10 s): the window waits for it, a tenth of its period more.
              {30, "arrive n0 v=2 tokens=100", {"state grace closes 31.00"}},
              // It comes: the window closes at grace_min.
              {30.2, "arrive n1 v=2 tokens=100", {"state grace closes 30.50", "!merge"}},
              {30.5, "tick", {"merge 3 [n0@2x100 n1@2x100 n2@1x50]"}},
              // n2 is overdue (due at 36): a late node is not waited for.
              {40, "arrive n0 v=3 tokens=100", {"state gathering"}},
              {40, "arrive n1 v=3 tokens=100", {"state grace closes 40.50"}},
              {40.5, "tick", {"merge 4 [n0@3x100 n1@3x100] opened 40.00 closed 40.50"}},
          });
}

CATCH_TEST_CASE(
    "a node due within grace_max that never comes costs at most its due time, a node due later nothing",
    "[merge_window]") {
  merge_window w({.quorum = 1, .grace_min_s = 0, .grace_max_s = 5, .max_staleness = 8, .max_in_flight = 0});
  play(w, {
              {0, "members n0,n1", {}},
              // Cadences: n0 every 10 s, n1 every 12 s. quorum 1 and grace_min 0: each arrival merges alone.
              {10, "arrive n0 v=0 tokens=1", {"merge 1 [n0@0x1]"}},
              {12, "arrive n1 v=0 tokens=1", {"merge 2 [n1@0x1]"}},
              {20, "arrive n0 v=1 tokens=1", {"merge 3 [n0@1x1]"}},
              {24, "arrive n1 v=2 tokens=1", {"merge 4 [n1@2x1]"}},  // n0 is due at 30, beyond grace_max
              // n1 is due at 36, 6 s away: beyond grace_max, not waited for.
              {30, "arrive n0 v=3 tokens=1", {"merge 5 [n0@3x1] opened 30.00 closed 30.00"}},
              // Now n1 is due in 1 s: waited for a tenth of its period more, and it never comes (SIGKILLed).
              {35, "arrive n0 v=5 tokens=1", {"state grace closes 37.20", "!merge"}},
              {37, "tick", {"!merge"}},
              {37.25, "tick", {"merge 6 [n0@5x1] opened 35.00 closed 37.25"}},
          });
}

CATCH_TEST_CASE("the window never waits past grace_max, whatever a cadence says", "[merge_window]") {
  merge_window w({.quorum = 1, .grace_min_s = 0, .grace_max_s = 2, .max_staleness = 8, .max_in_flight = 0});
  play(w, {
              {0, "members n0,n1", {}},
              {0, "arrive n1 v=0 tokens=1", {"merge 1"}},
              {100, "arrive n1 v=1 tokens=1", {"merge 2"}},  // n1: every 100 s
              // n1 is due at 200; at 198.5 it is 1.5 s away, plus a tenth of its period: capped at 2 s.
              {198.5, "arrive n0 v=2 tokens=1", {"state grace closes 200.50"}},
              {200.5, "tick", {"merge 3 [n0@2x1] opened 198.50 closed 200.50"}},
          });
}

CATCH_TEST_CASE("a contribution staler than the cap, from a stranger or from the future is dropped and named",
                "[merge_window]") {
  merge_window w({.quorum = 1, .grace_min_s = 0, .grace_max_s = 5, .max_staleness = 2, .max_in_flight = 0},
                 /*version=*/5);
  play(w, {
              {0, "members n0,n1", {"version 5"}},
              {1, "arrive n0 v=2 tokens=10", {"drop n0 stale 3", "!merge", "pending 0"}},
              {2, "arrive n0 v=3 tokens=10", {"merge 6 [n0@3x10]"}},  // staleness 2: at the cap, kept
              {3, "arrive n7 v=6 tokens=10", {"drop n7 not_member 0", "pending 0"}},
              {4, "arrive n1 v=9 tokens=10", {"drop n1 future_version -3", "pending 0"}},
          });
}

CATCH_TEST_CASE("reports of one node fold before a merge, and the quorum counts nodes", "[merge_window]") {
  merge_window w({.quorum = 2, .grace_min_s = 0, .grace_max_s = 5, .max_staleness = 4, .max_in_flight = 0});
  play(w, {
              {0, "members n0,n1,n2", {}},
              {1, "arrive n0 v=0 tokens=100", {"state gathering"}},
              {2, "arrive n0 v=0 tokens=60", {"state gathering closes never version 0 pending 1"}},
              // The pending report again (re-sent on a welcome after its link dropped): no second phase.
              {2.5, "arrive n0 v=0 tokens=160", {"state gathering closes never version 0 pending 1"}},
              {3, "arrive n2 v=0 tokens=10", {"merge 1 [n0@0x160*2 n2@0x10]"}},
          });
}

CATCH_TEST_CASE("a node leaving drops its pending contribution, and a smaller membership lowers the quorum",
                "[merge_window]") {
  merge_window w({.quorum = 3, .grace_min_s = 0, .grace_max_s = 5, .max_staleness = 4, .max_in_flight = 0});
  play(w, {
              {0, "members n0,n1,n2", {}},
              {1, "arrive n0 v=0 tokens=1", {"state gathering"}},
              {2, "arrive n1 v=0 tokens=1", {"state gathering closes never version 0 pending 2"}},
              // n1 is removed: its contribution goes with it; two members left, quorum 2, one pending.
              {3, "members n0,n2", {"drop n1 left 0", "state gathering closes never version 0 pending 1"}},
              {4, "arrive n2 v=0 tokens=1", {"merge 1 [n0@0x1 n2@0x1]"}},
              {5, "arrive n0 v=1 tokens=1", {"state gathering closes never version 1 pending 1"}},
              // Only n0 is left: the quorum is 1 and its pending contribution merges at once.
              {6, "members n0", {"merge 2 [n0@1x1]"}},
          });
}

CATCH_TEST_CASE("losing the quorum's nodes during a grace window closes nothing", "[merge_window]") {
  merge_window w({.quorum = 2, .grace_min_s = 1, .grace_max_s = 5, .max_staleness = 4, .max_in_flight = 0});
  play(w,
       {
           {0, "members n0,n1,n2,n3", {}},
           {1, "arrive n0 v=0 tokens=1", {}},
           {1, "arrive n1 v=0 tokens=1", {"state grace closes 2.00"}},
           {1.5, "members n0,n2,n3", {"drop n1 left 0", "state gathering closes never version 0 pending 1"}},
           {2, "tick", {"!merge"}},
           {3, "arrive n2 v=0 tokens=1", {"state grace closes 4.00"}},
           {4, "tick", {"merge 1 [n0@0x1 n2@0x1] opened 3.00 closed 4.00"}},
       });
}

CATCH_TEST_CASE("a merge waits while the one before it is not applied, and what arrives meanwhile joins it",
                "[merge_window]") {
  merge_window w({.quorum = 1, .grace_min_s = 0, .grace_max_s = 5, .max_staleness = 8, .max_in_flight = 1});
  play(w, {
              {0, "members n0,n1,n2", {}},
              {1, "arrive n0 v=0 tokens=1", {"merge 1 [n0@0x1]"}},
              // Version 1's all-reduce runs: n1's contribution waits, the window held (no close time).
              {2, "arrive n1 v=0 tokens=1", {"!merge", "state grace closes never version 1 pending 1"}},
              {3, "arrive n2 v=0 tokens=1", {"!merge", "pending 2"}},
              {4, "tick", {"!merge"}},
              // A member applied version 1: both merge as one, not two rings.
              // Its grace window was over at once (due 2.00); the hold is not part of it.
              {4.5, "applied 1", {"merge 2 [n1@0x1 n2@0x1] opened 2.00 closed 4.50 due 2.00"}},
              // Reports of an earlier version (a member late to say it) release nothing.
              {5, "arrive n0 v=1 tokens=1", {"state grace closes never version 2 pending 1"}},
              {6, "applied 1", {"!merge"}},
              {7, "applied 2", {"merge 3 [n0@1x1]"}},
              // An applied version beyond the announced ones is not believed past the newest announced.
              {8, "applied 9", {"state gathering closes never version 3"}},
              // n0 is due at 9 (every 4 s): waited for, a tenth of its period more.
              {9, "arrive n1 v=2 tokens=1", {"state grace closes 9.40 version 3"}},
              {9.4, "tick", {"merge 4 [n1@2x1]"}},
              {10, "arrive n2 v=2 tokens=1", {"!merge", "state grace closes never version 4 pending 1"}},
          });
}

CATCH_TEST_CASE(
    "a merge is due when the last node it waits for comes, and a hold after that is not its grace",
    "[merge_window]") {
  merge_window w({.quorum = 1, .grace_min_s = 0, .grace_max_s = 5, .max_staleness = 8, .max_in_flight = 1});
  play(w, {
              {0, "members n0,n1", {}},
              {0, "arrive n1 v=0 tokens=1", {"merge 1 [n1@0x1]"}},
              {0.1, "applied 1", {}},
              {1, "arrive n1 v=1 tokens=1", {"merge 2 [n1@1x1] opened 1.00 closed 1.00 due 1.00"}},
              // n1 is due at 2 (every 1 s): the window waits for it a tenth of a second more.
              {2, "arrive n0 v=2 tokens=1", {"!merge", "state grace closes never version 2 pending 1"}},
              {2.05, "arrive n1 v=2 tokens=1", {"!merge", "pending 2"}},
              // Version 2's all-reduce held it: due at n1's arrival, closed when version 2 was applied.
              {3, "applied 2", {"merge 3 [n0@2x1 n1@2x1] opened 2.00 closed 3.00 due 2.05"}},
          });
}

CATCH_TEST_CASE("no merge past the run's last version, which no node would apply", "[merge_window]") {
  merge_window w({.quorum = 1,
                  .grace_min_s = 0,
                  .grace_max_s = 5,
                  .max_staleness = 8,
                  .max_in_flight = 0,
                  .last_version = 2});
  play(w, {
              {0, "members n0,n1", {}},
              {1, "arrive n0 v=0 tokens=1", {"merge 1 [n0@0x1]"}},
              {2, "arrive n1 v=0 tokens=1", {"merge 2 [n1@0x1]"}},
              // A phase reported before its node learned that version 2 ends the run is answered: past the
              // end (a node behind learns so that it missed the merges).
              {3, "arrive n0 v=1 tokens=1", {"!merge", "drop n0 past_end 1", "pending 0"}},
              {60, "tick", {"!merge", "version 2"}},
          });
}
