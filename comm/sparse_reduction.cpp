// comm.dtype = "sparse": top-k all-gathered, or shared indices over the dense collective.
#include "comm/sparse_reduction.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "comm/residual_set.hpp"
#include "comm/shared_mask.hpp"
#include "comm/sparse_error_feedback.hpp"
#include "comm/sparse_sum.hpp"
#include "runtime/clock/clock.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::comm {

namespace {

using runtime::seconds_since;

/// What both sparse reductions share: the options and a residual per ring label part.
class sparse_base : public reduction {
 public:
  explicit sparse_base(const reduction_options& o) : o_(o) {}

  wire_dtype dtype() const override { return wire_dtype::sparse; }
  double density(size_t n) const override {
    return n == 0 ? 1.0 : static_cast<double>(kept_of(n)) / static_cast<double>(n);
  }

  residual_vectors residuals() const override { return residuals_.copies(); }
  void load(residual_vectors residuals) override {
    residuals_.by_part.clear();
    for (auto& [part, r] : residuals)
      residuals_.by_part[part] = std::make_unique<sparse_error_feedback>(std::move(r), o_.ef_decay);
  }
  const std::vector<float>* residual(uint32_t part) const override { return residuals_.find(part); }

 protected:
  /// Values sent out of n (top-k or shared: the same count per chunk).
  size_t kept_of(size_t n) const {
    const size_t c = o_.sparse.chunk;
    return n / c * sparse_kept(c, o_.sparse) + sparse_kept(n % c, o_.sparse);
  }

  /// part's residual for n values, created (zero) on first use or when n changed.
  sparse_error_feedback& residual_for(uint32_t part, size_t n) {
    auto& r = residuals_.by_part[part];
    if (!r || r->size() != n) r = std::make_unique<sparse_error_feedback>(n, o_.ef_decay);
    return *r;
  }

  [[noreturn]] static void throw_non_finite() {
    throw lw_error(errc::diverged, "the error-feedback residual has NaN or infinite values");
  }

  reduction_options o_;

 private:
  residual_set<sparse_error_feedback> residuals_;
};

class topk_sparse final : public sparse_base {
 public:
  using sparse_base::sparse_base;

  size_t wire_bytes(size_t n) const override { return sparse_encoded_size(n, o_.sparse); }

  /// Weight 0 (an observed round) or a relay's: sent without error feedback (weight 0: skipped by every
  /// node).
  void apply(collective& c, uint64_t round, uint32_t part, float* data, size_t n, double weight) override {
    std::vector<std::byte> message(sparse_encoded_size(n, o_.sparse));
    auto t0 = std::chrono::steady_clock::now();
    if (carries_residual(weight)) {
      if (!residual_for(part, n).encode(data, n, 0, message.data(), o_.sparse)) throw_non_finite();
    } else {
      sparse_encode(data, n, message.data(), o_.sparse);
    }
    stats_.encode_seconds += seconds_since(t0);
    const auto gathered = c.allgather(round, message.data(), message.size(), weight, part);
    std::string why;
    sparse_mean_stats mean_stats;
    t0 = std::chrono::steady_clock::now();
    const bool ok = sparse_mean(gathered, n, o_.sparse, o_.robust_clip, data, &why, &mean_stats);
    stats_.decode_seconds += seconds_since(t0);
    if (!ok) throw lw_error(errc::malformed_frame, why);
    stats_.clipped += mean_stats.clipped;
  }
};

class shared_sparse final : public sparse_base {
 public:
  using sparse_base::sparse_base;

  size_t wire_bytes(size_t n) const override { return encoded_size(wire_dtype::int8, kept_of(n), o_.codec); }

  /// Weight 0 (an observed round) or a relay's: v = data[mask], the residual untouched.
  void apply(collective& c, uint64_t round, uint32_t part, float* data, size_t n, double weight) override {
    const auto mask = shared_mask(n, o_.sparse, {o_.mask_seed, round, part});
    const size_t k = mask.size();
    std::vector<float> v(k);
    const auto t0 = std::chrono::steady_clock::now();
    if (carries_residual(weight)) {
      auto& residual = residual_for(part, n);
      if (!residual.accumulate_and_gather(data, mask.data(), k, v.data()) || !quantize(v.data(), k))
        throw_non_finite();
      residual.subtract(mask.data(), k, v.data());
    } else {
      for (size_t i = 0; i < k; ++i) v[i] = data[mask[i]];
    }
    stats_.encode_seconds += seconds_since(t0);
    c.allreduce(round, v.data(), k, weight, part, wire_dtype::int8);
    std::fill(data, data + n, 0.0f);
    for (size_t i = 0; i < k; ++i) data[mask[i]] = v[i];
  }

 private:
  /// v[0..k) becomes what the collective's int8 makes of it, chunk by chunk. False if v held NaN or inf.
  bool quantize(float* v, size_t k) const {
    std::vector<std::byte> wire;
    for (size_t off = 0, m = 0; off < k; off += m) {
      m = std::min(o_.shared_chunk, k - off);
      if (!round_trip(wire_dtype::int8, o_.codec, v + off, m, v + off, wire)) return false;
    }
    return true;
  }
};

}  // namespace

std::unique_ptr<reduction> make_topk_sparse(const reduction_options& o) {
  return std::make_unique<topk_sparse>(o);
}

std::unique_ptr<reduction> make_shared_sparse(const reduction_options& o) {
  return std::make_unique<shared_sparse>(o);
}

}  // namespace longwave::comm
