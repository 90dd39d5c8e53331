// GPU facts through c10's CUDA layer, compiled only in the cuda build (LONGWAVE_CUDA_BUILD).
#include "models/gpu_info.hpp"

#include <fmt/format.h>

#ifdef LONGWAVE_CUDA_BUILD
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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

namespace {
double peak_of(int device_index) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device_index) != cudaSuccess) return 0;
  const std::string name = p.name;
  // The first entry whose text the name holds, so "H100 PCIe" comes before "H100".
  static const std::vector<std::pair<std::string, double>> table{
      {"H100 PCIe", 756e12}, {"H100", 989e12}, {"H200", 989e12}, {"GH200", 989e12},
      {"A100", 312e12},      {"L40S", 362e12}, {"L4", 121e12}};
  for (const auto& [part, flops] : table)
    if (name.find(part) != std::string::npos) return flops;
  return 0;
}
}  // namespace

double dense_bf16_peak_flops(int device_index) {
  // Asked at every GPU worker's step: the driver is asked once per device.
  static std::mutex mu;
  static std::map<int, double> known;
  const std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(device_index);
  return it != known.end() ? it->second : known[device_index] = peak_of(device_index);
}

gpu_timer::gpu_timer(int device_index) : device_(device_index) {
  const c10::cuda::CUDAGuard on(static_cast<c10::DeviceIndex>(device_));  // recorded on that device's stream
  cudaEvent_t a = nullptr, b = nullptr;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  start_ = a, stop_ = b;
}

gpu_timer::~gpu_timer() {
  if (start_) cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  if (stop_) cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

namespace {

/// Records `event` on `device`'s current stream, with that device current: the default stream's handle is
/// null, which names the current device's.
void record_on(int device, void* event) {
  const c10::cuda::CUDAGuard on(static_cast<c10::DeviceIndex>(device));
  const auto stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  const cudaError_t e = cudaEventRecord(static_cast<cudaEvent_t>(event), stream.stream());
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("gpu_timer: cudaEventRecord: ") + cudaGetErrorString(e));
}

}  // namespace

void gpu_timer::start() {
  record_on(device_, start_);
}

void gpu_timer::stop() {
  record_on(device_, stop_);
}

double gpu_timer::seconds() {
  float ms = 0;
  if (cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)) != cudaSuccess ||
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)) !=
          cudaSuccess)
    return -1;
  return static_cast<double>(ms) / 1e3;
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
double dense_bf16_peak_flops(int) {
  return 0;
}
gpu_timer::gpu_timer(int device_index) : device_(device_index) {}
gpu_timer::~gpu_timer() = default;
void gpu_timer::start() {}
void gpu_timer::stop() {}
double gpu_timer::seconds() {
  return -1;
}

#endif

}  // namespace longwave::models
