#pragma once
// The seeds mode every fuzz target has: with LW_FUZZ_SEEDS=DIR in the environment it writes real frames or
// files, made by the code under test, into DIR and exits instead of fuzzing (bench/fuzz.sh, fuzz/corpus/).
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

namespace longwave::fuzz {

/// Writes one seed file DIR/name.
inline void write_seed(const std::string& dir, const std::string& name, const void* data, size_t size) {
  std::ofstream f(dir + "/" + name, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!f) {
    std::fprintf(stderr, "fuzz: cannot write %s/%s\n", dir.c_str(), name.c_str());
    std::exit(1);
  }
}

inline void write_seed(const std::string& dir, const std::string& name, std::string_view text) {
  write_seed(dir, name, text.data(), text.size());
}

/// The bytes of a file made by the code under test or checked in (examples/), for a seed.
inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  if (!f) {
    std::fprintf(stderr, "fuzz: cannot read %s\n", path.c_str());
    std::exit(1);
  }
  return s.str();
}

/// Call from LLVMFuzzerInitialize: in the seeds mode, write(dir) and exit 0; otherwise return.
template <class Write>
void seeds_mode(Write&& write) {
  const char* dir = std::getenv("LW_FUZZ_SEEDS");
  if (!dir || !*dir) return;
  std::filesystem::create_directories(dir);
  write(std::string(dir));
  std::exit(0);
}

/// Stops the run as a crash (a broken property, not a sanitizer report): libFuzzer keeps the input.
[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "fuzz: property broken: %s\n", what);
  std::abort();
}

}  // namespace longwave::fuzz

/// Defines LLVMFuzzerInitialize for a target that needs nothing else at start: its seeds mode writes with
/// `write` (a function of the seed folder).
#define LW_FUZZ_INITIALIZE(write)                      \
  extern "C" int LLVMFuzzerInitialize(int*, char***) { \
    longwave::fuzz::seeds_mode(write);                 \
    return 0;                                          \
  }
