// A node's cut-off rule (cluster/cut_off_rule.hpp) as event tables in virtual time: each row is a moment and
// an event, and whether the node then takes itself to be cut off. No sockets, no clock.
#include <catch2/catch.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "cluster/cut_off_rule.hpp"

#if defined(ZMQ_VERSION_MAJOR) || defined(CAF_VERSION) || defined(CAPNP_VERSION_MAJOR) || \
    defined(TORCH_VERSION)
#error "cluster/cut_off_rule.hpp must not include ZeroMQ, CAF, Cap'n Proto or libtorch"
#endif

using namespace longwave::cluster;

namespace {

/// At `t` seconds `what` happens (failed | failed, began B | fence E | membership | gone | back | tick), then
/// the rule is asked. expect: "" (not cut off) or a text its answer contains.
struct row {
  double t;
  std::string what;
  std::string expect;
};

/// Plays the rows (cut off after 30 s); returns the first row whose answer differs, or "" when all agree.
std::string play(const std::vector<row>& rows) {
  using clock = std::chrono::steady_clock;
  const clock::time_point t0{};
  cut_off_rule rule(std::chrono::seconds(30));
  std::optional<clock::time_point> gone;
  for (const auto& r : rows) {
    const auto now = t0 + std::chrono::milliseconds(static_cast<int64_t>(r.t * 1000));
    if (r.what == "failed") rule.ring_failed(now, now);
    if (r.what.rfind("failed, began ", 0) == 0)
      rule.ring_failed(
          t0 + std::chrono::milliseconds(static_cast<int64_t>(std::stod(r.what.substr(14)) * 1000)), now);
    if (r.what.rfind("fence ", 0) == 0) rule.fenced(std::stoull(r.what.substr(6)), now);
    if (r.what == "membership") rule.entered();
    if (r.what == "gone") gone = now;
    if (r.what == "back") gone.reset();
    const auto why = rule.due(gone, now);
    const bool agrees = r.expect.empty() ? !why : why && why->find(r.expect) != std::string::npos;
    if (!agrees) return std::to_string(r.t) + " " + r.what + ": " + (why ? *why : "not cut off");
  }
  return "";
}

}  // namespace

CATCH_TEST_CASE("a node whose ring failed is cut off 30 s after its coordinator became unreachable",
                "[unit][cut_off]") {
  CATCH_CHECK(play({{0, "failed", ""},
                    {5, "gone", ""},
                    {34.9, "tick", ""},
                    {35, "tick", "cut off from the cluster: this node's ring failed"},
                    {36, "tick", ""}}) == "");  // said once
  // Gone first: the clock runs from the failure.
  CATCH_CHECK(play({{0, "gone", ""}, {10, "failed", ""}, {39, "tick", ""}, {40, "tick", "ring failed"}}) ==
              "");
  // A call that waited out the ring's timeout on a neighbour that died (began at 1 s, failed at 40 s): the
  // ring stalled when it began, so 30 s after the coordinator went it is cut off, not 30 s after the failure
  // (a probe: 69 s).
  CATCH_CHECK(play({{0, "gone", ""}, {40, "failed, began 1", "ring failed"}}) == "");
  CATCH_CHECK(
      play({{0, "gone", ""}, {20, "failed, began 1", ""}, {30.9, "tick", ""}, {31, "tick", "failed"}}) == "");
  // A connected coordinator deals with it however long it takes.
  CATCH_CHECK(play({{0, "failed", ""}, {500, "tick", ""}}) == "");
}

CATCH_TEST_CASE("a fenced node whose coordinator went away is cut off, and a membership ends the wait",
                "[unit][cut_off]") {
  // The old rule forgot the stall at the fence: a node fenced by a coordinator that then died waited forever.
  CATCH_CHECK(play({{0, "failed", ""},
                    {1, "fence 3", ""},
                    {2, "gone", ""},
                    {31.9, "tick", ""},
                    {32, "tick", "ring is fenced for epoch 3"}}) == "");
  CATCH_CHECK(play({{0, "fence 4", ""}, {1, "gone", ""}, {31, "tick", "fenced for epoch 4"}}) == "");
  // The membership came before the coordinator went: the ring trains on without it.
  CATCH_CHECK(play({{0, "fence 3", ""}, {1, "membership", ""}, {2, "gone", ""}, {600, "tick", ""}}) == "");
  // A coordinator back within the time (a restart) takes the node over: no cut-off; gone again, it counts
  // anew.
  CATCH_CHECK(play({{0, "fence 3", ""},
                    {1, "gone", ""},
                    {20, "back", ""},
                    {40, "gone", ""},
                    {69, "tick", ""},
                    {70, "tick", "fenced for epoch 3"}}) == "");
  // A failure while fenced keeps the fence's time and words.
  CATCH_CHECK(
      play({{0, "fence 3", ""}, {0, "gone", ""}, {5, "failed", ""}, {30, "tick", "fenced for epoch 3"}}) ==
      "");
}
