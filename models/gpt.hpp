#pragma once
// Llama-style decoder over one flat parameter buffer: token embedding, RMSNorm, rotary position embedding,
// causal multi-head (or grouped-query) attention, SwiGLU MLP and a tied output head.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "models/model_spec.hpp"

namespace longwave::models {

/// One model replica. Every parameter is a leaf view into `flat_params()`, and every gradient is a view into
/// `flat_grads()`, so optimizers and the pseudo-gradient work on two contiguous buffers.
class gpt {
 public:
  /// dtype is at::kFloat or at::kBFloat16; the parameters and gradients live on `device`. Parameters start
  /// uninitialised: call load_flat or init_flat.
  gpt(const model_spec& spec, at::ScalarType dtype, const at::Device& device = at::kCPU);
  /// A model for evaluation over an existing flat fp32 buffer (on any device): its parameters are views of
  /// `flat` (no copy, no gradient buffer), so `flat` must not change while the model is used.
  gpt(const model_spec& spec, const at::Tensor& flat);
  ~gpt();
  gpt(const gpt&) = delete;
  gpt& operator=(const gpt&) = delete;

  /// Deterministic initialisation from a seed into an fp32 flat buffer of closed_form_param_count values:
  /// N(0, 0.02) for matrices, N(0, 0.02/sqrt(2L)) for the residual projections, ones for norms.
  static at::Tensor init_flat(const model_spec& spec, uint64_t seed);

  /// Copies a flat fp32 buffer into the parameters (converting to the model dtype).
  void load_flat(const at::Tensor& flat_fp32);

  /// Mean next-token cross-entropy of tokens [B, T+1] (int64, on the model's device): inputs [:, :T],
  /// targets [:, 1:]. With grad = true, the gradient is accumulated into flat_grads() (the backward pass runs
  /// outside autocast, as PyTorch recommends).
  /// `scale` multiplies the loss before the backward pass (1/k for one of k micro-batches); the loss returned
  /// is unscaled.
  at::Tensor loss(const at::Tensor& tokens, bool grad, double scale = 1.0);

  /// Next-token logits [B, T, V] of inputs idx [B, T] (int64), without gradient.
  at::Tensor logits(const at::Tensor& idx);

  /// The keys and values of the positions a sequence has seen so far, per layer ([B, Hkv, length, D]).
  struct kv_cache {
    std::vector<at::Tensor> k, v;
    int64_t length() const { return k.empty() ? 0 : k.front().size(2); }
  };
  /// Next-token logits [B, t, V] of idx [B, t] at positions cache.length() onwards, without gradient; their
  /// keys and values join `cache`. A prompt (t >= 1) goes into an empty cache, then one token at a time, up
  /// to seq_len positions in all. Equals logits() of the whole sequence up to float rounding, at the cost of
  /// one position a token instead of the whole sequence.
  at::Tensor logits(const at::Tensor& idx, kv_cache& cache);

  at::Tensor& flat_params() { return flat_; }
  at::Tensor& flat_grads() { return flat_grad_; }
  /// Leaf parameter views, in parameter_layout order.
  const std::vector<at::Tensor>& parameters() const { return params_; }
  void zero_grad();
  const model_spec& spec() const { return spec_; }
  at::Device device() const { return flat_.device(); }
  /// bf16 autocast of the forward pass (CUDA only: models::resolve_autocast refuses it on the CPU).
  void set_autocast(bool on) { autocast_ = on; }
  int64_t n_params() const { return n_; }

 private:
  at::Tensor forward_logits(const at::Tensor& idx, kv_cache* cache = nullptr);
  void init(at::ScalarType dtype);  // parameter views of flat_ (with gradients if flat_grad_), RoPE tables

  model_spec spec_;
  int64_t n_ = 0;
  at::Tensor flat_, flat_grad_;
  std::vector<at::Tensor> params_;
  at::Tensor rope_cos_, rope_sin_;  // [T, head_dim/2]
  bool autocast_ = false;
};

}  // namespace longwave::models
