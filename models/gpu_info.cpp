// GPU facts through c10's CUDA layer, compiled only in the cuda build (LONGWAVE_CUDA_BUILD).
#include "models/gpu_info.hpp"

#include <fmt/format.h>

#ifdef LONGWAVE_CUDA_BUILD
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace longwave::models {

#ifdef LONGWAVE_CUDA_BUILD

namespace {
std::string version_text(int v) {  // CUDA's 13000 -> "13.0"
  return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}
}  // namespace

std::string gpu_summary() {
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  const int n = static_cast<int>(c10::cuda::device_count());
  std::string out;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out += fmt::format("{}cuda:{} {} ({:.1f} GiB, sm_{}{})", out.empty() ? "" : "; ", i, p.name,
                       static_cast<double>(p.totalGlobalMem) / (1 << 30), p.major, p.minor);
  }
  if (out.empty()) out = "no GPU visible";
  return fmt::format("{}; driver CUDA {}, runtime CUDA {}", out, version_text(driver), version_text(runtime));
}

gpu_memory memory_of_gpu(int device_index) {
  const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device_index));
  constexpr size_t all = 0;  // StatType::AGGREGATE
  return {s.allocated_bytes[all].current, s.reserved_bytes[all].current, s.allocated_bytes[all].peak};
}

void reset_gpu_peak(int device_index) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device_index));
}

int64_t gpu_total_memory(int device_index) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device_index) != cudaSuccess) return 0;
  return static_cast<int64_t>(p.totalGlobalMem);
}

#else

std::string gpu_summary() {
  return "no CUDA in this LibTorch";
}
gpu_memory memory_of_gpu(int) {
  return {};
}
void reset_gpu_peak(int) {}
int64_t gpu_total_memory(int) {
  return 0;
}

#endif

}  // namespace longwave::models
