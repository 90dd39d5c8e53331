// The round engine's pure parts: the coordinator's transition table, Streaming DiLoCo's schedule, and the
// arithmetic of adaptive steps (dynamic local updates).
#include <catch2/catch.hpp>

#include <set>
#include <utility>

#include "actors/round/adaptive_steps.hpp"
#include "actors/round/phase.hpp"
#include "actors/round/streaming_schedule.hpp"
#include "config/train_config.hpp"
#include "models/lr_schedule.hpp"

using namespace longwave::actors;

namespace {

const std::vector<phase> all_phases = {phase::idle,       phase::resuming,   phase::inner,  phase::reducing,
                                       phase::outer_step, phase::evaluating, phase::saving, phase::stopping,
                                       phase::done,       phase::failed};

}  // namespace

CATCH_TEST_CASE("the coordinator allows exactly the documented moves and nothing leaves done or failed",
                "[unit][round]") {
  using p = phase;
  // The moves of phase.hpp, written out once more by hand.
  std::set<std::pair<p, p>> legal = {
      {p::idle, p::resuming},       {p::idle, p::inner},
      {p::resuming, p::inner},      {p::inner, p::reducing},
      {p::inner, p::outer_step},    {p::inner, p::evaluating},
      {p::reducing, p::outer_step}, {p::outer_step, p::evaluating},
      {p::outer_step, p::saving},   {p::outer_step, p::inner},
      {p::outer_step, p::done},     {p::evaluating, p::saving},
      {p::evaluating, p::inner},    {p::evaluating, p::done},
      {p::saving, p::inner},        {p::saving, p::evaluating},
      {p::saving, p::done},         {p::stopping, p::done},
  };
  for (p from : all_phases) {
    if (is_terminal(from)) continue;
    legal.insert({from, p::failed});
    if (from != p::stopping) legal.insert({from, p::stopping});
  }
  int allowed = 0;
  for (p from : all_phases)
    for (p to : all_phases) {
      CATCH_INFO(to_string(from) << " -> " << to_string(to));
      CATCH_CHECK(allowed_transition(from, to) == (legal.count({from, to}) == 1));
      allowed += allowed_transition(from, to) ? 1 : 0;
    }
  CATCH_CHECK(allowed == 18 + 8 + 7);  // the table, failed from 8 live phases, stopping from 7
  CATCH_CHECK(std::string(to_string(phase::outer_step)) == "outer_step");
}

CATCH_TEST_CASE("streaming stops at j*H/P - tau for a fragment's snapshot and at j*H/P for its sync",
                "[unit][round]") {
  // H = 6, P = 2, tau = 1: fragment 1 snapshot at 2, sync at 3; fragment 0 snapshot at 5, sync at 6.
  const streaming_shape s{6, 2, 1};
  struct stop {
    int64_t at;
    uint32_t j, fragment;
    bool snapshot, sync;
  };
  const std::vector<stop> want = {
      {2, 1, 1, true, false}, {3, 1, 1, false, true}, {5, 2, 0, true, false}, {6, 2, 0, false, true}};
  int64_t pos = 0, total = 0;
  for (const auto& w : want) {
    const auto e = next_streaming_event(s, pos);
    CATCH_INFO("from " << pos);
    CATCH_CHECK(e.at == w.at);
    CATCH_CHECK(e.steps == w.at - pos);
    CATCH_CHECK(e.j == w.j);
    CATCH_CHECK(e.fragment == w.fragment);
    CATCH_CHECK(e.snapshot == w.snapshot);
    CATCH_CHECK(e.sync == w.sync);
    CATCH_CHECK(e.round_end == (w.at == 6));
    total += e.steps;
    pos = e.next_pos();
  }
  CATCH_CHECK(total == 6);
  CATCH_CHECK(pos == 0);  // the round is over: the next one starts at 0
}

CATCH_TEST_CASE("with tau 0 each stop both snapshots and syncs its fragment, and P = 1 is sync DiLoCo",
                "[unit][round]") {
  const streaming_shape four{8, 4, 0};
  int64_t pos = 0;
  for (uint32_t j = 1; j <= 4; ++j) {
    const auto e = next_streaming_event(four, pos);
    CATCH_CHECK(e.at == 2 * j);
    CATCH_CHECK(e.j == j);
    CATCH_CHECK(e.fragment == j % 4);
    CATCH_CHECK(e.snapshot);
    CATCH_CHECK(e.sync);
    pos = e.next_pos();
  }
  CATCH_CHECK(pos == 0);
  const auto one = next_streaming_event({5, 1, 0}, 0);  // one stop at H: the whole model, like sync
  CATCH_CHECK(one.at == 5);
  CATCH_CHECK(one.fragment == 0);
  CATCH_CHECK(one.snapshot);
  CATCH_CHECK(one.sync);
  CATCH_CHECK(one.round_end);
}

CATCH_TEST_CASE(
    "a streaming round can be resumed only at multiples of H/P within it, and the run ends with P-1 syncs",
    "[unit][round]") {
  const streaming_shape s{6, 2, 1};
  CATCH_CHECK(streaming_resumable_at(s, 0));
  CATCH_CHECK(streaming_resumable_at(s, 3));
  CATCH_CHECK_FALSE(streaming_resumable_at(s, 2));
  CATCH_CHECK_FALSE(streaming_resumable_at(s, 5));
  // Another policy's snapshot after the round's last step (its average not yet applied): no such point here.
  CATCH_CHECK_FALSE(streaming_resumable_at(s, 6));
  CATCH_CHECK_FALSE(streaming_resumable_at(s, 12));
  CATCH_CHECK_FALSE(streaming_resumable_at(s, -3));
  CATCH_CHECK(streaming_final_fragments({12, 3, 1}) == std::vector<uint32_t>{1, 2});
  CATCH_CHECK(streaming_final_fragments({12, 1, 0}).empty());
}

CATCH_TEST_CASE("adaptive steps fit a node's round in the fastest node's H-step time, within its floor and H",
                "[unit][round][adaptive]") {
  // H = 40, floor 5 (H / 8). Hand values: H * fastest / own, rounded to the nearest step.
  CATCH_CHECK(adaptive_steps(40, 5, 0.4, 0.1) == 10);    // a quarter of the speed: 40 * 0.1 / 0.4
  CATCH_CHECK(adaptive_steps(40, 5, 0.2, 0.1) == 20);    // half
  CATCH_CHECK(adaptive_steps(40, 5, 0.3, 0.1) == 13);    // 13.33 -> 13
  CATCH_CHECK(adaptive_steps(40, 5, 0.16, 0.1) == 25);   // 25
  CATCH_CHECK(adaptive_steps(40, 5, 1.0, 0.1) == 5);     // 4 is below the floor
  CATCH_CHECK(adaptive_steps(40, 5, 0.1, 0.1) == 40);    // the fastest itself
  CATCH_CHECK(adaptive_steps(40, 5, 0.104, 0.1) == 40);  // within 5 %: noise, not a slower node
  CATCH_CHECK(adaptive_steps(40, 5, 0.107, 0.1) == 37);  // 37.38 -> 37
  CATCH_CHECK(adaptive_steps(40, 5, 0.0, 0.1) == 40);    // not measured yet
  CATCH_CHECK(adaptive_steps(40, 5, 0.4, 0.0) == 40);
  CATCH_CHECK(adaptive_steps(4, 8, 1.0, 0.1) == 4);  // a floor above H is H

  // The floor: diloco.min_steps, or H / 8 (at least 1).
  longwave::config::diloco_section d;
  CATCH_CHECK(d.step_floor(40) == 5);
  CATCH_CHECK(d.step_floor(7) == 1);
  d.min_steps = 12;
  CATCH_CHECK(d.step_floor(40) == 12);
  CATCH_CHECK(d.step_floor(10) == 10);

  // The fastest known step: the smallest non-zero among every node's note and this node's own.
  using longwave::comm::rank_note;
  CATCH_CHECK(fastest_step({{2, 0.4f}, {1, 0.1f}, {1, 0.0f}}, 0.2) == Approx(0.1));
  CATCH_CHECK(fastest_step({}, 0.2) == Approx(0.2));
  CATCH_CHECK(fastest_step({{1, 0.0f}}, 0.0) == 0.0);
  CATCH_CHECK(contributing_workers({{2, 0.4f}, {1.0000001f, 0.1f}, {0, 0.0f}}) == 3.0);
}

CATCH_TEST_CASE("adaptive steps weigh a node by its tokens and move its schedule by its share of the round",
                "[unit][round][adaptive]") {
  // Weight: workers * h / H. Two workers at 10 of 40 steps trained the tokens of half a worker's round.
  CATCH_CHECK(round_weight(2, 10, 40) == 0.5);
  CATCH_CHECK(round_weight(3, 40, 40) == 3.0);  // h = H: the worker count, as without adaptive steps
  // The token-weighted mean of two nodes, one of 2 workers at H and one of 2 workers at H / 4: the slower
  // node's pseudo-gradient counts a fifth.
  const double w_fast = round_weight(2, 40, 40), w_slow = round_weight(2, 10, 40);
  CATCH_CHECK(w_slow / (w_fast + w_slow) == Approx(0.2));

  // The learning-rate schedule: step k of h in round r stands at (r - 1) * H + k * H / h.
  using longwave::models::schedule_step;
  CATCH_CHECK(schedule_step(1, 0, 40, 40) == 0);
  CATCH_CHECK(schedule_step(3, 7, 40, 40) == 87);  // h = H: the plain count
  CATCH_CHECK(schedule_step(3, 0, 10, 40) == 80);
  CATCH_CHECK(schedule_step(3, 1, 10, 40) == 84);
  CATCH_CHECK(schedule_step(3, 9, 10, 40) == 116);  // the round's last step; round 4 starts at 120
  CATCH_CHECK(schedule_step(2, 2, 13, 40) == 46);   // 40 + floor(2 * 40 / 13)
}
