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

/// The GPU's dense bf16 peak in FLOP/s, from its name (H100 SXM and H200 989e12, H100 PCIe 756e12, A100
/// 312e12, L40S 362e12, L4 121e12); 0 for a GPU not in the table, or none.
double dense_bf16_peak_flops(int device_index);

/// GPU time of a span of work on one device, from two CUDA events on its current stream: start() and stop()
/// queue them (no synchronisation); seconds() waits for the stop event. Without CUDA it measures nothing
/// (seconds() is -1).
class gpu_timer {
 public:
  explicit gpu_timer(int device_index);
  ~gpu_timer();
  gpu_timer(const gpu_timer&) = delete;
  gpu_timer& operator=(const gpu_timer&) = delete;
  void start();
  void stop();
  double seconds();

 private:
  int device_;
  void* start_ = nullptr;  // cudaEvent_t
  void* stop_ = nullptr;
};

}  // namespace longwave::models
