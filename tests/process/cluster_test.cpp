// Clusters of real processes on loopback: `longwave launch`, `coordinator` and `node`, the ring all-reduce
// across nodes, rendezvous failures, and malformed frames sent to every listening port during training.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "cluster/envelope.hpp"
#include "config/cluster_config.hpp"
#include "runtime/checkpoint/checkpoint_store.hpp"
#include "runtime/checkpoint/run_lock.hpp"
#include "tests/support/cluster.hpp"
#include "tests/support/process.hpp"
#include "tests/support/prom_text.hpp"
#include "tests/support/raw_frames.hpp"

using namespace longwave;
using namespace longwave::test;
namespace fs = std::filesystem;

CATCH_TEST_CASE("2 nodes x 2 workers over the ring end with the theta_global of 1 process x 4 workers",
                "[process][cluster]") {
  const auto dir = scratch_dir("cluster_equiv");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {2, 2}, ports, "[metrics]\nenabled = false\n");
  auto [code, log] = run({binary(), "launch", cluster}, dir + "/launch.log", 600);
  CATCH_INFO(log);
  CATCH_REQUIRE(code == 0);
  CATCH_CHECK(contains(log, "[n0         ]"));  // merged output, prefixed by role
  CATCH_CHECK(contains(log, "coordinator: every node finished"));
  check_master_end(dir + "/cluster", "finished", "n0,n1", "");

  // The same training config in one process with 4 workers.
  const auto single = dir + "/single.toml";
  write_text(single, "[run]\nout_dir = \"" + dir + "/single\"\nseed = 7\n" + cluster_train_sections +
                         "[metrics]\nenabled = false\n[train]\nworkers = 4\n");
  // ([train] appears twice above: rewrite it as one table.)
  auto text = read_text(single);
  text.replace(text.find("[train]\nworkers = 4\n"), std::strlen("[train]\nworkers = 4\n"), "");
  text.replace(text.find("[train]\n"), std::strlen("[train]\n"), "[train]\nworkers = 4\n");
  write_text(single, text);
  auto [code1, log1] = run({binary(), "run", single}, dir + "/single.log", 600);
  CATCH_INFO(log1);
  CATCH_REQUIRE(code1 == 0);

  const auto a = newest_theta(dir + "/cluster/n0/checkpoints");
  const auto b = newest_theta(dir + "/cluster/n1/checkpoints");
  const auto one = newest_theta(dir + "/single/checkpoints");
  CATCH_CHECK(max_abs_diff(a, b) == 0.0);  // the ring gives every node the same bits
  const double d = max_abs_diff(a, one);
  CATCH_INFO("max |theta(2x2) - theta(1x4)| = " << d);
  CATCH_CHECK(d <= 1e-6);
  // And training did move theta (a test that could not fail otherwise).
  CATCH_CHECK(max_abs_diff(a, oldest_theta(dir + "/cluster/n0/checkpoints")) > 1e-3);
  CATCH_CHECK(fs::exists(dir + "/cluster/n0/result.json"));
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE(
    "a node of speed 0.2 paces its inner steps at train.pace_step_s / 0.2, and its peer waits for it",
    "[process][cluster][pace]") {
  const auto dir = scratch_dir("cluster_pace");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1}, ports, "[metrics]\nenabled = false\n");
  edit_file(cluster, "threads = 1", "threads = 1\npace_step_s = 0.02");
  edit_file(cluster, "name = \"n1\"", "name = \"n1\"\nspeed = 0.2");  // 0.1 s a step
  auto [code, log] = run({binary(), "launch", cluster}, dir + "/launch.log", 600);
  CATCH_INFO(log);
  CATCH_REQUIRE(code == 0);
  // Each round of 3 paced steps takes at least 3 x 0.1 s on n1, and n0 waits for it at the all-reduce: a
  // lower bound on both, whatever the machine.
  for (const std::string node : {"n0", "n1"}) {
    int rounds = 0;
    for (const auto& r : records_of(dir + "/cluster/" + node)) {
      if (std::string(r["kind"].GetString()) != "worker" || at(r, "round").GetInt64() < 1) continue;
      CATCH_INFO(node << " round " << at(r, "round").GetInt64());
      CATCH_CHECK(at(r, "wall_s").GetDouble() >= 3 * 0.1 * 0.999);
      ++rounds;
    }
    CATCH_CHECK(rounds == 3);
  }
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE(
    "adaptive steps: a node at a quarter of the speed runs the steps that fit in the fastest node's round",
    "[process][cluster][pace][adaptive]") {
  // sync, and eager (whose proxy divides by the workers the notes count, not by the token weight).
  for (const std::string outer : {"sync", "eager"}) {
    CATCH_INFO("diloco.outer = " << outer);
    const auto dir = scratch_dir("cluster_adaptive_" + outer);
    cluster_ports ports;
    const auto cluster = cluster_file(
        dir, {1, 1}, ports,
        "[metrics]\nenabled = false\n[diloco]\nadaptive_steps = true\nmin_steps = 1\nouter = \"" + outer +
            "\"\n");
    edit_file(cluster, "inner_steps = 3\nrounds = 3", "inner_steps = 8\nrounds = 4");
    edit_file(cluster, "threads = 1", "threads = 1\npace_step_s = 0.05");
    edit_file(cluster, "name = \"n1\"", "name = \"n1\"\nspeed = 0.25");  // 0.2 s a step
    auto [code, log] = run({binary(), "launch", cluster}, dir + "/launch.log", 600);
    CATCH_INFO(log);
    CATCH_REQUIRE(code == 0);
    // Per node and round: the steps it ran, its measured step time, theta's CRC; the final val loss.
    struct round_row {
      int64_t steps = 0;
      double step_s = 0;
      std::string crc;
    };
    std::map<std::string, std::map<int64_t, round_row>> rows;
    std::map<std::string, double> final_loss;
    for (const std::string node : {"n0", "n1"})
      for (const auto& r : records_of(dir + "/cluster/" + node)) {
        const std::string kind = r["kind"].GetString();
        if (kind == "round")
          rows[node][at(r, "round").GetInt64()] = {at(r, "inner_steps").GetInt64(),
                                                   at(r, "step_seconds").GetDouble(),
                                                   at(r, "theta_crc32c").GetString()};
        if (kind == "end") final_loss[node] = at(r, "val_loss").GetDouble();
      }
    CATCH_REQUIRE(rows["n0"].size() == 4);
    CATCH_REQUIRE(rows["n1"].size() == 4);
    // Round 1 knows no step times: H on both. n1 is paced 4x slower than n0 (a lower bound on its steps,
    // whatever the machine).
    CATCH_CHECK(rows["n0"][1].steps == 8);
    CATCH_CHECK(rows["n1"][1].steps == 8);
    // The steps a node's own step time of round `own_from` and the notes of round `notes_from`'s all-reduce
    // give it (hand arithmetic: H * fastest / own, rounded, H within 5 %, at least min_steps = 1; the fastest
    // is the least of the notes and its own). Both nodes by the same rule, from their measured times: on a
    // loaded machine n0's own step can outlast its pace, and then n0 too runs fewer than H.
    auto steps_from = [&](const std::string& node, int64_t own_from, int64_t notes_from) {
      const double own = rows[node][own_from].step_s;
      const double fastest = std::min({rows["n0"][notes_from].step_s, rows["n1"][notes_from].step_s, own});
      return own <= fastest * 1.05 ? int64_t{8} : std::clamp<int64_t>(std::lround(8 * fastest / own), 1, 8);
    };
    // A node knows its own time of the round before. sync's notes are that round's too (its all-reduce ends
    // before the next round begins). eager's all-reduce runs during the next round: its notes are the round
    // before's or, while that all-reduce is in flight, the one before that's; round 2 runs H unless round
    // 1's all-reduce has already ended (no notes yet).
    int64_t n1_short_rounds = 0;
    for (int64_t round = 2; round <= 4; ++round) {
      CATCH_INFO("round " << round);
      CATCH_CHECK(rows["n1"][round - 1].step_s >= 0.2 * 0.999);
      for (const std::string node : {"n0", "n1"}) {
        CATCH_INFO("node " << node);
        const int64_t got = rows[node][round].steps;
        const bool matches =
            std::abs(got - steps_from(node, round - 1, round - 1)) <= 1 ||  // a time's float rounding at a .5
            (outer != "sync" &&
             (round == 2 ? got == 8 : std::abs(got - steps_from(node, round - 1, round - 2)) <= 1));
        CATCH_CHECK(matches);
      }
      if (rows["n1"][round].steps < 8) ++n1_short_rounds;
      // sync: one theta on both nodes every round, whatever each trained (eager's differ until its final
      // mean).
      if (outer == "sync") CATCH_CHECK(rows["n0"][round].crc == rows["n1"][round].crc);
    }
    // n1 is paced 4x slower than n0's pace: it runs fewer than H at least once (sync: from round 2).
    CATCH_CHECK(n1_short_rounds >= 1);
    CATCH_CHECK(final_loss["n0"] == final_loss["n1"]);  // one final theta
    CATCH_CHECK(contains(log, outer == "sync" ? "adaptive steps: round 2 runs" : "adaptive steps: round "));
    fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
  }
}

CATCH_TEST_CASE("a node whose coordinator is not running exits with one clear line", "[process][cluster]") {
  const auto dir = scratch_dir("cluster_nocoord");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1}, ports, "", 2);
  const auto t0 = std::chrono::steady_clock::now();
  auto [code, log] = run({binary(), "node", cluster, "--node", "n0"}, dir + "/n0.log", 60);
  const double s = seconds_since(t0);
  CATCH_INFO(log);
  CATCH_CHECK(code == 1);
  CATCH_CHECK(s < 30);
  CATCH_CHECK(
      contains(log, "cannot reach the coordinator at tcp://127.0.0.1:" + std::to_string(ports.coordinator)));
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE("launch refuses nodes whose memory estimates together pass this machine's, before any starts",
                "[process][cluster]") {
  const auto dir = scratch_dir("cluster_launch_memory");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1}, ports);
  // One node's estimate at two batch sizes (a + b x batch), from its dry run, and this machine's memory.
  double machine = 0;
  const auto estimate = [&](int batch) {
    auto [code, out] = run({binary(), "node", cluster, "--node", "n0", "--dry-run", "--set",
                            "model.preset=\"small\"", "--set", "train.batch_size=" + std::to_string(batch)},
                           dir + "/dry.log", 120);
    CATCH_INFO(out);
    CATCH_REQUIRE(code == 0);
    const auto at = out.find("# memory estimate: ");
    CATCH_REQUIRE(at != std::string::npos);
    machine = std::stod(out.substr(out.find("(this machine: ", at) + 15));
    return std::stod(out.substr(at + 19));
  };
  const double one = estimate(1), slope = estimate(2) - one;
  CATCH_REQUIRE(slope > 0);
  // Each node alone takes 70 % of the machine: each fits, the two together do not.
  const int batch = static_cast<int>((0.7 * machine - (one - slope)) / slope);
  auto [code, out] = run({binary(), "launch", cluster, "--set", "model.preset=\"small\"", "--set",
                          "train.batch_size=" + std::to_string(batch)},
                         dir + "/launch.log", 120);
  CATCH_INFO(out);
  CATCH_CHECK(code == 2);
  CATCH_CHECK(contains(out, "launch: the memory estimate of the 2 nodes it starts on this machine is "));
  CATCH_CHECK_FALSE(fs::exists(dir + "/cluster/logs"));  // nothing started
  fs::remove_all(dir);                                   // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE("launch exits with the nodes' code when every node refuses its config after the welcome",
                "[process][cluster]") {
  // The coordinator, whose nodes all failed, ended first with 1, and launch said 1 for a bad config.
  const auto dir = scratch_dir("cluster_launch_refused");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1}, ports, "[metrics]\nenabled = false\n");
  auto [code, out] =
      run({binary(), "launch", cluster, "--set", "train.device=\"cuda:99\""}, dir + "/launch.log", 300);
  CATCH_INFO(out);
  CATCH_CHECK(contains(out, "train.device = \"cuda:99\""));
  CATCH_CHECK(contains(out, " n0=2 n1=2"));
  CATCH_CHECK(code == 2);
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE("a coordinator that has ended keeps its exit code when a late Ctrl-C meets it",
                "[process][cluster]") {
  // launch stops every role once one fails: a coordinator that had ended with 1 showed 130.
  const auto dir = scratch_dir("cluster_coordinator_late");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1}, ports, "", 1);  // no node comes: it ends with 1
  auto c = spawn({binary(), "coordinator", cluster}, dir + "/coord.log", false,
                 {"LONGWAVE_FAULT_SLOW_EXIT_S=600"});
  CATCH_REQUIRE(
      wait_for_text(dir + "/coord.log", "the process waits 600 s before it exits with code 1", 120));
  CATCH_REQUIRE(kill(c.pid, SIGINT) == 0);
  CATCH_CHECK(wait_exit(c, 60) == 1);
  CATCH_INFO(read_text(dir + "/coord.log"));
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

namespace {

/// Runs node `name` of `cluster` with `args` and no coordinator: it must stop with exit `want` (2: bad
/// config) and `reason` before it says hello.
void check_stops_before_hello(const std::string& dir, const std::string& cluster, const std::string& name,
                              const std::vector<std::string>& args, const std::string& reason, int want = 2) {
  std::vector<std::string> cmd{binary(), "node", cluster, "--node", name};
  cmd.insert(cmd.end(), args.begin(), args.end());
  auto [code, log] = run(cmd, dir + "/" + name + ".log", 120);
  CATCH_INFO(log);
  CATCH_CHECK(code == want);
  CATCH_CHECK(contains(log, reason));
  CATCH_CHECK_FALSE(contains(log, "joining cluster"));
}

}  // namespace

CATCH_TEST_CASE("a node checks its ring and metrics ports and tokenizes its corpus before it says hello",
                "[process][cluster]") {
  const auto dir = scratch_dir("cluster_before_hello");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1}, ports);
  CATCH_SECTION("a ring port another process holds") {
    const held_port held;
    const auto taken = "tcp://127.0.0.1:" + std::to_string(held.port);
    edit_file(cluster, "tcp://127.0.0.1:" + std::to_string(ports.ring[1]), taken);
    check_stops_before_hello(dir, cluster, "n1", {}, "its ring endpoint " + taken + " cannot be bound");
    CATCH_CHECK(contains(read_text(dir + "/n1.log"),
                         "another process holds the port: is node n1 already running here?"));
  }
  // The metrics port too: it was found after the cluster had formed, and the others were stopped with it.
  CATCH_SECTION("a metrics port another process holds") {
    const held_port held;
    edit_file(cluster, "metrics_port = " + std::to_string(ports.metrics[1]),
              "metrics_port = " + std::to_string(held.port));
    check_stops_before_hello(dir, cluster, "n1", {},
                             "its metrics port 127.0.0.1:" + std::to_string(held.port) + " cannot be bound");
  }
  CATCH_SECTION("a corpus that is not text") {
    std::string bytes(4096, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 % 32);
    write_text(dir + "/binary.bin", bytes);
    check_stops_before_hello(dir, cluster, "n0", {"--set", "data.path=" + dir + "/binary.bin"},
                             "is not text");
  }
  // A config error there (it was std::terminate: exit 134).
  CATCH_SECTION("a corpus that is missing, or a device") {
    check_stops_before_hello(dir, cluster, "n0", {"--set", "data.path=" + dir + "/nowhere.txt"},
                             "no such file or directory");
    check_stops_before_hello(dir, cluster, "n0", {"--set", "data.path=/dev/null"},
                             "a device, a pipe or a socket");
  }
  // Its out_dir held by another run (a node of another cluster file with this out_dir): exit 4 before the
  // hello. It joined, started the other cluster short, and only then failed.
  CATCH_SECTION("an out_dir another run holds") {
    fs::create_directories(dir + "/cluster/n0");
    const runtime::run_lock held(dir + "/cluster/n0");
    check_stops_before_hello(dir, cluster, "n0", {},
                             "run.out_dir " + dir + "/cluster/n0 is in use by another longwave run (pid " +
                                 std::to_string(getpid()) + ")",
                             4);
  }
  // The node tokenizes into them before training makes its directories (it was exit 1, a filesystem error);
  // a dangling link on the way is now a config error, as --dry-run finds it.
  CATCH_SECTION("a data.cache_dir or an out_dir that cannot be made") {
    fs::create_symlink(dir + "/gone", dir + "/dangling");
    check_stops_before_hello(
        dir, cluster, "n0", {"--set", "data.cache_dir=" + dir + "/dangling/data"},
        "data.cache_dir = \"" + dir + "/dangling/data\": " + dir + "/dangling is a symbolic link");
    check_stops_before_hello(
        dir, cluster, "n0", {"--set", "run.out_dir=" + dir + "/dangling/out"},
        "run.out_dir = \"" + dir + "/dangling/out\": " + dir + "/dangling is a symbolic link");
    CATCH_CHECK_FALSE(fs::exists(dir + "/gone"));
  }
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE(
    "a coordinator of another cluster file with the same run.out_dir exits 4 and writes nothing there",
    "[process][cluster]") {
  // It wrote its start, removals and end into the running cluster's coordinator.jsonl (a probe).
  const auto dir = scratch_dir("cluster_coord_other");
  cluster_ports ports, other_ports;
  const auto cluster = cluster_file(dir, {1, 1}, ports);
  fs::create_directories(dir + "/other");
  auto other = cluster_file(dir + "/other", {1, 1}, other_ports);
  edit_file(other, "out_dir = \"" + dir + "/other/cluster\"", "out_dir = \"" + dir + "/cluster\"");
  edit_file(other, "id = \"test-", "id = \"other-");
  auto first = spawn({binary(), "coordinator", cluster}, dir + "/coord.log");
  CATCH_REQUIRE(wait_for_text(dir + "/coord.log", "waiting up to", 60));
  auto [code, log] = run({binary(), "coordinator", other}, dir + "/other.log", 60);
  CATCH_INFO(log);
  CATCH_CHECK(code == 4);
  CATCH_CHECK(contains(log, "run.out_dir " + dir +
                                "/cluster is in use by the coordinator of another cluster "
                                "('test-" +
                                fs::path(dir).filename().string() + "')"));
  CATCH_CHECK(occurrences(read_text(dir + "/cluster/coordinator.jsonl"), "\"kind\":\"start\"") == 1);
  CATCH_REQUIRE(kill(first.pid, SIGINT) == 0);
  CATCH_CHECK(wait_exit(first, 60) == 130);
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE("a coordinator whose port another process holds exits 2 saying so", "[process][cluster]") {
  const auto dir = scratch_dir("cluster_coord_port");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1}, ports);
  const held_port held;
  edit_file(cluster, "tcp://127.0.0.1:" + std::to_string(ports.coordinator),
            "tcp://127.0.0.1:" + std::to_string(held.port));
  auto [code, log] = run({binary(), "coordinator", cluster}, dir + "/coord.log", 60);
  CATCH_INFO(log);
  CATCH_CHECK(code == 2);
  CATCH_CHECK(contains(log, "cannot listen on tcp://127.0.0.1:" + std::to_string(held.port)));
  CATCH_CHECK(contains(log, "another process holds the port: is a coordinator already running?"));
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "a node whose start-up outlasts join_timeout_s stays in the cluster while it says it is starting",
    "[process][cluster]") {
  // A large checkpoint's load: n1's start-up after its welcome takes 15 s more, past the coordinator's limit
  // for a member's first heartbeat (the larger of join_timeout_s, 4 s, and heartbeat_timeout_s, 6 s).
  const auto dir = scratch_dir("cluster_slow_start");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1}, ports, "", 4);
  // Both say hello before the coordinator starts and wait long for it: both joined before its 4 s deadline.
  auto n0 = spawn({binary(), "node", cluster, "--node", "n0", "--set", "cluster.join_timeout_s=120"},
                  dir + "/n0.log");
  auto n1 = spawn({binary(), "node", cluster, "--node", "n1", "--set", "cluster.join_timeout_s=120"},
                  dir + "/n1.log", false, {"LONGWAVE_FAULT_SLOW_START_S=15"});
  for (const char* n : {"n0", "n1"})
    CATCH_REQUIRE(wait_for_text(dir + "/" + n + ".log", "joining cluster", 300));
  auto coord = spawn({binary(), "coordinator", cluster}, dir + "/coord.log");
  const int coord_code = wait_exit(coord, 300);
  const int code0 = wait_exit(n0, 60), code1 = wait_exit(n1, 60);
  const auto clog = read_text(dir + "/coord.log");
  CATCH_INFO(clog << "\n--- n1\n" << tail(read_text(dir + "/n1.log")));
  CATCH_CHECK(contains(clog, "node n1 is still starting after"));
  CATCH_CHECK_FALSE(contains(clog, "node n1 lost"));
  CATCH_CHECK(coord_code == 0);
  CATCH_CHECK(code0 == 0);
  CATCH_CHECK(code1 == 0);
  CATCH_CHECK(round_crcs(dir + "/cluster/n0") == round_crcs(dir + "/cluster/n1"));
  CATCH_CHECK(round_crcs(dir + "/cluster/n1").size() == 3);
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE("a node started with other training settings is turned away with one line",
                "[process][cluster]") {
  const auto dir = scratch_dir("cluster_other_settings");
  cluster_ports ports;
  // The join deadline only bounds a failure: the nodes below start one after another, each a process start
  // and a corpus load (6 s ran out beside a loaded machine's other tests).
  const auto cluster = cluster_file(dir, {1, 1}, ports, "[metrics]\nenabled = false\n", 120);
  edit_file(cluster, "join_timeout_s = ", "min_nodes = 2\njoin_timeout_s = ");
  auto coord = spawn({binary(), "coordinator", cluster}, dir + "/coord.log");
  auto n0 = spawn({binary(), "node", cluster, "--node", "n0"}, dir + "/n0.log");
  auto [code, log] =
      run({binary(), "node", cluster, "--node", "n1", "--set", "train.lr=0.01"}, dir + "/n1.log", 60);
  CATCH_INFO(log);
  CATCH_CHECK(code == 2);
  CATCH_CHECK(contains(log, "node 'n1' trains with other settings than the coordinator: train.lr = 0.01 ("));
  CATCH_CHECK(contains(log, "the same --set options"));
  // A per-machine setting is fine: n1 with more torch threads joins and the run completes.
  auto [code1, log1] =
      run({binary(), "node", cluster, "--node", "n1", "--set", "train.threads=2"}, dir + "/n1b.log", 300);
  CATCH_INFO(log1);
  CATCH_CHECK(code1 == 0);
  CATCH_CHECK(wait_exit(n0, 300) == 0);
  CATCH_CHECK(wait_exit(coord, 60) == 0);
  CATCH_CHECK(contains(read_text(dir + "/coord.log"), "turned away node 'n1': its training settings differ"));
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE("a node that reads another corpus is turned away with one line naming it",
                "[process][cluster]") {
  const auto dir = scratch_dir("cluster_other_data");
  cluster_ports ports;
  // The deadline covers three node start-ups in a row (n0, n1 turned away, n1 again) on a loaded machine.
  const auto cluster = cluster_file(dir, {1, 1}, ports, "[metrics]\nenabled = false\n", 120);
  edit_file(cluster, "join_timeout_s = ", "min_nodes = 2\njoin_timeout_s = ");
  auto coord = spawn({binary(), "coordinator", cluster}, dir + "/coord.log");
  auto n0 = spawn({binary(), "node", cluster, "--node", "n0"}, dir + "/n0.log");
  // n0's is the cluster's data: n1 says hello after it.
  CATCH_REQUIRE(wait_for_text(dir + "/coord.log", "node n0 joined", 60));
  write_text(dir + "/other.txt", "In the beginning was another corpus.\n");
  auto [code, log] =
      run({binary(), "node", cluster, "--node", "n1", "--set", "data.path=" + dir + "/other.txt"},
          dir + "/n1.log", 60);
  CATCH_INFO(log);
  CATCH_CHECK(code == 2);
  CATCH_CHECK(contains(log, "node 'n1' reads other training data than node n0"));
  CATCH_CHECK(contains(log, "give every node the same corpus (data.path)"));
  // With the same corpus it joins and the run completes.
  auto [code1, log1] = run({binary(), "node", cluster, "--node", "n1"}, dir + "/n1b.log", 300);
  CATCH_INFO(log1);
  CATCH_CHECK(code1 == 0);
  CATCH_CHECK(wait_exit(n0, 300) == 0);
  CATCH_CHECK(wait_exit(coord, 60) == 0);
  CATCH_CHECK(contains(read_text(dir + "/coord.log"),
                       "turned away node 'n1': it reads other training data than node n0"));
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE("the coordinator names the nodes missing at its join deadline", "[process][cluster]") {
  const auto dir = scratch_dir("cluster_missing");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1, 1}, ports, "", 4);
  // Every node is needed (with the default min_nodes = 1 the cluster would start with n1 alone).
  edit_file(cluster, "join_timeout_s = ", "min_nodes = 3\njoin_timeout_s = ");
  // n1 says hello before the coordinator starts (its hello waits for it) and waits long for the answer:
  // however slowly either starts, n1 joined before the coordinator's 4 s deadline and is there to hear it.
  auto node = spawn({binary(), "node", cluster, "--node", "n1", "--set", "cluster.join_timeout_s=120"},
                    dir + "/n1.log");
  CATCH_REQUIRE(wait_for_text(dir + "/n1.log", "joining cluster", 300));
  auto coord = spawn({binary(), "coordinator", cluster}, dir + "/coord.log");
  const int coord_code = wait_exit(coord, 60);
  const int node_code = wait_exit(node, 60);
  const auto clog = read_text(dir + "/coord.log");
  const auto nlog = read_text(dir + "/n1.log");
  CATCH_INFO(clog << "\n---\n" << nlog);
  CATCH_CHECK(coord_code == 1);
  CATCH_CHECK(contains(clog, "missing node(s) n0, n2 (joined: n1)"));
  CATCH_CHECK(node_code == 1);
  CATCH_CHECK(contains(nlog, "the cluster was called off"));
  // Nothing trained: report says so and why, from the coordinator's record.
  auto [rcode, rlog] = run({binary(), "report", dir + "/cluster"}, dir + "/report.log", 60);
  CATCH_INFO(rlog);
  CATCH_CHECK(rcode == 2);
  CATCH_CHECK(contains(rlog, "no node of this cluster wrote a metrics.jsonl, so it never trained"));
  CATCH_CHECK(
      contains(rlog, "says it ended 'called_off': join deadline of 4 s passed: missing node(s) n0, n2"));
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE("the coordinator turns away other clusters, other protocol versions and unknown nodes",
                "[process][cluster]") {
  const auto dir = scratch_dir("cluster_reject");
  cluster_ports ports;
  // Without CURVE, so that the raw hellos below reach the coordinator's checks.
  const auto cluster = cluster_file(dir, {1, 1}, ports, "[security]\nmode = \"none\"\n", 60);
  auto coord = spawn({binary(), "coordinator", cluster}, dir + "/coord.log");

  // A real node started with another cluster id.
  auto [code, log] = run({binary(), "node", cluster, "--node", "n0", "--set", "cluster.id=someone-else"},
                         dir + "/n0.log", 60);
  CATCH_INFO(log);
  CATCH_CHECK(code == 2);
  CATCH_CHECK(contains(log, "serves a different cluster"));

  // Raw hellos: another protocol version, and a name the cluster file lacks.
  const auto spec = config::load_cluster_file(cluster, {});
  zmq::context_t ctx;
  auto ask = [&](uint16_t version, const std::string& name) {
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::rcvtimeo, 10000);
    s.connect(spec.coordinator);
    cluster::envelope e;
    e.cluster_id = spec.cluster_id;
    cluster::hello_msg h;
    h.protocol_version = version;
    h.cluster_id = spec.cluster_id;
    h.node_name = name;
    h.n_workers = 1;
    h.data_endpoint = spec.nodes[0].endpoint;
    e.body = h;
    auto bytes = cluster::build_envelope(e);
    s.send(zmq::buffer(bytes.data(), bytes.size()));
    zmq::message_t reply;
    CATCH_REQUIRE(s.recv(reply));
    auto parsed = cluster::parse_envelope(reply.data(), reply.size(), spec.cluster_id);
    CATCH_REQUIRE(parsed.ok());
    const auto* err = std::get_if<cluster::error_msg>(&parsed.value().body);
    CATCH_REQUIRE(err != nullptr);
    return err->message;
  };
  CATCH_CHECK(contains(ask(99, "n0"), "protocol version 99 is not the coordinator's"));
  CATCH_CHECK(
      contains(ask(comm::protocol_version(), "zz"), "node 'zz' is not in this cluster (nodes: n0, n1)"));

  kill(coord.pid, SIGINT);
  CATCH_CHECK(wait_exit(coord, 30) == 130);
  const auto clog = read_text(dir + "/coord.log");
  CATCH_CHECK(contains(clog, "turned away node 'n0'"));
  CATCH_CHECK(contains(clog, "turned away unknown node 'zz'"));
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE("malformed frames sent to every listening port are dropped, counted, and training goes on",
                "[process][cluster][malformed]") {
  const auto dir = scratch_dir("cluster_fuzz");
  cluster_ports ports;
  // Enough rounds to keep the ring busy while the test peer sends; int8 on the wire. Without CURVE, so that
  // the frames reach validation (with it they are refused at the handshake: tests/process/security_test.cpp).
  const auto cluster =
      cluster_file(dir, {1, 1}, ports, "[comm]\ndtype = \"int8\"\n[security]\nmode = \"none\"\n");
  edit_file(cluster, "rounds = 3", "rounds = " + std::to_string(endless_rounds));
  const auto spec = config::load_cluster_file(cluster, {});
  auto launch = spawn({binary(), "launch", cluster}, dir + "/launch.log");

  // Wait until training runs, then fuzz until every reason is counted; then the cluster is stopped.
  CATCH_REQUIRE(wait_for_text(dir + "/launch.log", "step ", 120));
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0};
  std::thread fuzz([&] {
    std::mt19937 rng(5);
    raw_peer peer(ports.ring, spec.coordinator);
    auto& ring = peer.ring;
    auto& control = peer.control;
    auto random_bytes = [&](size_t n) {
      std::vector<std::byte> b(n);
      for (auto& x : b) x = static_cast<std::byte>(rng());
      return b;
    };
    auto send2 = [](zmq::socket_t& s, const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
      (void)s.send(zmq::buffer(a.data(), a.size()), zmq::send_flags::sndmore);
      (void)s.send(zmq::buffer(b.data(), b.size()), zmq::send_flags::none);
    };
    while (!stop) {
      for (size_t r = 0; r < ring.size(); ++r) {
        comm::chunk_header h;
        h.cluster_id = spec.cluster_id;
        h.round = 1;
        h.sender = static_cast<uint32_t>((r + ring.size() - 1) % ring.size());
        h.world_size = static_cast<uint32_t>(ring.size());
        h.dtype = comm::wire_dtype::int8;
        h.total_elements = 1000;
        h.element_count = 10;
        h.weight = 1;
        const auto payload = random_bytes(14);
        h.byte_count = payload.size();
        auto wrong_cluster = h;
        wrong_cluster.cluster_id ^= 1;
        send2(ring[r], comm::build_chunk_header(wrong_cluster), payload);
        auto wrong_round = h;
        wrong_round.round = 0;
        send2(ring[r], comm::build_chunk_header(wrong_round), payload);
        auto wrong_size = h;
        wrong_size.byte_count = 999;
        send2(ring[r], comm::build_chunk_header(wrong_size), payload);
        const auto header = comm::build_chunk_header(h);
        (void)ring[r].send(zmq::buffer(header.data(), header.size() / 2),
                           zmq::send_flags::none);            // truncated
        send2(ring[r], random_bytes(64), random_bytes(100));  // garbage
        sent += 5;
      }
      auto junk = random_bytes(48);
      (void)control.send(zmq::buffer(junk.data(), junk.size()), zmq::send_flags::dontwait);
      // The nodes' /metrics ports: raw bytes that are not HTTP.
      for (int p : ports.metrics) {
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(static_cast<uint16_t>(p));
        if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
          auto bytes = random_bytes(300);
          (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        }
        ::close(fd);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });

  // Scrape node n0's counter while it trains. Every reason has a series from the start (at 0), so what counts
  // is the values: wrong_cluster, truncated, and at least one more reason (wrong_round, malformed, ...).
  std::map<std::string, double> by_reason;
  auto nonzero = [&] {
    int k = 0;
    for (const auto& [reason, n] : by_reason) k += n > 0;
    return k;
  };
  const bool counted = wait_until(
      [&] {
        try {
          auto samples = parse_prom_text(http_get(ports.metrics[0], "/metrics"));
          by_reason.clear();
          for (const auto& s : samples)
            if (s.name == "longwave_comm_rejected_frames_total") by_reason[s.labels.at("reason")] = s.value;
          return by_reason["wrong_cluster"] > 0 && by_reason["truncated"] > 0 && nonzero() >= 3;
        } catch (const std::exception&) {
          return false;
        }
      },
      120);
  // Training goes on under the noise: both nodes record rounds after the counters moved.
  const bool trained = wait_more_rounds({dir + "/cluster/n0", dir + "/cluster/n1"}, 2);
  stop_cluster(dir, cluster);
  const int code = wait_exit(launch, 600);
  stop = true;
  fuzz.join();
  const auto log = read_text(dir + "/launch.log");
  CATCH_INFO(log.substr(log.size() > 20000 ? log.size() - 20000 : 0));
  CATCH_CHECK(sent > 0);
  CATCH_CHECK(counted);
  CATCH_CHECK(trained);
  for (const auto& [reason, n] : by_reason) CATCH_INFO(reason << " " << n);
  CATCH_CHECK(by_reason["wrong_cluster"] > 0);
  CATCH_CHECK(by_reason["truncated"] > 0);
  CATCH_CHECK(nonzero() >= 3);
  CATCH_CHECK(code == 0);  // training went on despite the noise, and stopped when asked
  CATCH_CHECK(contains(log, "comm: dropped a frame from"));
  CATCH_CHECK(contains(log, "coordinator: dropped a control frame"));
  CATCH_CHECK(max_abs_diff(newest_theta(dir + "/cluster/n0/checkpoints"),
                           newest_theta(dir + "/cluster/n1/checkpoints")) == 0.0);
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE(
    "a node SIGKILLed between rounds is removed within seconds, not at the deadline, and the other finishes",
    "[process][cluster][signal]") {
  const auto dir = scratch_dir("cluster_peer_killed");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1}, ports, "[metrics]\nenabled = false\n");
  edit_file(cluster, "rounds = 3", "rounds = " + std::to_string(endless_rounds));
  // Long inner phases, so that the kill most likely lands while both nodes compute, between all-reduces.
  edit_file(cluster, "inner_steps = 3", "inner_steps = 40");
  auto [coord, nodes] = start_cluster(dir, cluster, 2);
  CATCH_REQUIRE(wait_until([&] { return checkpoint_count(dir, "n1") >= 2; }, 300));
  kill(nodes[1].pid, SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  CATCH_CHECK(wait_exit(nodes[1], 30) == 128 + SIGKILL);
  // The ring's deadline is 300 s: the coordinator removes n1 after heartbeat_timeout_s (6 s) of silence at
  // the latest, sooner when n0's ring reports the lost link.
  const bool removed = wait_master_epoch(dir + "/cluster", 2, "lost", "n0", 120);
  const double noticed = seconds_since(t0);
  CATCH_REQUIRE(wait_until([&] { return rounds_in_membership(dir + "/cluster/n0", "n0") >= 2; }, 300));
  stop_cluster(dir, cluster);
  const int code = wait_exit(nodes[0], 300);
  const int coord_code = wait_exit(coord, 60);
  const auto log = read_text(dir + "/n0.log"), clog = read_text(dir + "/coord.log");
  CATCH_INFO(tail(log, 20000) << "\n---\n" << clog);
  CATCH_CHECK(removed);
  CATCH_CHECK(noticed < 60);  // far below the ring's 300 s, with room for a loaded machine
  CATCH_CHECK(master_removal(dir + "/cluster", "n1").first == "lost");
  CATCH_CHECK(code == 0);
  CATCH_CHECK_FALSE(contains(log, "training failed"));
  CATCH_CHECK_FALSE(contains(log, "deadline_missed"));
  CATCH_CHECK(coord_code == 0);
  check_master_end(dir + "/cluster", "stopped", "n0", "n1:lost");
  // n0 trained every round up to the stop, the last ones alone, on a theta that training moved.
  const int64_t last = stop_round(dir + "/cluster/n0");
  CATCH_CHECK(last > 2);
  CATCH_CHECK(round_crcs(dir + "/cluster/n0").size() == static_cast<size_t>(last));
  CATCH_CHECK(max_abs_diff(newest_theta(dir + "/cluster/n0/checkpoints"),
                           oldest_theta(dir + "/cluster/n0/checkpoints")) > 1e-3);
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

namespace {

/// `longwave launch` of two 1-worker nodes that train until stopped, without metrics.
struct endless_launch {
  std::string dir, cluster;
  cluster_ports ports;
  child launch;
};

endless_launch launch_endless(const std::string& name) {
  endless_launch e;
  e.dir = scratch_dir(name);
  e.cluster = cluster_file(e.dir, {1, 1}, e.ports, "[metrics]\nenabled = false\n");
  edit_file(e.cluster, "rounds = 3", "rounds = " + std::to_string(endless_rounds));
  e.launch = spawn({binary(), "launch", e.cluster}, e.dir + "/launch.log");
  return e;
}

}  // namespace

CATCH_TEST_CASE("a node of launch killed by a signal stops the others and launch exits 1 naming the signal",
                "[process][cluster][signal]") {
  auto e = launch_endless("cluster_launch_kill");
  const auto& dir = e.dir;
  auto& launch = e.launch;
  CATCH_REQUIRE(wait_until([&] { return has_checkpoint(dir, "n1"); }, 300));
  pid_t n1 = -1;
  for (const auto& [pid, cmdline] : children_of(launch.pid))
    if (contains(cmdline, "--node n1")) n1 = pid;
  CATCH_REQUIRE(n1 > 0);
  CATCH_REQUIRE(kill(n1, SIGKILL) == 0);
  const int code = wait_exit(launch, 180);
  const auto log = read_text(dir + "/launch.log");
  CATCH_INFO(log.substr(log.size() > 20000 ? log.size() - 20000 : 0));
  CATCH_CHECK(code == 1);
  CATCH_CHECK(contains(log, "launch: node n1 ended with signal 9 (Killed); stopping the others"));
  CATCH_CHECK(contains(log, "n1=137"));
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE(
    "stop --wait before the nodes said hello: launch stops them and exits 0, and stop returns once launch "
    "has ended",
    "[process][cluster][signal]") {
  const auto dir = scratch_dir("cluster_stop_before_hello");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1}, ports, "[metrics]\nenabled = false\n");
  // The nodes wait before their hello, as nodes still preparing a large corpus: the coordinator cannot tell
  // them that the cluster stopped.
  auto launch = spawn({binary(), "launch", cluster}, dir + "/launch.log", false,
                      {"LONGWAVE_FAULT_HELLO_GATE=" + dir + "/never"});
  const auto at_gate = [&](const std::string& role) {
    return contains(read_text(dir + "/cluster/logs/" + role + ".log"), "LONGWAVE_FAULT_HELLO_GATE");
  };
  CATCH_REQUIRE(wait_until(
      [&] {
        return at_gate("n0") && at_gate("n1") &&
               contains(read_text(dir + "/cluster/logs/coordinator.log"), "waiting up to");
      },
      300));
  auto stop = spawn({binary(), "stop", cluster, "--wait"}, dir + "/stop.log");
  const int stop_code = wait_exit(stop, 180);
  // stop --wait returned after launch ended (launch is not reaped yet: a zombie), so a relaunch finds the
  // logs folder free.
  const bool launch_ended = contains(read_text("/proc/" + std::to_string(launch.pid) + "/stat"), ") Z ");
  const int code = wait_exit(launch, 180);
  const auto log = read_text(dir + "/launch.log");
  CATCH_INFO(tail(log, 20000) << "\n--- stop:\n" << read_text(dir + "/stop.log"));
  CATCH_CHECK(stop_code == 0);
  CATCH_CHECK(launch_ended);
  CATCH_CHECK(code == 0);
  CATCH_CHECK(contains(log,
                       "launch: the cluster was stopped before it began training; stopping the nodes "
                       "still starting"));
  CATCH_CHECK(contains(log, "coordinator=0 n0=130 n1=130"));
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE(
    "launch killed by SIGKILL: every role stops with a checkpoint and its own log keeps its last lines",
    "[process][cluster][signal]") {
  auto e = launch_endless("cluster_launch_sigkill");
  const auto& dir = e.dir;
  auto& launch = e.launch;
  CATCH_REQUIRE(wait_until([&] { return has_checkpoint(dir, "n0") && has_checkpoint(dir, "n1"); }, 300));
  const auto roles = children_of(launch.pid);
  CATCH_REQUIRE(roles.size() == 3);
  CATCH_REQUIRE(kill(launch.pid, SIGKILL) == 0);
  wait_exit(launch, 60);
  // The roles, told by PR_SET_PDEATHSIG, stop by themselves; launch no longer reads their output.
  const auto gone = [](pid_t pid) {
    return kill(pid, 0) != 0 || contains(read_text("/proc/" + std::to_string(pid) + "/stat"), ") Z ");
  };
  const bool stopped = wait_until(
      [&] { return std::all_of(roles.begin(), roles.end(), [&](const auto& r) { return gone(r.first); }); },
      180);
  for (const auto& r : roles)
    if (!gone(r.first)) kill(r.first, SIGKILL);
  CATCH_REQUIRE(stopped);
  for (const char* node : {"n0", "n1"}) {
    const auto log = read_text(dir + "/cluster/logs/" + node + ".log");
    CATCH_INFO(node << ":\n" << tail(log));
    CATCH_CHECK(log.rfind("---- longwave launch, ", 0) == 0);
    CATCH_CHECK((contains(log, "stopped at inner step ") ||
                 contains(log, "stopped during the all-reduce of round ")));
  }
  CATCH_CHECK(fs::file_size(dir + "/cluster/logs/coordinator.log") > 0);
  CATCH_CHECK(contains(read_text(dir + "/launch.log"),
                       "each role's output is also kept in " + dir + "/cluster/logs/"));
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE(
    "Ctrl-C or a hangup on launch stops every role with a checkpoint, and the same command resumes",
    "[process][cluster][signal]") {
  auto e = launch_endless("cluster_sigint");
  const auto &dir = e.dir, &cluster = e.cluster;
  const auto& ports = e.ports;
  auto& launch = e.launch;
  // Interrupt once both nodes have checkpointed a few rounds.
  const bool trained = wait_until(
      [&] {
        runtime::checkpoint_store a(dir + "/cluster/n0/checkpoints", 100),
            b(dir + "/cluster/n1/checkpoints", 100);
        return a.list().size() >= 2 && b.list().size() >= 2;
      },
      300);
  CATCH_REQUIRE(trained);
  // A second launch of the running cluster exits 4 at once, before it starts a role or writes a role's log.
  auto again = spawn({binary(), "launch", cluster}, dir + "/again.log");
  CATCH_CHECK(wait_exit(again, 60) == 4);
  CATCH_CHECK(contains(read_text(dir + "/again.log"),
                       "launch: another launch of a cluster with run.out_dir " + dir +
                           "/cluster is running (pid " + std::to_string(launch.pid) + ")"));
  CATCH_CHECK(occurrences(read_text(dir + "/cluster/logs/n0.log"), "---- longwave launch") == 1);
  // A closed terminal's SIGHUP, often sent twice: a stop as Ctrl-C's, never a kill (it was exit 129 at once).
  kill(launch.pid, SIGHUP);
  kill(launch.pid, SIGHUP);
  const int code = wait_exit(launch, 180);
  const auto log = read_text(dir + "/launch.log");
  CATCH_INFO(log.substr(log.size() > 20000 ? log.size() - 20000 : 0));
  CATCH_CHECK(code == 130);
  CATCH_CHECK(contains(log, "launch: interrupt: stopping every role"));
  CATCH_CHECK(contains(log, "launch: exit codes: coordinator=130 n0=130 n1=130"));
  // Each node either saved where it stopped or, stopped inside the ring, kept its last round's checkpoint.
  CATCH_CHECK(occurrences(log, "stopped at inner step ") +
                  occurrences(log, "stopped during the all-reduce of round ") ==
              2);
  // The cluster resumes after the newest round both nodes hold: a node stopped inside the ring may be a round
  // behind the other (the other's all-gather finished first).
  uint64_t common = std::numeric_limits<uint64_t>::max();
  for (const char* node : {"n0", "n1"}) {
    const auto files = runtime::checkpoint_store(dir + "/cluster/" + node + "/checkpoints", 100).list();
    CATCH_REQUIRE_FALSE(files.empty());
    const auto name = fs::path(files.back()).filename().string();  // ckpt-<round>-<step>.lwc
    common = std::min<uint64_t>(common, std::stoull(name.substr(5, name.find('-', 5) - 5)));
  }
  // Every role is gone: nothing listens on the ring ports any more (a bind succeeds).
  for (int p : ports.ring) {
    zmq::context_t ctx;
    zmq::socket_t s(ctx, zmq::socket_type::pull);
    CATCH_CHECK_NOTHROW(s.bind("tcp://127.0.0.1:" + std::to_string(p)));
  }
  // The same command resumes; stopped 2 rounds later, both nodes end on the same theta.
  const int before = rounds_recorded(dir + "/cluster/n0");
  auto launch2 = spawn({binary(), "launch", cluster}, dir + "/launch2.log");
  CATCH_REQUIRE(wait_until([&] { return rounds_recorded(dir + "/cluster/n0") >= before + 2; }, 300));
  stop_cluster(dir, cluster);
  const int code2 = wait_exit(launch2, 300);
  const auto log2 = read_text(dir + "/launch2.log");
  CATCH_INFO(log2.substr(log2.size() > 20000 ? log2.size() - 20000 : 0));
  CATCH_CHECK(code2 == 0);
  CATCH_INFO("the newest round both hold: " << common);
  CATCH_CHECK(contains(log2, "resuming after round " + std::to_string(common)));
  CATCH_CHECK(occurrences(log2, "resuming from round " + std::to_string(common) + ", inner step ") == 2);
  CATCH_CHECK_FALSE(
      contains(log2, "of the training data when the checkpoint"));  // the same file: the same split
  CATCH_CHECK(max_abs_diff(newest_theta(dir + "/cluster/n0/checkpoints"),
                           newest_theta(dir + "/cluster/n1/checkpoints")) == 0.0);
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE(
    "a node stopped with SIGSTOP is removed after heartbeat_timeout_s and the others finish without it",
    "[process][cluster][signal]") {
  const auto dir = scratch_dir("cluster_sigstop_lost");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1, 1}, ports, "[metrics]\nenabled = false\n");
  edit_file(cluster, "join_timeout_s = ", "heartbeat_timeout_s = 4\njoin_timeout_s = ");
  edit_file(cluster, "rounds = 3", "rounds = " + std::to_string(endless_rounds));
  edit_file(cluster, "inner_steps = 3", "inner_steps = 20");
  auto [coord, nodes] = start_cluster(dir, cluster, 3);
  // Two rounds of 20 steps take seconds: n2 has sent heartbeats (before its first one, the coordinator
  // allows a node join_timeout_s to load).
  CATCH_REQUIRE(wait_until([&] { return checkpoint_count(dir, "n2") >= 2; }, 120));
  kill(nodes[2].pid, SIGSTOP);
  // The ring's deadline (comm.timeout_s) is 300 s: n2 must be removed long before it.
  const auto t0 = std::chrono::steady_clock::now();
  const bool removed = wait_master_epoch(dir + "/cluster", 2, "lost", "n0,n1", 120);
  const double waited = seconds_since(t0);
  const bool went_on = wait_until(
      [&] {
        return rounds_in_membership(dir + "/cluster/n0", "n0,n1") >= 2 &&
               rounds_in_membership(dir + "/cluster/n1", "n0,n1") >= 2;
      },
      300);
  stop_cluster(dir, cluster);
  const int code0 = wait_exit(nodes[0], 300);
  const int code1 = wait_exit(nodes[1], 300);
  const int coord_code = wait_exit(coord, 60);
  kill(nodes[2].pid, SIGCONT);
  const int code2 = wait_exit(nodes[2], 60);
  const auto log0 = read_text(dir + "/n0.log"), log1 = read_text(dir + "/n1.log");
  const auto log2 = read_text(dir + "/n2.log"), clog = read_text(dir + "/coord.log");
  CATCH_INFO(tail(log0) << "\n--- n1\n" << tail(log1) << "\n--- n2\n" << tail(log2) << "\n---\n" << clog);
  CATCH_CHECK(removed);
  CATCH_CHECK(went_on);
  CATCH_CHECK(waited < 60);  // far below the ring's 300 s, with room for a loaded machine
  const auto [reason, why] = master_removal(dir + "/cluster", "n2");
  CATCH_CHECK(reason == "lost");
  CATCH_CHECK(why.rfind("node n2 lost: nothing heard for 4 s", 0) == 0);
  for (const auto* log : {&log0, &log1}) {
    CATCH_CHECK_FALSE(contains(*log, "training failed"));
    CATCH_CHECK_FALSE(contains(*log, "deadline_missed"));
  }
  CATCH_CHECK(code0 == 0);
  CATCH_CHECK(code1 == 0);
  CATCH_CHECK(coord_code == 0);
  check_master_end(dir + "/cluster", "stopped", "n0,n1", "n2:lost");
  CATCH_CHECK(code2 != 0);  // n2 wakes up to a cluster that went on without it
  CATCH_CHECK(code2 != -1);
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE("a node removed while stopped that comes back is told so and exits 1 while the others finish",
                "[process][cluster][signal]") {
  const auto dir = scratch_dir("cluster_sigstop_back");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1, 1}, ports, "[metrics]\nenabled = false\n");
  edit_file(cluster, "join_timeout_s = ", "heartbeat_timeout_s = 4\njoin_timeout_s = ");
  edit_file(cluster, "rounds = 3", "rounds = " + std::to_string(endless_rounds));
  edit_file(cluster, "inner_steps = 3", "inner_steps = 20");
  auto [coord, nodes] = start_cluster(dir, cluster, 3);
  // Two rounds of 20 steps take seconds: n2 has sent heartbeats (before its first one, the coordinator
  // allows a node join_timeout_s to load).
  CATCH_REQUIRE(wait_until([&] { return checkpoint_count(dir, "n2") >= 2; }, 120));
  // n2 is removed while stopped, and wakes while the others still train.
  kill(nodes[2].pid, SIGSTOP);
  const bool removed = wait_until([&] { return master_removal(dir + "/cluster", "n2").first == "lost"; }, 60);
  kill(nodes[2].pid, SIGCONT);
  const int code2 = wait_exit(nodes[2], 300);
  stop_cluster(dir, cluster);
  std::vector<int> codes;
  for (size_t i : {0, 1}) codes.push_back(wait_exit(nodes[i], 300));
  codes.push_back(code2);
  const int coord_code = wait_exit(coord, 60);
  const auto log2 = read_text(dir + "/n2.log"), clog = read_text(dir + "/coord.log");
  CATCH_INFO(tail(log2) << "\n---\n" << clog);
  CATCH_CHECK(removed);
  CATCH_CHECK(codes == std::vector<int>{0, 0, 1});
  const auto [reason, why] = master_removal(dir + "/cluster", "n2");
  CATCH_CHECK(reason == "lost");
  CATCH_CHECK(why.rfind("node n2 lost: nothing heard for 4 s", 0) == 0);
  CATCH_CHECK(contains(log2, "this node was removed from the cluster (node n2 lost: nothing heard for 4 s"));
  CATCH_CHECK(contains(log2, "start it again with the same command to rejoin"));
  CATCH_CHECK(coord_code == 0);  // the run's outcome: n0 and n1 trained on until stopped
  check_master_end(dir + "/cluster", "stopped", "n0,n1", "n2:lost");
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE("a second process with a joined node's name is turned away and the first is unaffected",
                "[process][cluster]") {
  const auto dir = scratch_dir("cluster_duplicate");
  cluster_ports ports;
  // The deadline covers three node start-ups in a row (n0, the second n0, n1) on a loaded machine.
  const auto cluster = cluster_file(dir, {1, 1}, ports, "[metrics]\nenabled = false\n", 120);
  auto coord = spawn({binary(), "coordinator", cluster}, dir + "/coord.log");
  auto first = spawn({binary(), "node", cluster, "--node", "n0"}, dir + "/n0.log");
  CATCH_REQUIRE(wait_for_text(dir + "/coord.log", "node n0 joined", 30));
  const auto t0 = std::chrono::steady_clock::now();
  auto [code, log] = run({binary(), "node", cluster, "--node", "n0"}, dir + "/n0-second.log", 60);
  const double s = seconds_since(t0);
  CATCH_INFO(log);
  CATCH_CHECK(code == 2);
  CATCH_CHECK(s < 60);  // turned away at its hello, not at the end of its 125 s wait for a welcome
  CATCH_CHECK(contains(log, "node n0 has already joined from another process"));
  auto n1 = spawn({binary(), "node", cluster, "--node", "n1"}, dir + "/n1.log");
  const int first_code = wait_exit(first, 300);
  const int n1_code = wait_exit(n1, 300);
  const int coord_code = wait_exit(coord, 60);
  const auto clog = read_text(dir + "/coord.log");
  CATCH_INFO(read_text(dir + "/n0.log") << "\n---\n" << clog);
  CATCH_CHECK(first_code == 0);
  CATCH_CHECK(n1_code == 0);
  CATCH_CHECK(coord_code == 0);
  CATCH_CHECK(contains(clog, "turned away a second process for node 'n0'"));
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE(
    "a killed coordinator is noticed by its nodes, a restarted one takes the running cluster over, and it "
    "logs a flood of bad control frames sparingly",
    "[process][cluster][signal]") {
  const auto dir = scratch_dir("cluster_coord_killed");
  cluster_ports ports;
  // Without CURVE: the junk control frames must reach the coordinator's validation.
  const auto cluster = cluster_file(dir, {1, 1}, ports, "[security]\nmode = \"none\"\n");
  // Endless: the test stops the cluster once the new coordinator has taken it over and it trained on.
  edit_file(cluster, "rounds = 3", "rounds = " + std::to_string(endless_rounds));
  edit_file(cluster, "inner_steps = 3", "inner_steps = 20");
  auto [coord, nodes] = start_cluster(dir, cluster, 2);
  CATCH_REQUIRE(wait_until([&] { return has_checkpoint(dir, "n0") && has_checkpoint(dir, "n1"); }, 120));
  kill(coord.pid, SIGKILL);
  CATCH_CHECK(wait_exit(coord, 30) == 128 + SIGKILL);
  for (const char* n : {"n0", "n1"})
    CATCH_CHECK(wait_until(
        [&] {
          return contains(read_text(dir + "/" + n + ".log"), "lost the connection to the coordinator at " +
                                                                 std::string("tcp://127.0.0.1:") +
                                                                 std::to_string(ports.coordinator));
        },
        15));

  // A new coordinator on the same address: the running nodes re-announce themselves and it adopts them.
  auto coord2 = spawn({binary(), "coordinator", cluster}, dir + "/coord2.log");
  CATCH_REQUIRE(wait_for_text(dir + "/coord2.log", "waiting up to", 30));
  const auto spec = config::load_cluster_file(cluster, {});
  const int n_junk = 300;
  {
    zmq::context_t ctx;
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 2000);
    s.connect(spec.coordinator);
    std::mt19937 rng(3);
    for (int i = 0; i < n_junk; ++i) {
      std::vector<std::byte> junk(48);
      for (auto& x : junk) x = static_cast<std::byte>(rng());
      (void)s.send(zmq::buffer(junk.data(), junk.size()), zmq::send_flags::none);
    }
  }
  // Every junk frame is counted in the metric, though few are logged.
  double rejected = 0;
  const bool counted = wait_until(
      [&] {
        try {
          rejected = 0;
          for (const auto& x : parse_prom_text(
                   http_get(static_cast<int>(config::coordinator_metrics_port(spec)), "/metrics")))
            if (x.name == "longwave_comm_rejected_frames_total") rejected += x.value;
          return rejected >= n_junk;
        } catch (const std::exception&) {
          return false;
        }
      },
      60);
  CATCH_REQUIRE(wait_master_records(dir + "/cluster", "takeover", 1, 60));
  CATCH_REQUIRE(wait_more_rounds({dir + "/cluster/n0", dir + "/cluster/n1"}, 2));
  stop_cluster(dir, cluster);
  std::vector<int> codes;
  for (auto& n : nodes) codes.push_back(wait_exit(n, 300));
  const int coord2_code = wait_exit(coord2, 60);
  const auto clog = read_text(dir + "/coord2.log");
  CATCH_INFO(clog);
  CATCH_CHECK(counted);
  CATCH_CHECK(rejected == n_junk);
  CATCH_CHECK(contains(clog, "is already training (epoch 1"));
  const auto takeover = master_records(dir + "/cluster", "takeover");
  CATCH_REQUIRE(takeover.size() == 1);
  CATCH_CHECK(str(at(takeover[0], "members")) == "n0,n1");
  CATCH_CHECK(at(takeover[0], "epoch").GetInt64() == 1);
  // Nothing changed meanwhile: no fence, so no epoch after the first coordinator's, and no round is redone.
  CATCH_CHECK(master_records(dir + "/cluster", "epoch").size() == 1);
  CATCH_CHECK_FALSE(contains(clog, "fencing"));
  check_master_end(dir + "/cluster", "stopped", "n0,n1", "");
  CATCH_CHECK(coord2_code == 0);
  CATCH_CHECK_FALSE(contains(clog, "which has not said hello"));
  CATCH_CHECK(occurrences(clog, "dropped a control frame from") == 50);
  CATCH_CHECK(contains(clog, "from now on every 1000th is logged"));
  CATCH_CHECK(codes ==
              std::vector<int>{0, 0});  // training went on without a coordinator, then with the new one
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto log = read_text(dir + "/n" + std::to_string(i) + ".log");
    CATCH_INFO(log.substr(log.size() > 6000 ? log.size() - 6000 : 0));
    CATCH_CHECK(contains(log, "connected to the coordinator at tcp://127.0.0.1:" +
                                  std::to_string(ports.coordinator) + " again"));
    CATCH_CHECK(contains(log, "the coordinator took this node on in epoch 1"));
  }
  const auto crcs0 = round_crcs(dir + "/cluster/n0"), crcs1 = round_crcs(dir + "/cluster/n1");
  CATCH_CHECK(crcs0.size() == static_cast<size_t>(stop_round(dir + "/cluster/n0")));
  CATCH_CHECK(crcs0 == crcs1);
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE("nodes on different CPU kernel sets (AVX2 and none) keep one theta_global every round",
                "[process][cluster]") {
  const auto dir = scratch_dir("cluster_kernels");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1}, ports, "[metrics]\nenabled = false\n");
  edit_file(cluster, "rounds = 3", "rounds = 6");
  // n1 computes with ATen's scalar kernels; the outer step must round the same way on both.
  auto [coord, nodes] = start_cluster(dir, cluster, 2, {{}, {"ATEN_CPU_CAPABILITY=default"}});
  std::vector<int> codes;
  for (auto& n : nodes) codes.push_back(wait_exit(n, 300));
  const int coord_code = wait_exit(coord, 60);
  const auto clog = read_text(dir + "/coord.log");
  CATCH_INFO(clog << "\n--- n1\n" << tail(read_text(dir + "/n1.log")));
  CATCH_CHECK(codes == std::vector<int>{0, 0});
  CATCH_CHECK(coord_code == 0);
  CATCH_CHECK(contains(read_text(dir + "/n1.log"), "ATen NO AVX"));
  CATCH_CHECK_FALSE(contains(read_text(dir + "/n0.log"), "ATen NO AVX"));
  const auto a = round_crcs(dir + "/cluster/n0"), b = round_crcs(dir + "/cluster/n1");
  CATCH_CHECK(a.size() == 6);
  CATCH_CHECK(a == b);
  CATCH_CHECK_FALSE(contains(clog, "differs between nodes"));
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE("a slow link is named: the node before it waits to send, and its log and the report say so",
                "[process][cluster]") {
  const auto dir = scratch_dir("cluster_straggler");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1}, ports, "[metrics]\nenabled = false\n");
  // n0's ring frames leave at 200 kB/s (the fault decorator): about 0.75 s per all-reduce of the mechanics
  // model (394 kB of fp32 each way, after a 256 KiB burst), far more than the rest of a round.
  // A malformed value is refused before the node says hello: one line naming it, exit 2 (it aborted the node
  // once it had joined). No coordinator runs yet.
  auto typo = spawn({binary(), "node", cluster, "--node", "n0"}, dir + "/typo.log", false,
                    {"LONGWAVE_FAULT_RING_RATE=abc"});
  CATCH_CHECK(wait_exit(typo, 120) == 2);
  CATCH_CHECK(contains(read_text(dir + "/typo.log"),
                       "node n0: LONGWAVE_FAULT_RING_RATE=abc: want a positive number of bytes per second"));
  auto [coord, nodes] = start_cluster(dir, cluster, 2, {{"LONGWAVE_FAULT_RING_RATE=200000"}});
  std::vector<int> codes;
  for (auto& n : nodes) codes.push_back(wait_exit(n, 600));
  CATCH_CHECK(wait_exit(coord, 60) == 0);
  const auto n0 = read_text(dir + "/n0.log"), n1 = read_text(dir + "/n1.log");
  CATCH_INFO(tail(n0));
  CATCH_CHECK(codes == std::vector<int>{0, 0});
  CATCH_CHECK(contains(n0, "LONGWAVE_FAULT_RING_RATE: ring frames leave at most 200000 bytes/s"));
  CATCH_CHECK(contains(n0,
                       "waiting for n1 to take this node's chunks: the link to it (or n1 itself) is the "
                       "ring's slowest"));
  CATCH_CHECK_FALSE(contains(n1, "to take this node's chunks"));
  CATCH_CHECK(contains(read_text(dir + "/cluster/n0/metrics.jsonl"), R"("next":"n1")"));
  auto [rcode, rlog] = run({binary(), "report", dir + "/cluster"}, dir + "/report.log", 120);
  CATCH_INFO(rlog);
  CATCH_CHECK(rcode == 0);
  const auto html = read_text(dir + "/cluster/report.html");
  CATCH_CHECK(contains(html, "slowest ring link"));
  CATCH_CHECK(contains(html, "n0 -&gt; n1 ("));
  CATCH_CHECK(contains(html, "n0&#39;s all-reduce time waiting to send)"));
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE(
    "the coordinator runs without LibTorch, and a node becomes longwave-torch in the same process",
    "[process][cluster]") {
  const auto dir = scratch_dir("cluster_front");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1}, ports, "[metrics]\nenabled = false\n");
  edit_file(cluster, "join_timeout_s = ", "min_nodes = 2\njoin_timeout_s = ");
  auto coord = spawn({binary(), "coordinator", cluster}, dir + "/coord.log");
  CATCH_REQUIRE(wait_for_text(dir + "/coord.log", "coordinator: event log", 60));
  const auto maps = read_text("/proc/" + std::to_string(coord.pid) + "/maps");
  CATCH_CHECK(contains(maps, "libzmq"));
  CATCH_CHECK(!contains(maps, "libtorch"));
  // n0 waits at the start for n1 (min_nodes = 2), so it is alive while its executable is read.
  auto n0 = spawn({binary(), "node", cluster, "--node", "n0"}, dir + "/n0.log");
  const auto exe_of = [](pid_t pid) {
    std::error_code ec;
    return fs::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec).filename().string();
  };
  CATCH_CHECK(wait_until([&] { return exe_of(n0.pid) == "longwave-torch"; }, 60));
  auto n1 = spawn({binary(), "node", cluster, "--node", "n1"}, dir + "/n1.log");
  CATCH_CHECK(wait_exit(n0, 300) == 0);
  CATCH_CHECK(wait_exit(n1, 300) == 0);
  CATCH_CHECK(wait_exit(coord, 60) == 0);
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}
