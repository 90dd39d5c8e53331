// train.device and train.autocast resolved per worker (issue 36): round-robin over the visible GPUs with an
// injected device count, the refusals that name the key, and this machine's own plan (no GPU here).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "models/device.hpp"
#include "runtime/errors/errors.hpp"

using namespace longwave;
using namespace longwave::models;
using Catch::Matchers::Contains;

namespace {

/// The message of the lw_error plan_devices throws (invalid_config); fails the test if it plans.
std::string refusal(const std::string& setting, int64_t workers, int64_t visible, bool built) {
  try {
    plan_devices(setting, workers, visible, built);
  } catch (const lw_error& e) {
    CATCH_CHECK(e.code() == errc::invalid_config);
    return e.what();
  }
  CATCH_FAIL("plan_devices accepted " << setting << " with " << visible << " GPUs");
  return {};
}

}  // namespace

CATCH_TEST_CASE("workers map round-robin onto the visible GPUs, and cpu or auto without one stay on the CPU",
                "[models][device]") {
  using v = std::vector<std::string>;
  CATCH_CHECK(plan_devices("cpu", 3, 2, true).workers == v{"cpu", "cpu", "cpu"});
  CATCH_CHECK(plan_devices("cuda", 5, 2, true).workers ==
              v{"cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"});
  CATCH_CHECK(plan_devices("cuda", 2, 1, true).workers == v{"cuda:0", "cuda:0"});  // two workers share one
  CATCH_CHECK(plan_devices("cuda:1", 2, 4, true).workers == v{"cuda:1", "cuda:1"});
  CATCH_CHECK(plan_devices("auto", 3, 2, true).workers == v{"cuda:0", "cuda:1", "cuda:0"});
  CATCH_CHECK(plan_devices("auto", 2, 0, true).workers == v{"cpu", "cpu"});
  CATCH_CHECK(plan_devices("auto", 2, 0, false).workers == v{"cpu", "cpu"});
  CATCH_CHECK(plan_devices("cpu", 2, 0, false).describe() == "cpu for every worker");
  CATCH_CHECK(plan_devices("cuda", 3, 2, true).describe() == "cuda:0 (workers 0, 2), cuda:1 (worker 1)");
  CATCH_CHECK_FALSE(plan_devices("auto", 1, 0, true).any_cuda());
  CATCH_CHECK(plan_devices("auto", 1, 1, true).any_cuda());
}

CATCH_TEST_CASE("the workers sharing a GPU must fit in its memory together", "[models][device]") {
  constexpr int64_t gib = int64_t{1} << 30;
  const auto total = [](int index) { return index == 0 ? 40 * gib : 80 * gib; };
  const auto plan = plan_devices("cuda", 3, 2, true);  // cuda:0 (workers 0, 2), cuda:1 (worker 1)
  CATCH_CHECK(gpu_overcommit(plan, 20 * gib, total).empty());
  CATCH_CHECK(gpu_overcommit(plan, 21 * gib, total) ==
              "cuda:0: 2 workers x 21.0 GiB = 42.0 GiB, and it has 40.0 GiB");
  CATCH_CHECK(gpu_overcommit(plan_devices("cuda:1", 1, 2, true), 81 * gib, total) ==
              "cuda:1: 1 worker x 81.0 GiB = 81.0 GiB, and it has 80.0 GiB");
  CATCH_CHECK(gpu_overcommit(plan_devices("cpu", 4, 0, false), 1000 * gib, total).empty());  // no GPU asked
}

CATCH_TEST_CASE("a device the build or the machine cannot give is refused naming train.device",
                "[models][device]") {
  CATCH_CHECK_THAT(refusal("cuda", 1, 0, false),
                   Contains("train.device = \"cuda\": this Longwave is built on a CPU LibTorch"));
  CATCH_CHECK_THAT(refusal("cuda:0", 1, 0, false), Contains("built on a CPU LibTorch"));
  CATCH_CHECK_THAT(refusal("cuda", 2, 0, true),
                   Contains("train.device = \"cuda\": no GPU is visible to this process"));
  CATCH_CHECK_THAT(refusal("cuda:2", 1, 2, true),
                   Contains("train.device = \"cuda:2\": this process sees 2 GPUs (cuda:0..cuda:1)"));
  CATCH_CHECK_THAT(refusal("cuda:1", 1, 1, true), Contains("this process sees 1 GPU (cuda:0..cuda:0)"));
}

CATCH_TEST_CASE("train.autocast resolves per device, and bf16 on the CPU is refused", "[models][device]") {
  using config::autocast_mode;
  CATCH_CHECK(resolve_autocast(autocast_mode::automatic, "cpu") == autocast_mode::off);
  CATCH_CHECK(resolve_autocast(autocast_mode::automatic, "cuda:0") == autocast_mode::bf16);
  CATCH_CHECK(resolve_autocast(autocast_mode::off, "cuda:0") == autocast_mode::off);
  CATCH_CHECK(resolve_autocast(autocast_mode::bf16, "cuda:1") == autocast_mode::bf16);
  CATCH_CHECK(resolve_autocast(autocast_mode::off, "cpu") == autocast_mode::off);
  try {
    resolve_autocast(autocast_mode::bf16, "cpu");
    CATCH_FAIL("bf16 autocast on the CPU was accepted");
  } catch (const lw_error& e) {
    CATCH_CHECK(e.code() == errc::invalid_config);
    CATCH_CHECK_THAT(e.what(), Contains("train.autocast = \"bf16\": this worker runs on the CPU"));
  }
}

CATCH_TEST_CASE("this process's plan: cpu and auto run on the CPU of a CPU LibTorch, cuda is refused",
                "[models][device]") {
  CATCH_CHECK(plan_devices("cpu", 2).workers == std::vector<std::string>{"cpu", "cpu"});
  if (plan_devices("auto", 1).any_cuda()) return;  // a GPU machine: the gpu label covers it
  CATCH_CHECK(plan_devices("auto", 2).workers == std::vector<std::string>{"cpu", "cpu"});
  CATCH_CHECK_THROWS_AS(plan_devices("cuda", 1), lw_error);
}
