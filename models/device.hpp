#pragma once
// Where a process's workers run their inner steps (train.device) and in what precision (train.autocast):
// the plan is made once at start-up, from the setting and the GPUs this process sees.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/train_config.hpp"

namespace longwave::models {

/// One device per local worker: "cpu" or "cuda:N".
struct device_plan {
  std::vector<std::string> workers;
  bool any_cuda() const;
  /// One line, e.g. "cpu for every worker" or "cuda:0 (workers 0, 2), cuda:1 (worker 1)".
  std::string describe() const;
};

/// The plan of `workers` workers for train.device = `setting`, with `visible` CUDA devices visible to this
/// process (CUDA_VISIBLE_DEVICES applied) and `cuda_built` whether its LibTorch has CUDA: "cpu" every worker
/// on the CPU; "cuda" round-robin over the visible GPUs (several workers may share one); "cuda:N" all on
/// GPU N; "auto" cuda where a GPU is visible, else cpu. Throws lw_error(invalid_config) naming train.device
/// when the setting cannot be met (no CUDA in this LibTorch, no visible GPU, N out of range).
device_plan plan_devices(const std::string& setting, int64_t workers, int64_t visible, bool cuda_built);

/// What over-fills a GPU of the plan when each worker needs `per_worker` bytes and GPU N has total(N) bytes:
/// "cuda:0: 2 workers x 23.1 GiB = 46.2 GiB, and it has 40.0 GiB"; "" when every GPU has room.
std::string gpu_overcommit(const device_plan& plan, int64_t per_worker,
                           const std::function<int64_t(int)>& total);

/// plan_devices with this process's LibTorch and GPUs.
device_plan plan_devices(const std::string& setting, int64_t workers);

/// train.autocast for a worker on `device`: off or bf16 ("auto": bf16 on CUDA, off on the CPU). Throws
/// lw_error(invalid_config) naming train.autocast for bf16 on the CPU.
config::autocast_mode resolve_autocast(config::autocast_mode setting, const std::string& device);

/// train.deterministic: deterministic kernels, no TF32, and cuBLAS's fixed workspace (read when CUDA starts,
/// so call this before the first CUDA work). Process-wide.
void use_deterministic_kernels();

}  // namespace longwave::models
