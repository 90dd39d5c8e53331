// Every policy three rounds with a GPU node beside a CPU node (issue 38): n0's two workers share the GPU
// (LW_TEST_DEVICE, e.g. cuda:0; where they average on it: sync, delayed, streaming, client sampling), n1
// trains on the CPU, and both hold the same theta every round. ddp runs in one process on the GPU. Skipped
// without LW_TEST_DEVICE naming a CUDA device (scripts/gpu-check sets it).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "tests/support/cluster.hpp"
#include "tests/support/process.hpp"

using namespace longwave::test;
namespace fs = std::filesystem;

namespace {

/// The CUDA device under test, or "" (the test is then skipped).
std::string cuda_device() {
  const char* d = std::getenv("LW_TEST_DEVICE");
  const std::string s = d == nullptr ? "" : d;
  return s.rfind("cuda", 0) == 0 ? s : "";
}

}  // namespace

CATCH_TEST_CASE("every policy runs three rounds on a GPU node beside a CPU node, one theta on both",
                "[gpu][process][cluster]") {
  const auto device = cuda_device();
  if (device.empty()) {
    std::cout << "LONGWAVE_TEST_SKIPPED: LW_TEST_DEVICE names no CUDA device\n";
    return;
  }
  struct policy {
    std::string name, settings;
    bool same_theta;  // eager's replicas keep outer parameters of their own: θ_global is their mean per node
  };
  const std::vector<policy> policies{
      {"sync", "[diloco]\nouter = \"sync\"\n", true},
      {"delayed", "[diloco]\nouter = \"delayed\"\n", true},
      {"eager", "[diloco]\nouter = \"eager\"\n", false},
      {"streaming", "[diloco]\nouter = \"streaming\"\nfragments = 2\ntau = 1\n", true},
      {"photon", "[federated]\nclients_per_round = 2\n", true},
  };
  for (const auto& p : policies) {
    CATCH_INFO("policy " << p.name);
    const auto dir = scratch_dir("gpu_policy_" + p.name);
    cluster_ports ports;
    const auto cluster = cluster_file(dir, {2, 1}, ports, "[metrics]\nenabled = false\n" + p.settings);
    // n0 on the GPU: its [[nodes]] entry names the device.
    edit_file(cluster, "workers = 2\n", "workers = 2\ndevice = \"" + device + "\"\n");
    if (p.name == "streaming") edit_file(cluster, "inner_steps = 3", "inner_steps = 4");  // a multiple of P
    auto [coord, nodes] = start_cluster(dir, cluster, 2);
    std::vector<int> codes;
    for (auto& n : nodes) codes.push_back(wait_exit(n, 300));
    const int coord_code = wait_exit(coord, 60);
    const auto n0 = read_text(dir + "/n0.log");
    CATCH_INFO(tail(read_text(dir + "/coord.log")) << "\n--- n0\n"
                                                   << tail(n0) << "\n--- n1\n"
                                                   << tail(read_text(dir + "/n1.log")));
    CATCH_CHECK(codes == std::vector<int>{0, 0});
    CATCH_CHECK(coord_code == 0);
    CATCH_CHECK(contains(n0, device));  // the device plan names n0's GPU
    const auto a = round_crcs(dir + "/cluster/n0"), b = round_crcs(dir + "/cluster/n1");
    CATCH_CHECK(a.size() == 3);
    if (p.same_theta) CATCH_CHECK(a == b);
    fs::remove_all(dir);
  }

  // ddp in one process: its gradient crosses to the host every step.
  const auto dir = scratch_dir("gpu_policy_ddp");
  const auto config = dir + "/ddp.toml";
  write_text(config, "[run]\nmode = \"ddp\"\nout_dir = \"" + dir + "/run\"\nseed = 7\n" +
                         cluster_train_sections + "[metrics]\nenabled = false\n");
  edit_file(config, "[train]\n", "[train]\nworkers = 2\ndevice = \"" + device + "\"\n");
  auto [code, log] = run({binary(), "run", config}, dir + "/ddp.log", 300);
  CATCH_INFO(tail(log));
  CATCH_CHECK(code == 0);
  CATCH_CHECK(fs::exists(dir + "/run/result.json"));
  fs::remove_all(dir);
}
