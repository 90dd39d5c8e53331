// libFuzzer target: runtime::checkpoint_from_bytes, the state a joiner downloads from the members. A state
// that reads back must write out to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fuzz/fuzz_seeds.hpp"
#include "runtime/checkpoint/checkpoint_bytes.hpp"
#include "runtime/errors/errors.hpp"

using namespace longwave::runtime;

namespace {

checkpoint sample() {
  static const std::vector<float> theta = {0.5f, -1.25f, 3.0f, 1e-3f};
  static const std::vector<float> moment = {0.f, 1.f};
  checkpoint c;
  c.round = 12;
  c.step = 1200;
  c.meta = "run.name=fuzz\ntrain.workers=2\n";
  c.blobs.push_back({"theta_global", nullptr, theta.data(), theta.size() * sizeof(float), {}});
  c.blobs.push_back({"worker0/exp_avg", nullptr, moment.data(), moment.size() * sizeof(float), {}});
  c.blobs.push_back({"empty", nullptr, nullptr, 0, {}});
  return c;
}

void write_seeds(const std::string& dir) {
  const auto bytes = checkpoint_to_bytes(sample());
  longwave::fuzz::write_seed(dir, "state_3_blobs", bytes.data(), bytes.size());
  checkpoint none;
  const auto empty = checkpoint_to_bytes(none);
  longwave::fuzz::write_seed(dir, "state_no_blobs", empty.data(), empty.size());
}

}  // namespace

LW_FUZZ_INITIALIZE(write_seeds)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* b = reinterpret_cast<const std::byte*>(data);
  const std::vector<std::byte> in(b, b + size);
  checkpoint c;
  try {
    c = checkpoint_from_bytes(in);
  } catch (const longwave::lw_error& e) {
    if (e.code() != longwave::errc::corrupt_checkpoint)
      longwave::fuzz::fail("not a corrupt_checkpoint error");
    return 0;
  }
  if (checkpoint_to_bytes(c) != in) longwave::fuzz::fail("a state that read back writes out differently");
  return 0;
}
