// Outer-step policies over real processes: a 2-node x 2-worker cluster on loopback trains with each policy
// and wire dtype, each policy at its best outer setting from bench/policy_quality.sh. int8 on the wire must
// end within 1.5% of fp32 for every policy, and "streaming" within 1.5% of "sync" (the issue's goal, which it
// meets). "delayed" and "eager" miss that goal on runs this short (about +5% and +2.5%, bench/RESULTS.md);
// for them the test guards the measured order: eager closer to sync than delayed, both within a bound.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "tests/support/process.hpp"

using namespace longwave::test;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> policies{"sync", "delayed", "eager", "streaming"};

/// Each policy's best outer setting at 12 rounds x H=10 in bench/RESULTS.md: {lr, momentum, nesterov}.
/// delayed and eager use heavy-ball momentum -0.5, which offsets their stale average (session 9).
const std::map<std::string, std::array<std::string, 3>> outer_setting{{"sync", {"0.5", "0", "true"}},
                                                                      {"delayed", {"0.7", "-0.5", "false"}},
                                                                      {"eager", {"0.7", "-0.5", "false"}},
                                                                      {"streaming", {"1.0", "0", "true"}}};

// A short run of the tiny model: 120 inner steps per worker, 12 rounds; one torch thread per worker.
const char* train_sections = R"(seed = 11
[model]
seq_len = 64
[train]
inner_steps = 10
rounds = 12
batch_size = 8
warmup_steps = 10
threads = 1
[eval]
every_rounds = 0
batches = 16
[checkpoint]
every_rounds = 4
)";

/// Writes a 2-node cluster file (2 workers each) on free loopback ports; out_dir is dir/run.
std::string cluster_file(const std::string& dir) {
  std::string text = "[cluster]\nid = \"policy-" + fs::path(dir).filename().string() +
                     "\"\ncoordinator = \"tcp://127.0.0.1:" + std::to_string(free_port()) +
                     "\"\nmetrics_port = " + std::to_string(free_port()) + "\n";
  for (int i = 0; i < 2; ++i)
    text += "\n[[nodes]]\nname = \"n" + std::to_string(i) +
            "\"\nendpoint = \"tcp://127.0.0.1:" + std::to_string(free_port()) +
            "\"\nworkers = 2\nmetrics_port = " + std::to_string(free_port()) + "\n";
  text += "\n[run]\nout_dir = \"" + dir + "/run\"\n";
  text += train_sections;
  const auto path = dir + "/cluster.toml";
  write_text(path, text);
  return path;
}

double val_loss_of(const std::string& result_json) {
  const auto text = read_text(result_json);
  const auto pos = text.find("\"val_loss\": ");
  CATCH_REQUIRE(pos != std::string::npos);
  return std::stod(text.substr(pos + 12));
}

}  // namespace

CATCH_TEST_CASE(
    "each outer-step policy trains over real processes, int8 ends within 1.5% of fp32, streaming of sync",
    "[process][policy]") {
  const auto dir = scratch_dir("policies");
  std::map<std::string, double> loss;
  for (const std::string& policy : policies) {
    for (const std::string dtype : {"fp32", "int8"}) {
      const auto name = policy + "-" + dtype;
      const auto sub = dir + "/" + name;
      fs::create_directories(sub);
      const auto cluster = cluster_file(sub);
      const auto& [lr, mu, nesterov] = outer_setting.at(policy);
      auto [code, log] = run({binary(), "launch", cluster, "--fresh", "--set", "diloco.outer=" + policy,
                              "--set", "comm.dtype=" + dtype, "--set", "outer.lr=" + lr, "--set",
                              "outer.momentum=" + mu, "--set", "outer.nesterov=" + nesterov},
                             sub + "/launch.log", 900);
      CATCH_INFO(name << "\n" << log);
      CATCH_REQUIRE(code == 0);
      const double n0 = val_loss_of(sub + "/run/n0/result.json");
      const double n1 = val_loss_of(sub + "/run/n1/result.json");
      CATCH_CHECK(n0 == n1);  // every node ends with the same theta_global
      if (policy == "delayed")
        CATCH_CHECK(log.find("delayed: applying the average of the last round (12)") != std::string::npos);
      if (policy == "eager")
        CATCH_CHECK(log.find("eager: final parameters = the mean of all 4 workers") != std::string::npos);
      if (policy == "streaming")
        CATCH_CHECK(log.find("streaming: syncing fragments 1..1 once more") != std::string::npos);
      // Each all-reduce line carries its ring label: 0 for a round's average, streaming's syncs 1..P and
      // its last sync of fragment 1 P+1 = 3, eager's final mean of the parameters 1.
      const auto events = read_text(sub + "/run/n0/metrics.jsonl");
      const auto last_label = [&](int label) {
        return events.find("\"round\":12,\"label\":" + std::to_string(label) + ",") != std::string::npos;
      };
      CATCH_CHECK(last_label(policy == "streaming" ? 3 : policy == "eager" ? 1 : 0));
      CATCH_CHECK(last_label(1) == (policy == "eager" || policy == "streaming"));
      loss[name] = n0;
    }
  }
  for (const auto& [name, v] : loss) {
    CATCH_INFO(name << ": val loss " << v);
    std::printf("policy test: %s val loss %.6f\n", name.c_str(), v);
  }
  // Quantization: int8 within 1.5% of fp32 under the same policy.
  for (const std::string& policy : policies) {
    const double fp32 = loss.at(policy + "-fp32"), int8 = loss.at(policy + "-int8");
    CATCH_INFO(policy << ": int8 " << int8 << " vs fp32 " << fp32);
    CATCH_CHECK(std::abs(int8 - fp32) / fp32 <= 0.015);
  }
  for (const std::string dtype : {"fp32", "int8"}) {
    const double sync = loss.at("sync-" + dtype), delayed = loss.at("delayed-" + dtype),
                 eager = loss.at("eager-" + dtype), streaming = loss.at("streaming-" + dtype);
    CATCH_INFO(dtype << ": sync " << sync << ", delayed " << delayed << ", eager " << eager << ", streaming "
                     << streaming);
    CATCH_CHECK(streaming / sync <= 1.015);  // the issue's convergence goal
    CATCH_CHECK(sync < 2.4);                 // all trained: the byte model starts at ln 256 = 5.5
    CATCH_CHECK(eager < delayed);            // the fresh own pseudo-gradient helps
    CATCH_CHECK(eager / sync < 1.06);
    CATCH_CHECK(delayed / sync < 1.10);
  }
  fs::remove_all(dir);
}
