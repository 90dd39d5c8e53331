#pragma once
// What differs between the two LibTorch lines Longwave builds against, Debian's 1.13 (CPU, the default and
// CI's) and a GPU user's 2.x (CUDA), in one place: the rest of the code calls these names only.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>
#include <torch/version.h>

#include <tuple>

// 2.4 replaced the per-device autocast setters with ones that take the device type.
#define LW_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace longwave::models {

/// No autograd recording in this scope (2.x's ATen headers no longer declare at::NoGradGuard; c10's guard is
/// in both lines).
using no_grad_guard = c10::NoGradGuard;

/// Scaled-dot-product attention of [B, H, Tq, D] q over [B, H, Tk, D] k, v with ATen's fused op (1.13 has
/// at::_scaled_dot_product_attention, which returns a tuple; 2.x at::scaled_dot_product_attention). Causal:
/// query i sees keys 0..i (Tq == Tk); otherwise every query sees every key (one new token over a KV cache).
inline at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, causal);
#else
  return std::get<0>(at::_scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                       /*need_attn_weights=*/false, causal));
#endif
}

inline at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return attention(q, k, v, /*causal=*/true);
}

/// bf16 autocast of CUDA ops in this scope (thread-local, as torch.autocast("cuda", torch.bfloat16)); off:
/// nothing changes. Leaving the outermost scope drops the cached bf16 casts of the weights, which the next
/// optimizer step makes stale.
class cuda_autocast {
 public:
  explicit cuda_autocast(bool on) : on_(on) {
    if (!on_) return;
#if LW_TORCH_AT_LEAST(2, 4)
    was_ = at::autocast::is_autocast_enabled(at::kCUDA);
    dtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
#else
    was_ = at::autocast::is_enabled();
    dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
#endif
    at::autocast::increment_nesting();
  }
  ~cuda_autocast() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if LW_TORCH_AT_LEAST(2, 4)
    at::autocast::set_autocast_enabled(at::kCUDA, was_);
    at::autocast::set_autocast_dtype(at::kCUDA, dtype_);
#else
    at::autocast::set_enabled(was_);
    at::autocast::set_autocast_gpu_dtype(dtype_);
#endif
  }
  cuda_autocast(const cuda_autocast&) = delete;
  cuda_autocast& operator=(const cuda_autocast&) = delete;

 private:
  bool on_, was_ = false;
  at::ScalarType dtype_ = at::kHalf;
};

/// Whether fused_adamw runs ATen's one-kernel AdamW (2.x on CUDA); else the caller steps op by op.
/// Leaves SDPA only its math kernel (flash, memory-efficient and cuDNN off) for the rest of the process: an
/// ablation for benches. False where LibTorch has no other kernel (1.13).
inline bool sdpa_math_only() {
#if TORCH_VERSION_MAJOR >= 2
  at::globalContext().setSDPUseFlash(false);
  at::globalContext().setSDPUseMemEfficient(false);
#if LW_TORCH_AT_LEAST(2, 5)
  at::globalContext().setSDPUseCuDNN(false);
#endif
  return true;
#else
  return false;
#endif
}

inline bool has_fused_adamw(const at::Tensor& param) {
#if TORCH_VERSION_MAJOR >= 2
  return param.is_cuda();
#else
  (void)param;
  return false;
#endif
}

/// One fused AdamW update of param from grad (fp32, one device), as torch.optim.AdamW(fused=True): `step` is
/// a one-element fp32 tensor on the device holding the step count after this step.
inline void fused_adamw(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                        at::Tensor& exp_avg_sq, const at::Tensor& step, double lr, double beta1, double beta2,
                        double weight_decay, double eps) {
#if TORCH_VERSION_MAJOR >= 2
  at::_fused_adamw_({param}, {grad}, {exp_avg}, {exp_avg_sq}, {}, {step}, lr, beta1, beta2, weight_decay, eps,
                    /*amsgrad=*/false, /*maximize=*/false);
#else
  (void)param, (void)grad, (void)exp_avg, (void)exp_avg_sq, (void)step, (void)lr, (void)beta1, (void)beta2,
      (void)weight_decay, (void)eps;
  TORCH_CHECK(false, "fused AdamW needs LibTorch 2.x on CUDA");
#endif
}

}  // namespace longwave::models
