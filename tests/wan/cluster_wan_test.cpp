// A 4-node cluster across network namespaces whose links are limited to 100 Mbit/s by tc tbf (scripts/wan).
// Needs root and iproute2: without them it prints LONGWAVE_TEST_SKIPPED and ctest reports it skipped.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/process.hpp"
#include "tests/support/wan.hpp"

using namespace longwave::test;

CATCH_TEST_CASE("4 nodes in network namespaces at 100 Mbit/s train together", "[wan][cluster]") {
  skip_without_namespaces();
  const auto dir = scratch_dir("wan4");
  const int n = 4;
  const auto file = wan_cluster_file(dir, "wan4", n, 3, 5);

  wan_hosts wan(n, "100mbit");
  // Every host runs the harness's TCP settings, not the machine's (scripts/wan: bbr stalls on the tbf queues,
  // and a 4 MiB send buffer starves fast links while the sending thread is descheduled).
  // Read inside each host's namespace, whose /proc/sys holds the namespace's settings.
  auto read_in = [&](int host, const std::string& path) {
    return run(wan.in(host, {"cat", path}), dir + "/sysctl.log", 30).second;
  };
  for (int i = 0; i < n; ++i) {
    CATCH_INFO("host " << i);
    CATCH_CHECK(read_in(i, "/proc/sys/net/ipv4/tcp_congestion_control") == "reno\n");
    CATCH_CHECK(read_in(i, "/proc/sys/net/ipv4/tcp_wmem") == "4096\t16384\t16777216\n");
  }
  std::vector<child> roles;
  roles.push_back(spawn(wan.in(0, {binary(), "coordinator", file}), dir + "/coord.log"));
  for (int i = 0; i < n; ++i)
    roles.push_back(
        spawn(wan.in(i, {binary(), "node", file, "--node", "n" + std::to_string(i), "--log-level", "debug"}),
              dir + "/n" + std::to_string(i) + ".log"));
  std::vector<int> codes;
  for (auto& r : roles) codes.push_back(wait_exit(r, 900));
  for (size_t i = 0; i < roles.size(); ++i) {
    CATCH_INFO(roles[i].log << ":\n" << read_text(roles[i].log).substr(0, 6000));
    CATCH_CHECK(codes[i] == 0);
  }

  // Each all-reduce crossed the shaped links. A node's timer starts when it enters the round, so the node
  // that arrives last sees a shorter time; the round took as long as the longest one, and at that time no
  // node may have sent faster than 100 Mbit/s (plus tbf's burst).
  const std::regex line(R"(all-reduce of round (\d+): ([0-9.]+) s, (\d+) bytes sent)");
  std::map<int, double> longest, bytes_max;
  int lines = 0;
  for (int i = 0; i < n; ++i) {
    const auto log = read_text(dir + "/n" + std::to_string(i) + ".log");
    for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it) {
      const int round = std::stoi((*it)[1]);
      if (round == 0) continue;  // the fresh start's theta_0 from rank 0, in fp32
      longest[round] = std::max(longest[round], std::stod((*it)[2]));
      bytes_max[round] = std::max(bytes_max[round], std::stod((*it)[3]));
      ++lines;
    }
  }
  CATCH_CHECK(lines == n * 3);
  for (const auto& [round, secs] : longest) {
    const double mbit = bytes_max[round] * 8 / secs / 1e6;
    CATCH_INFO("round " << round << ": " << bytes_max[round] << " bytes per node in " << secs
                        << " s = " << mbit << " Mbit/s");
    CATCH_CHECK(bytes_max[round] > 1e6);
    CATCH_CHECK(mbit < 105);
    CATCH_CHECK(mbit > 20);  // and the ring kept the links reasonably busy
  }
  std::filesystem::remove_all(dir);  // kept only when a REQUIRE stopped the test
}
