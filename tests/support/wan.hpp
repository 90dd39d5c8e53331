#pragma once
// Test helpers for clusters across network namespaces (scripts/wan): hosts brought up for a test's lifetime
// and always torn down, commands run inside one host, and the skip where namespaces cannot be made.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/support/process.hpp"

namespace longwave::test {

inline int shell(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/// Brings the namespaces up for the test's lifetime and always tears them down. `tag` starts the namespace
/// names, followed by the test's pid.
struct wan_hosts {
  std::string prefix;
  wan_hosts(int n, const std::string& rate, const std::string& tag = "lwt")
      : prefix(tag + std::to_string(getpid())) {
    // The harness's defaults, whatever the caller's environment says.
    const int rc = shell("env -u LONGWAVE_WAN_CC -u LONGWAVE_WAN_SNDBUF LONGWAVE_WAN_PREFIX=" + prefix + " " +
                         LW_SOURCE_DIR "/scripts/wan up " + std::to_string(n) + " " + rate + " >/dev/null");
    if (rc != 0) throw std::runtime_error("scripts/wan up failed with " + std::to_string(rc));
  }
  ~wan_hosts() { shell("LONGWAVE_WAN_PREFIX=" + prefix + " " LW_SOURCE_DIR "/scripts/wan down"); }
  wan_hosts(const wan_hosts&) = delete;
  wan_hosts& operator=(const wan_hosts&) = delete;
  /// args run inside host `host`'s namespace (`ip netns exec` and env exec them: the pid stays the same).
  std::vector<std::string> in(int host, std::vector<std::string> args) const {
    args.insert(args.begin(), {"/usr/bin/env", "ip", "netns", "exec", prefix + "-h" + std::to_string(host)});
    return args;
  }
};

/// Host i's address (scripts/wan addr).
inline std::string wan_addr(int i) {
  return "10.213.0." + std::to_string(10 + i);
}

/// Writes dir/cluster.toml and returns its path: `n` nodes "n0".."n{n-1}", node i on host i and the
/// coordinator on host 0, training the tiny model (one thread per worker, fp32 all-reduces, no evaluation,
/// no metrics server) for `rounds` x `inner_steps`, out_dir dir/run; `cluster_keys` (lines) go into
/// [cluster].
inline std::string wan_cluster_file(const std::string& dir, const std::string& id, int n, int64_t rounds,
                                    int64_t inner_steps, const std::string& cluster_keys = "") {
  std::string text = "[cluster]\nid = \"" + id + "\"\ncoordinator = \"tcp://" + wan_addr(0) +
                     ":5600\"\njoin_timeout_s = 60\n" + cluster_keys;
  for (int i = 0; i < n; ++i)
    text +=
        "[[nodes]]\nname = \"n" + std::to_string(i) + "\"\nendpoint = \"tcp://" + wan_addr(i) + ":5601\"\n";
  text += "[run]\nout_dir = \"" + dir + "/run\"\n[train]\nrounds = " + std::to_string(rounds) +
          "\ninner_steps = " + std::to_string(inner_steps) + R"(
batch_size = 4
warmup_steps = 3
threads = 1
[model]
seq_len = 64
[eval]
every_rounds = 0
batches = 2
[metrics]
enabled = false
[comm]
dtype = "fp32"
)" + curve_keys(dir);
  const auto path = dir + "/cluster.toml";
  std::ofstream(path) << text;
  return path;
}

/// Where network namespaces cannot be made (no root, ip or tc), prints the line ctest reports as skipped and
/// ends the test binary.
inline void skip_without_namespaces() {
  if (shell(LW_SOURCE_DIR "/scripts/wan check") == 0) return;
  std::printf(
      "LONGWAVE_TEST_SKIPPED: scripts/wan check: network namespaces cannot be created here "
      "(needs root, ip, tc)\n");
  std::fflush(stdout);
  std::_Exit(0);
}

}  // namespace longwave::test
