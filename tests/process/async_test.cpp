// diloco.outer = "async" across real processes on loopback: nodes of different paced speeds, the master's
// merges, and one theta per version on every node. Assertions are on records (which node a merge took, the
// CRC each node wrote per version), never on durations.
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "tests/support/cluster.hpp"
#include "tests/support/process.hpp"

using namespace longwave;
using namespace longwave::test;
namespace fs = std::filesystem;

namespace {

/// Four one-worker nodes; n3 paces its steps 20x slower than the others (1 s against 0.05 s): one phase of
/// n3 spans many of theirs whatever the machine's speed, since pacing is a lower bound on a step's time.
std::string slow_node_cluster(const std::string& dir, cluster_ports& ports, int64_t versions) {
  const auto cluster = cluster_file(dir, {1, 1, 1, 1}, ports,
                                    "[metrics]\nenabled = false\n[diloco]\nouter = \"async\"\n"
                                    "[async]\nquorum = 1\ngrace_min_s = 0\ngrace_max_s = 0.5\n"
                                    "max_staleness = 1000\n");
  edit_file(cluster, "rounds = 3", "rounds = " + std::to_string(versions));
  edit_file(cluster, "threads = 1", "threads = 1\npace_step_s = 0.05");
  edit_file(cluster, "name = \"n3\"", "name = \"n3\"\nspeed = 0.05");
  return cluster;
}

}  // namespace

CATCH_TEST_CASE("async: merges go on without a slow node, and every node holds one theta per version",
                "[process][cluster][async]") {
  const auto dir = scratch_dir("async_slow");
  cluster_ports ports;
  const int64_t versions = 6;
  const auto cluster = slow_node_cluster(dir, ports, versions);
  auto [code, log] = run({binary(), "launch", cluster}, dir + "/launch.log", 600);
  CATCH_INFO(log);
  CATCH_REQUIRE(code == 0);
  check_master_end(dir + "/cluster", "finished", "n0,n1,n2,n3", "");

  // The master's merges: consecutive versions from 1, the first made before n3's first phase could end.
  const auto merges = master_records(dir + "/cluster", "merge");
  CATCH_REQUIRE(merges.size() >= static_cast<size_t>(versions));
  for (size_t i = 0; i < merges.size(); ++i)
    CATCH_CHECK(at(merges[i], "version").GetInt64() == int64_t(i + 1));
  CATCH_CHECK(str(at(merges[0], "nodes")).find("n3") == std::string::npos);

  // Every node applied versions 1..6 and wrote theta's CRC for each: the same on all four.
  std::map<int64_t, std::set<std::string>> crcs;
  for (const std::string node : {"n0", "n1", "n2", "n3"}) {
    std::set<int64_t> seen;
    for (const auto& r : records_of(dir + "/cluster/" + node)) {
      if (std::string(r["kind"].GetString()) != "version") continue;
      seen.insert(at(r, "version").GetInt64());
      crcs[at(r, "version").GetInt64()].insert(str(at(r, "theta_crc32c")));
    }
    CATCH_INFO("node " << node);
    CATCH_CHECK(seen.size() == static_cast<size_t>(versions));
    CATCH_CHECK(*seen.begin() == 1);
    CATCH_CHECK(*seen.rbegin() == versions);
  }
  for (const auto& [v, set] : crcs) {
    CATCH_INFO("version " << v);
    CATCH_CHECK(set.size() == 1);
  }
  // Versions differ from each other (the merges moved theta), and the run ends with one model everywhere.
  CATCH_CHECK(*crcs[1].begin() != *crcs[versions].begin());
  const auto a = newest_theta(dir + "/cluster/n0/checkpoints");
  for (const std::string node : {"n1", "n2", "n3"})
    CATCH_CHECK(max_abs_diff(a, newest_theta(dir + "/cluster/" + node + "/checkpoints")) == 0.0);
  CATCH_CHECK(contains(log, "async: version 6 is the last"));
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}
