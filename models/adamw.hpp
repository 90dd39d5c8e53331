#pragma once
// AdamW on one flat fp32 buffer, the same arithmetic as torch::optim::AdamW (decoupled weight decay).
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace longwave::models {

/// Hyper-parameters of the inner optimizer; lr is passed per step (the schedule lives outside).
struct adamw_options {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  bool fused = true;  ///< the fused kernel where LibTorch has one (false: op by op, for benches)
};

/// Flat AdamW. State: exp_avg, exp_avg_sq (fp32, like the parameters, on their device) and the step count.
/// On CUDA with LibTorch 2.x the update is ATen's fused kernel; on the CPU it is op for op torch's.
class adamw {
 public:
  adamw(int64_t n, adamw_options opts, const at::Device& device = at::kCPU);
  /// One update of `param` (fp32, in place) from `grad` (fp32) with learning rate lr.
  void step(at::Tensor& param, const at::Tensor& grad, double lr);
  at::Tensor& exp_avg() { return m_; }
  at::Tensor& exp_avg_sq() { return v_; }
  const at::Tensor& exp_avg() const { return m_; }
  const at::Tensor& exp_avg_sq() const { return v_; }
  int64_t steps() const { return t_; }
  void set_steps(int64_t t) { t_ = t; }

 private:
  adamw_options o_;
  at::Tensor m_, v_;
  at::Tensor denom_;  // one chunk of the denominator, kept between steps
  at::Tensor step_;   // the fused kernel's step count, on the device
  int64_t t_ = 0;
};

}  // namespace longwave::models
