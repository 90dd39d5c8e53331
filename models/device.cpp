// train.device and train.autocast resolved for this process (see device.hpp).
#include "models/device.hpp"

#include <ATen/Context.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <map>

#include "runtime/errors/errors.hpp"

namespace longwave::models {

bool device_plan::any_cuda() const {
  for (const auto& w : workers)
    if (w != "cpu") return true;
  return false;
}

std::string device_plan::describe() const {
  if (!any_cuda()) return "cpu for every worker";
  std::map<std::string, std::vector<size_t>> by_device;
  for (size_t i = 0; i < workers.size(); ++i) by_device[workers[i]].push_back(i);
  std::string out;
  for (const auto& [device, ids] : by_device)
    out += fmt::format("{}{} (worker{} {})", out.empty() ? "" : ", ", device, ids.size() > 1 ? "s" : "",
                       fmt::join(ids, ", "));
  return out;
}

device_plan plan_devices(const std::string& setting, int64_t workers, int64_t visible, bool cuda_built) {
  device_plan plan;
  const bool wants_cuda = setting.rfind("cuda", 0) == 0;
  if (setting == "cpu" || (setting == "auto" && (!cuda_built || visible == 0))) {
    plan.workers.assign(static_cast<size_t>(workers), "cpu");
    return plan;
  }
  if (wants_cuda && !cuda_built)
    throw lw_error(errc::invalid_config,
                   fmt::format("train.device = \"{}\": this Longwave is built on a CPU LibTorch; build the "
                               "\"cuda\" preset against a CUDA LibTorch 2.x (docs/06-gpu.md)",
                               setting));
  if (visible == 0)
    throw lw_error(errc::invalid_config,
                   fmt::format("train.device = \"{}\": no GPU is visible to this process (check the driver "
                               "and CUDA_VISIBLE_DEVICES), or use train.device = \"cpu\"",
                               setting));
  if (setting.size() > 5 && setting[4] == ':') {
    const int64_t index = std::stoll(setting.substr(5));
    if (index >= visible)
      throw lw_error(errc::invalid_config,
                     fmt::format("train.device = \"{}\": this process sees {} GPU{} (cuda:0..cuda:{})",
                                 setting, visible, visible == 1 ? "" : "s", visible - 1));
    plan.workers.assign(static_cast<size_t>(workers), setting);
    return plan;
  }
  for (int64_t w = 0; w < workers; ++w) plan.workers.push_back(fmt::format("cuda:{}", w % visible));
  return plan;
}

std::string gpu_overcommit(const device_plan& plan, int64_t per_worker,
                           const std::function<int64_t(int)>& total) {
  std::map<std::string, int64_t> workers;
  for (const auto& d : plan.workers)
    if (d != "cpu") ++workers[d];
  constexpr double gib = 1 << 30;
  for (const auto& [device, n] : workers) {
    const int64_t have = total(std::stoi(device.substr(5)));
    if (n * per_worker > have)
      return fmt::format("{}: {} worker{} x {:.1f} GiB = {:.1f} GiB, and it has {:.1f} GiB", device, n,
                         n == 1 ? "" : "s", static_cast<double>(per_worker) / gib,
                         static_cast<double>(n * per_worker) / gib, static_cast<double>(have) / gib);
  }
  return "";
}

device_plan plan_devices(const std::string& setting, int64_t workers) {
  const bool built = at::hasCUDA();
  return plan_devices(setting, workers, built ? static_cast<int64_t>(torch::cuda::device_count()) : 0, built);
}

config::autocast_mode resolve_autocast(config::autocast_mode setting, const std::string& device) {
  const bool cuda = device != "cpu";
  if (setting == config::autocast_mode::automatic)
    return cuda ? config::autocast_mode::bf16 : config::autocast_mode::off;
  if (setting == config::autocast_mode::bf16 && !cuda)
    throw lw_error(errc::invalid_config,
                   "train.autocast = \"bf16\": this worker runs on the CPU, where autocast is off; use "
                   "\"auto\" or \"off\" (model.dtype = \"bf16\" trains bf16 weights on the CPU)");
  return setting;
}

void use_deterministic_kernels() {
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
}

}  // namespace longwave::models
