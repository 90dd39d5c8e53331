// libFuzzer target: a training config file (config::parse_config). It throws config_error and nothing else;
// a config that parses must come back unchanged through to_toml.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "config/config_loader.hpp"
#include "fuzz/fuzz_seeds.hpp"

using namespace longwave::config;

namespace {

void write_seeds(const std::string& dir) {
  for (const char* name : {"baseline_ddp.toml", "baseline_single.toml", "local_diloco.toml"})
    longwave::fuzz::write_seed(dir, name,
                               longwave::fuzz::read_file(std::string(LW_SOURCE_DIR) + "/examples/" + name));
  longwave::fuzz::write_seed(dir, "defaults.toml", to_toml(parse_config("", {}, "defaults")));
}

}  // namespace

LW_FUZZ_INITIALIZE(write_seeds)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string once;
  try {
    once = to_toml(parse_config(text, {}, "fuzz.toml"));
  } catch (const config_error& e) {
    return 0;
  }
  try {
    if (to_toml(parse_config(once, {}, "again.toml")) != once)
      longwave::fuzz::fail("a config changed through to_toml");
  } catch (const config_error& e) {
    longwave::fuzz::fail("a config that parsed does not parse again after to_toml");
  }
  return 0;
}
