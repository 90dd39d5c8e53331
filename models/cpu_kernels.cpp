#include "models/cpu_kernels.hpp"

#include <ATen/Version.h>
#include <dlfcn.h>

#include <torch/version.h>
#include <fstream>

namespace longwave::models {

namespace {

/// ATen prints its dispatch level only inside show_config(): "  - CPU capability usage: AVX2".
std::string aten_capability() {
  const std::string config = at::show_config();
  const std::string key = "CPU capability usage: ";
  const auto at = config.find(key);
  if (at == std::string::npos) return "unknown";
  const auto end = config.find('\n', at);
  return config.substr(at + key.size(), end == std::string::npos ? std::string::npos : end - at - key.size());
}

/// Looked up at run time: the BLAS behind libtorch is whatever Debian's alternatives point at.
std::string blas_core() {
  using corename_fn = char* (*)();
  const auto fn = reinterpret_cast<corename_fn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (fn == nullptr) return "BLAS unknown";
  const char* name = fn();
  return std::string("OpenBLAS ") + (name != nullptr ? name : "unknown");
}

/// /proc/cpuinfo's first "model name" (x86 Linux).
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  return "unknown CPU";
}

}  // namespace

std::string cpu_kernels() {
  return cpu_model() + ", LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." +
         std::to_string(TORCH_VERSION_MINOR) + ", ATen " + aten_capability() + ", " + blas_core();
}

}  // namespace longwave::models
