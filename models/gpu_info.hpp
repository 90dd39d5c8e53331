#pragma once
// What a CUDA build reports of its GPUs: names, the driver and CUDA versions, and the caching allocator's
// memory figures. A CPU build (Debian's LibTorch) answers "no GPU" and zeros, so callers need no #if.
#include <cstdint>
#include <string>

namespace longwave::models {

/// "NVIDIA H200 (139.8 GiB), driver 580.159, CUDA 13.0" per visible GPU and the versions, or
/// "no CUDA in this LibTorch" / "CUDA 13.0, no GPU visible".
std::string gpu_summary();

/// The caching allocator's bytes on one GPU: allocated now, reserved from the driver now, and the peak
/// allocated since the process started (or the last reset_gpu_peak).
struct gpu_memory {
  int64_t allocated = 0, reserved = 0, peak = 0;
};
gpu_memory memory_of_gpu(int device_index);
void reset_gpu_peak(int device_index);

/// The GPU's total memory in bytes (0 without one).
int64_t gpu_total_memory(int device_index);

}  // namespace longwave::models
