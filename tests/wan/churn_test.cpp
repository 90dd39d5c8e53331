// Churn (issue 20): a 4-node cluster across network namespaces at 100 Mbit/s in which a seeded random
// schedule SIGKILLs a training node once every node's current life has trained 2 rounds, and starts it again
// with the same command at once or once the coordinator has removed it, so that it rejoins the running
// cluster; 3 such cycles, paced by records, not by the clock (issue 35). Then the cluster is stopped:
// everyone exits 0, agrees on theta every round, no round stalls beyond the failure detector's time, and the
// loss goes down. Needs root and iproute2: without them it prints LONGWAVE_TEST_SKIPPED and ctest reports it
// skipped.
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/cluster.hpp"
#include "tests/support/json.hpp"
#include "tests/support/process.hpp"
#include "tests/support/wan.hpp"

using namespace longwave::test;

namespace {

constexpr int n_nodes = 4;
constexpr int cycles_wanted = 3;
constexpr double heartbeat_timeout_s = 6;  // [cluster] heartbeat_timeout_s's default, which the file keeps

/// One process the test started (`ip netns exec` and env exec it, so the pid is longwave's own), and its
/// exit code once reaped.
struct started {
  child c;
  int node = -1;        // -1: the coordinator
  int rounds_at_start;  // round records in the node's metrics.jsonl when this life began
  std::optional<int> code;
};

/// Every process the test started; the ones still running when it ends (a REQUIRE failed) are SIGKILLed and
/// reaped, by pid, before the namespaces go.
struct processes {
  std::vector<started> all;
  ~processes() {
    for (auto& p : all)
      if (!p.code) {
        kill(p.c.pid, SIGKILL);
        waitpid(p.c.pid, nullptr, 0);
      }
  }
  /// Reaps it if it has exited; true when it has.
  bool exited(started& p) {
    if (p.code) return true;
    int status = 0;
    if (waitpid(p.c.pid, &status, WNOHANG) != p.c.pid) return false;
    p.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return true;
  }
  int wait(started& p, double timeout_s) {
    if (!p.code) p.code = wait_exit(p.c, timeout_s);
    return *p.code;
  }
};

/// The records of one kind in a node's metrics.jsonl.
std::vector<rapidjson::Document> records(const std::string& out_dir, const std::string& kind) {
  auto all = records_of(out_dir);
  std::vector<rapidjson::Document> out;
  for (auto& r : all)
    if (r["kind"].GetString() == kind) out.push_back(std::move(r));
  return out;
}

/// The newest round a node has recorded, 0 before its first.
int64_t last_round(const std::string& out_dir) {
  const auto rounds = records(out_dir, "round");
  return rounds.empty() ? 0 : rounds.back()["round"].GetInt64();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

CATCH_TEST_CASE("churn: 4 nodes at 100 Mbit/s, one SIGKILLed and restarted 3 times, stopped on one theta",
                "[wan][cluster][elastic][churn]") {
  skip_without_namespaces();
  const char* seed_env = std::getenv("LONGWAVE_CHURN_SEED");
  const unsigned seed = seed_env && *seed_env ? static_cast<unsigned>(std::stoul(seed_env)) : 20;
  std::printf("churn: seed %u (LONGWAVE_CHURN_SEED)\n", seed);
  std::mt19937 rng(seed);
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };

  const auto dir = scratch_dir("churn");
  // A joiner fetches ~36 MB of state (theta, momentum, one worker's Adam state) at under 12.5 MB/s, ~4 s,
  // longer than a round of 15 inner steps: its first fetch is most often overtaken, and the members hold
  // at a round boundary while it fetches again (issue 37, fault 1).
  const auto file = wan_cluster_file(dir, "churn", n_nodes, endless_rounds, 15, "min_nodes = 2\n");
  auto out = [&](int node) { return dir + "/run/n" + std::to_string(node); };

  std::string prefix;
  {
    wan_hosts wan(n_nodes, "100mbit", "lwc");
    prefix = wan.prefix;
    processes procs;
    std::vector<int> lives(n_nodes, 0);
    std::vector<size_t> current(n_nodes);  // index in procs.all of each node's current life
    auto start_node = [&](int i) {
      const auto log = dir + "/n" + std::to_string(i) + "." + std::to_string(++lives[i]) + ".log";
      const int before = rounds_recorded(out(i));
      procs.all.push_back({spawn(wan.in(i, {binary(), "node", file, "--node", "n" + std::to_string(i)}), log),
                           i, before, std::nullopt});
      current[i] = procs.all.size() - 1;
    };
    procs.all.push_back({spawn(wan.in(0, {binary(), "coordinator", file}), dir + "/coord.log"), -1, 0, {}});
    for (int i = 0; i < n_nodes; ++i) start_node(i);
    auto logs = [&] {
      std::string s = "--- coordinator\n" + read_text(dir + "/coord.log");
      for (const auto& p : procs.all)
        if (p.node >= 0) s += "\n--- " + p.c.log + "\n" + tail(read_text(p.c.log), 3000);
      return s;
    };
    // An early exit of the coordinator or a node's current life fails the test here, with the logs.
    auto none_died = [&] {
      if (procs.exited(procs.all[0])) return false;
      for (int i = 0; i < n_nodes; ++i)
        if (procs.exited(procs.all[current[i]])) return false;
      return true;
    };
    CATCH_REQUIRE(wait_until(
        [&] {
          for (int i = 0; i < n_nodes; ++i)
            if (rounds_recorded(out(i)) < 1) return false;
          return true;
        },
        120));
    CATCH_REQUIRE(none_died());

    // Every node's current life has trained 2 rounds (a restarted one: admitted and training), or a role
    // died (then the test fails with the logs).
    std::string schedule;
    auto all_trained = [&] {
      const bool ok = wait_until(
          [&] {
            if (!none_died()) return true;
            for (int i = 0; i < n_nodes; ++i)
              if (rounds_recorded(out(i)) < procs.all[current[i]].rounds_at_start + 2) return false;
            return true;
          },
          900);
      CATCH_INFO(schedule << logs());
      CATCH_REQUIRE(ok);
      CATCH_REQUIRE(none_died());
    };
    // The schedule: once all have trained 2 rounds, a seeded victim is SIGKILLed and started again at once
    // or once the coordinator has removed it.
    int cycles = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (; cycles < cycles_wanted; ++cycles) {
      all_trained();
      const int victim = std::uniform_int_distribution<int>(0, n_nodes - 1)(rng);
      const bool at_once = uniform(0, 1) < 0.5;
      // The coordinator's "removed" records of the victim (its event log).
      auto removals = [&] {
        size_t n = 0;
        for (const auto& r : master_records(dir + "/run", "removed"))
          n += str(at(r, "node")) == "n" + std::to_string(victim);
        return n;
      };
      const size_t removed_before = removals();
      int64_t progress = 0;
      for (int i = 0; i < n_nodes; ++i) progress = std::max(progress, last_round(out(i)));
      kill(procs.all[current[victim]].c.pid, SIGKILL);
      CATCH_REQUIRE(procs.wait(procs.all[current[victim]], 30) == 128 + SIGKILL);
      if (!at_once) CATCH_REQUIRE(wait_until([&] { return removals() > removed_before; }, 120));
      start_node(victim);
      char line[160];
      std::snprintf(line, sizeof line, "%.1f s: SIGKILL n%d after round %lld, started again %s\n",
                    seconds_since(t0), victim, static_cast<long long>(progress),
                    at_once ? "at once" : "once the coordinator removed it");
      schedule += line;
      std::printf("churn: %s", line);
      std::fflush(stdout);
    }
    // The last restarted life trains with the others, then the cluster is stopped.
    all_trained();
    stop_cluster(dir, file, [&](std::vector<std::string> cmd) { return wan.in(0, std::move(cmd)); });

    // Everyone stops: the nodes' last lives and the coordinator exit 0.
    std::map<std::string, int> codes;
    for (auto& p : procs.all)
      if (p.node >= 0 && !p.code) codes[p.c.log] = procs.wait(p, 300);
    codes[procs.all[0].c.log] = procs.wait(procs.all[0], 60);
    const auto clog = read_text(dir + "/coord.log");
    CATCH_INFO(schedule << logs());
    for (const auto& [log, code] : codes) {
      CATCH_INFO(log);
      CATCH_CHECK(code == 0);
    }
    CATCH_CHECK(contains(clog, "every node stopped after round"));
    const int64_t rounds = stop_round(out(0));
    CATCH_REQUIRE(rounds > 0);
    const auto end = master_end(dir + "/run");  // the coordinator's event log agrees
    CATCH_CHECK(str(at(end, "outcome")) == "stopped");
    CATCH_CHECK(at(end, "stop_round").GetInt64() == rounds);
    // Every restarted life was admitted into the running cluster: it recorded how it got the state.
    int recovered = 0;
    for (int i = 0; i < n_nodes; ++i) {
      CATCH_INFO("n" << i << " lived " << lives[i] << " times");
      CATCH_CHECK(record_count(out(i), "recovery") == lives[i] - 1);
      recovered += record_count(out(i), "recovery");
    }
    CATCH_CHECK(recovered == cycles);
    for (const auto& p : procs.all)
      if (p.node >= 0 && p.c.log.substr(p.c.log.size() - 6) != ".1.log")
        std::printf("churn: %s: %zu stale fetch(es) before it was admitted\n", p.c.log.c_str(),
                    occurrences(read_text(p.c.log), "fetch again (attempt"));

    // For every round, every node that recorded it has the same theta; each round was recorded by at least
    // min_nodes of them, and every node recorded the last.
    std::map<int64_t, std::map<std::string, std::string>> crcs;  // round -> node -> crc
    for (int i = 0; i < n_nodes; ++i)
      for (const auto& [round, crc] : round_crcs(out(i))) crcs[round]["n" + std::to_string(i)] = crc;
    CATCH_CHECK(crcs.size() == static_cast<size_t>(rounds));
    for (const auto& [round, by_node] : crcs) {
      std::string seen;
      for (const auto& [node, crc] : by_node) seen += " " + node + "=" + crc;
      CATCH_INFO("round " << round << ":" << seen);
      CATCH_CHECK(by_node.size() >= 2);
      for (const auto& [node, crc] : by_node) CATCH_CHECK(crc == by_node.begin()->second);
      if (round == rounds) CATCH_CHECK(by_node.size() == static_cast<size_t>(n_nodes));
    }

    // No round stalls. A round ends when the first node records it (they all apply the same average at the
    // same time); its duration is from the previous round's end. A round in which a node died waits for the
    // failure detector (at most heartbeat_timeout_s; a neighbour's ring report makes it ~2.5 s) and then
    // redoes the all-reduce; a join adds a fence. So no round may take longer than heartbeat_timeout_s plus
    // twice the median round (which holds one compute phase and one all-reduce): that covers the detector,
    // the redone all-reduce and a fence, and the round's own compute with 2 cores shared by 4 nodes and a
    // joiner's start-up.
    std::map<int64_t, double> ends;
    for (int i = 0; i < n_nodes; ++i)
      for (const auto& r : records(out(i), "round")) {
        const int64_t round = r["round"].GetInt64();
        const double ts = r["ts"].GetDouble();
        ends[round] = ends.count(round) ? std::min(ends[round], ts) : ts;
      }
    std::map<int64_t, double> durations;
    for (const auto& [round, ts] : ends)
      if (ends.count(round - 1)) durations[round] = ts - ends[round - 1];
    std::vector<double> all;
    for (const auto& [round, d] : durations) all.push_back(d);
    const double med = median(all), bound = heartbeat_timeout_s + 2 * med;
    std::string table;
    for (const auto& [round, d] : durations) {
      char entry[32];
      std::snprintf(entry, sizeof entry, " %lld:%.1f", static_cast<long long>(round), d);
      table += entry;
    }
    std::printf("churn: %d kill/restart cycles; round times: median %.2f s, longest %.2f s, bound %.2f s\n",
                cycles, med, all.empty() ? 0.0 : *std::max_element(all.begin(), all.end()), bound);
    std::printf("churn: round durations (s):%s\n", table.c_str());
    CATCH_CHECK(durations.size() == static_cast<size_t>(rounds - 1));
    for (const auto& [round, d] : durations) {
      CATCH_INFO("round " << round << " took " << d << " s; bound " << bound << " s");
      CATCH_CHECK(d <= bound);
    }

    // The loss went down: the mean training loss over every node's steps of the first round vs of the last.
    std::map<int64_t, std::pair<double, int>> loss;  // round -> (sum, count)
    for (int i = 0; i < n_nodes; ++i)
      for (const auto& s : records(out(i), "step"))
        if (s["loss"].IsNumber()) {
          auto& [sum, k] = loss[s["round"].GetInt64()];
          sum += s["loss"].GetDouble();
          ++k;
        }
    CATCH_REQUIRE(loss.count(1));
    CATCH_REQUIRE(loss.count(rounds));
    const double first = loss[1].first / loss[1].second, last = loss[rounds].first / loss[rounds].second;
    std::printf("churn: mean train loss %.3f in round 1, %.3f in round %lld\n", first, last,
                static_cast<long long>(rounds));
    CATCH_CHECK(last < 0.8 * first);
  }
  // Every process was reaped (processes' destructor), and the namespaces are gone.
  CATCH_CHECK(shell("ip netns list | grep -q '^" + prefix + "-'") != 0);
  std::filesystem::remove_all(dir);  // kept only when a REQUIRE stopped the test
}
