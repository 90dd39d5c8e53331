// Nesterov SGD step of the outer optimizer (PyTorch's SGD with nesterov=True, dampening 0).
#include "models/outer_sgd.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <system_error>
#include <thread>
#include <vector>

#include "models/torch_compat.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::models {

namespace {

// The outer step's elementwise updates, written out instead of ATen's kernels: ATen rounds a + alpha * b
// once where its vector kernels fuse it (AVX2, AVX-512) and twice where they do not (ATEN_CPU_CAPABILITY=
// default), so nodes on other kernel sets (or a GPU node's host) would drift apart on theta_global. Each
// operation here rounds as the fused kernels do, a fused multiply-add being exact wherever it runs: the
// "fma" clone uses the instruction, the default one libm's fmaf. This file builds with -ffp-contract=off.

/// y[i] = a * x[i] + y[i], rounded once (ATen: y.add_(x, a)).
__attribute__((target_clones("fma", "default"))) void fused_axpy(float* y, const float* x, float a,
                                                                 int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(x[i], a, y[i]);
}

/// Nesterov's step on n values in one pass (each value read and written once): with update_b,
/// b = b * mu + d (two roundings, as ATen's b.mul_(mu).add_(d)); then dir = mu * b + d and theta += neg_lr *
/// dir, each rounded once (ATen's fused kernels). Returns the sum of dir's squares.
__attribute__((target_clones("fma", "default"))) double nesterov_pass(float* theta, float* b, const float* d,
                                                                      float mu, float neg_lr, int64_t n,
                                                                      bool update_b) {
  double sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    float bi = b[i];
    if (update_b) {
      const float scaled = bi * mu;
      bi = scaled + d[i];
      b[i] = bi;
    }
    const float dir = std::fma(bi, mu, d[i]);
    theta[i] = std::fma(dir, neg_lr, theta[i]);
    sq += static_cast<double>(dir) * dir;
  }
  return sq;
}

/// b[i] = b[i] * mu + d[i]: two roundings, as ATen's b.mul_(mu).add_(d).
void scale_add(float* b, const float* d, float mu, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float scaled = b[i] * mu;
    b[i] = scaled + d[i];
  }
}

/// Elementwise work in fixed chunks, spread over as many threads as ATen's intra-op setting (a GPU node's
/// 182M-parameter step took 1.7-2.6 s on one thread). Every element is computed alone, so the bits do not
/// depend on the threads; f(c, begin, end) handles chunk c, and a chunk's partial sums, kept per chunk and
/// added in chunk order, do not either. Plain threads, not at::parallel_for: that is ATen's inline OpenMP
/// loop, serial in a file built without -fopenmp, and -fopenmp would load a second OpenMP runtime beside the
/// one a pip wheel's LibTorch bundles.
constexpr int64_t chunk_elements = int64_t{1} << 18;
int64_t chunks_of(int64_t n) {
  return (n + chunk_elements - 1) / chunk_elements;
}
template <class F>
void for_chunks(int64_t n, const F& f) {
  const int64_t chunks = chunks_of(n);
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t c = next++; c < chunks; c = next++)
      f(c, c * chunk_elements, std::min(n, (c + 1) * chunk_elements));
  };
  const int64_t helpers = std::min<int64_t>(at::get_num_threads(), chunks) - 1;
  std::vector<std::thread> pool;
  try {
    for (int64_t t = 0; t < helpers; ++t) pool.emplace_back(work);
  } catch (const std::system_error&) {  // no more threads: the ones started and this one do the rest
  }
  work();
  for (auto& t : pool) t.join();
}
/// Sum of per-chunk partial sums, in chunk order.
double sum_in_order(const std::vector<double>& parts) {
  double s = 0;
  for (const double p : parts) s += p;
  return s;
}

/// y = a * x + y, each rounded once, on every thread.
void axpy(float* y, const float* x, float a, int64_t n) {
  for_chunks(n, [&](int64_t, int64_t b, int64_t e) { fused_axpy(y + b, x + b, a, e - b); });
}

/// b = b * mu + d, on every thread.
void scale_add_all(float* b, const float* d, float mu, int64_t n) {
  for_chunks(n, [&](int64_t, int64_t i, int64_t e) { scale_add(b + i, d + i, mu, e - i); });
}

/// The step's tensors are contiguous fp32 on the host (a broken invariant aborts).
void check_flat(const at::Tensor& theta, const at::Tensor& delta) {
  LW_ASSERT(theta.scalar_type() == at::kFloat && delta.scalar_type() == at::kFloat && theta.is_contiguous() &&
                delta.is_contiguous() && theta.device().is_cpu() && delta.device().is_cpu(),
            "the outer step takes contiguous fp32 host tensors");
}

float* data(at::Tensor& t) {
  return t.data_ptr<float>();
}
const float* data(const at::Tensor& t) {
  return t.data_ptr<float>();
}

}  // namespace

double outer_sgd::step(at::Tensor& theta, const at::Tensor& delta) {
  no_grad_guard no_grad;
  check_flat(theta, delta);
  const int64_t n = theta.numel();
  if (mu_ == 0.0) {
    axpy(data(theta), data(delta), static_cast<float>(-lr_), n);
    return std::abs(lr_) * delta.norm().item<double>();
  }
  const bool first = !b_.defined();
  if (first) b_ = delta.clone();  // torch: first step initialises the buffer with the gradient
  if (!nesterov_) {
    if (!first) scale_add_all(data(b_), data(delta), static_cast<float>(mu_), n);
    axpy(data(theta), data(b_), static_cast<float>(-lr_), n);
    return std::abs(lr_) * b_.norm().item<double>();
  }
  return std::abs(lr_) * nesterov_apply(theta, delta, 0, 0, n, /*update_b=*/!first);
}

double outer_sgd::nesterov_apply(at::Tensor& theta, const at::Tensor& delta, int64_t off, int64_t d_off,
                                 int64_t len, bool update_b) {
  std::vector<double> parts(static_cast<size_t>(chunks_of(len)));
  for_chunks(len, [&](int64_t c, int64_t b, int64_t e) {
    parts[static_cast<size_t>(c)] =
        nesterov_pass(data(theta) + off + b, data(b_) + off + b, data(delta) + d_off + b,
                      static_cast<float>(mu_), static_cast<float>(-lr_), e - b, update_b);
  });
  return std::sqrt(sum_in_order(parts));
}

double outer_sgd::step(at::Tensor& theta, const at::Tensor& delta, const flat_ranges& ranges) {
  no_grad_guard no_grad;
  check_flat(theta, delta);
  // Starting from a zero buffer, mu * 0 + delta is delta exactly: the same first step as torch's clone.
  if (mu_ != 0.0 && !b_.defined()) b_ = at::zeros_like(theta);
  double sq = 0;
  int64_t at = 0;
  for (const auto& [off, len] : ranges) {
    auto d = delta.narrow(0, at, len);
    at += len;
    double part = 0;
    if (mu_ == 0.0) {
      axpy(data(theta) + off, data(delta) + at - len, static_cast<float>(-lr_), len);
      part = lr_ * d.norm().item<double>();
    } else {
      if (nesterov_) {
        part = lr_ * nesterov_apply(theta, delta, off, at - len, len, /*update_b=*/true);
      } else {
        scale_add_all(data(b_) + off, data(delta) + at - len, static_cast<float>(mu_), len);
        axpy(data(theta) + off, data(b_) + off, static_cast<float>(-lr_), len);
        part = lr_ * b_.narrow(0, off, len).norm().item<double>();
      }
    }
    sq += part * part;
  }
  return std::sqrt(sq);
}

delayed_nesterov::delayed_nesterov(double lr, double momentum, int64_t period)
    : lr_(lr), mu_(momentum), period_(period) {
  LW_ASSERT(period >= 1, "delayed Nesterov's period is at least 1");
}

double delayed_nesterov::step(at::Tensor& theta, const at::Tensor& g, int64_t arrivals) {
  no_grad_guard no_grad;
  LW_ASSERT(theta.numel() == g.numel(), "an asynchronous merge's pseudo-gradient is theta-sized");
  LW_ASSERT(arrivals >= 0, "a merge's contributions are counted");
  check_flat(theta, g);
  if (arrivals == 0) {  // every contribution was lost before the all-reduce: the version only advances
    ++merges_;
    return 0;
  }
  const int64_t n = theta.numel();
  if (!m_.defined()) m_ = at::zeros_like(theta);
  if (period_ > 1 && !buf_.defined()) buf_ = at::zeros_like(theta);
  ++merges_;
  arrivals_ += arrivals;
  const bool fold = arrivals_ >= period_;
  const auto k = static_cast<float>(arrivals);  // this merge's sum: k g
  const auto now = static_cast<float>(-lr_ * static_cast<double>(arrivals) / static_cast<double>(period_));
  const auto with_m = static_cast<float>(-lr_ * mu_);  // -lr * mu
  const auto count = static_cast<float>(arrivals_);
  const auto mu = static_cast<float>(mu_);
  float* th = data(theta);
  const float* gd = data(g);
  float* m = data(m_);
  float* buf = period_ > 1 ? data(buf_) : nullptr;
  // theta -= lr k / N * g, then (once N arrivals are in) m <- mu * m + buf / a and theta -= lr * mu * m: the
  // fused steps as outer_sgd's (exact wherever they run), the norm of the whole move in double.
  axpy(th, gd, now, n);
  std::vector<double> parts(static_cast<size_t>(chunks_of(n)));
  for_chunks(n, [&](int64_t c, int64_t b, int64_t e) {
    double sq = 0;
    for (int64_t i = b; i < e; ++i) {
      if (!fold) {
        buf[i] = buf[i] + k * gd[i];
        const double moved = static_cast<double>(now) * gd[i];
        sq += moved * moved;
        continue;
      }
      // buf / a, this merge's k g included (N = 1 keeps no buffer: one merge's mean is g)
      const float mean = buf != nullptr ? (buf[i] + k * gd[i]) / count : gd[i];
      const float kept = m[i] * mu;
      m[i] = kept + mean;
      if (buf != nullptr) buf[i] = 0.0F;
      const double moved = static_cast<double>(now) * gd[i] + static_cast<double>(with_m) * m[i];
      sq += moved * moved;
    }
    parts[static_cast<size_t>(c)] = sq;
  });
  if (fold) {
    axpy(th, m, with_m, n);
    arrivals_ = 0;
  }
  return std::sqrt(sum_in_order(parts));
}

double cgad_scale(int64_t staleness, double alpha, int64_t cutoff) {
  constexpr double pi = 3.14159265358979323846;
  if (staleness <= 0) return 1.0;
  if (staleness >= cutoff) return 0.0;
  const double gate =
      0.5 * (1.0 + std::cos(pi * static_cast<double>(staleness) / static_cast<double>(cutoff)));
  return gate * std::exp(-alpha * static_cast<double>(staleness));
}

}  // namespace longwave::models
