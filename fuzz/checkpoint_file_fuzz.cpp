// libFuzzer target: a checkpoint file on disk (checkpoint_store::load_file), as a restarted node reads it.
// Each input is written to one temporary file of this process and loaded from there.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "fuzz/fuzz_seeds.hpp"
#include "runtime/checkpoint/checkpoint_store.hpp"
#include "runtime/errors/errors.hpp"

using namespace longwave::runtime;

namespace {

std::string scratch;  // this process's input file

// Memory-backed when there is /dev/shm: the target then runs about as fast as the parser allows.
std::filesystem::path scratch_dir() {
  std::error_code ec;
  if (std::filesystem::is_directory("/dev/shm", ec)) return "/dev/shm";
  return std::filesystem::temp_directory_path();
}

void write_seeds(const std::string& dir) {
  static const std::vector<float> theta = {0.5f, -1.25f, 3.0f, 1e-3f};
  const auto tmp = std::filesystem::temp_directory_path() / ("lw_fuzz_ckpt_" + std::to_string(getpid()));
  checkpoint_store store(tmp.string(), 2);
  checkpoint c;
  c.round = 3;
  c.step = 300;
  c.meta = "run.name=fuzz\n";
  c.blobs.push_back({"theta_global", nullptr, theta.data(), theta.size() * sizeof(float), {}});
  c.blobs.push_back({"outer/momentum", nullptr, theta.data(), 2 * sizeof(float), {}});
  const auto path = store.write(c);
  std::filesystem::copy_file(path, dir + "/ckpt_2_blobs.lwc",
                             std::filesystem::copy_options::overwrite_existing);
  checkpoint none;
  none.round = 1;
  const auto empty = store.write(none);
  std::filesystem::copy_file(empty, dir + "/ckpt_no_blobs.lwc",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::remove_all(tmp);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  longwave::fuzz::seeds_mode(write_seeds);
  scratch = (scratch_dir() / ("lw_fuzz_ckpt_" + std::to_string(getpid()) + ".lwc")).string();
  std::atexit([] { std::filesystem::remove(scratch); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream f(scratch, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    (void)checkpoint_store::load_file(scratch);
  } catch (const longwave::lw_error& e) {
    if (e.code() != longwave::errc::corrupt_checkpoint)
      longwave::fuzz::fail("not a corrupt_checkpoint error");
  }
  return 0;
}
