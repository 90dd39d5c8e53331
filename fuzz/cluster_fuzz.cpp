// libFuzzer target: a cluster file (config::parse_cluster): [cluster], [[nodes]] and the training config they
// share. It throws config_error and nothing else.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "config/cluster_config.hpp"
#include "config/config_loader.hpp"
#include "fuzz/fuzz_seeds.hpp"

using namespace longwave::config;

namespace {

void write_seeds(const std::string& dir) {
  longwave::fuzz::write_seed(
      dir, "cluster_4nodes.toml",
      longwave::fuzz::read_file(std::string(LW_SOURCE_DIR) + "/examples/cluster_4nodes.toml"));
}

}  // namespace

LW_FUZZ_INITIALIZE(write_seeds)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto spec = parse_cluster(text, {}, "fuzz.toml");
    for (size_t i = 0; i < spec.nodes.size(); ++i) (void)node_config(spec, i);
  } catch (const config_error& e) {
  }
  return 0;
}
