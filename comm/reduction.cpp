// The dense reductions (with and without error feedback) and the choice among all of them.
#include "comm/reduction.hpp"

#include <algorithm>
#include <cmath>

#include "comm/error_feedback.hpp"
#include "comm/residual_set.hpp"
#include "comm/sparse_reduction.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::comm {

namespace {

/// fp32, fp16, bf16 or int8 through the collective's all-reduce; with error feedback (lossy dtypes only),
/// each contribution is first quantized in the collective's chunks, as the collective will, and what that
/// drops is carried into the part's next round.
class dense_reduction final : public reduction {
 public:
  dense_reduction(wire_dtype dtype, codec_options codec, bool error_feedback)
      : dtype_(dtype), codec_(codec), error_feedback_(error_feedback && dtype != wire_dtype::fp32) {}

  void apply(collective& c, uint64_t round, uint32_t part, float* data, size_t n, double weight) override {
    if (error_feedback_ && carries_residual(weight)) carry_residual(c, part, data, n);
    c.allreduce(round, data, n, weight, part, dtype_);
  }

  wire_dtype dtype() const override { return dtype_; }
  size_t wire_bytes(size_t n) const override { return encoded_size(dtype_, n, codec_); }

  residual_vectors residuals() const override { return residuals_.copies(); }
  void load(residual_vectors residuals) override {
    residuals_.by_part.clear();
    for (auto& [part, r] : residuals)
      residuals_.by_part[part] = std::make_unique<error_feedback>(std::move(r));
  }
  const std::vector<float>* residual(uint32_t part) const override { return residuals_.find(part); }

 private:
  /// x becomes what every receiver decodes of x + residual, chunk by chunk; the residual keeps the rest.
  void carry_residual(const collective& c, uint32_t part, float* x, size_t n) {
    auto& ef = residuals_.by_part[part];
    if (!ef || ef->size() != n) ef = std::make_unique<error_feedback>(n);
    const size_t chunk = std::max<size_t>(1, c.chunk_elements());
    std::vector<std::byte> wire;
    std::vector<float> back;
    for (size_t off = 0, m = 0; off < n; off += m) {  // chunk may be SIZE_MAX: one piece
      m = std::min(chunk, n - off);
      ef->add_residual(x + off, m, off);
      back.resize(m);
      if (!round_trip(dtype_, codec_, x + off, m, back.data(), wire))
        throw lw_error(errc::diverged, "the error-feedback residual has NaN or infinite values");
      ef->update(x + off, back.data(), m, off);
      std::copy(back.begin(), back.end(), x + off);
    }
  }

  wire_dtype dtype_;
  codec_options codec_;
  bool error_feedback_;
  residual_set<error_feedback> residuals_;
};

}  // namespace

bool round_trip(wire_dtype dtype, const codec_options& codec, const float* x, size_t m, float* back,
                std::vector<std::byte>& wire) {
  wire.resize(encoded_size(dtype, m, codec));
  encode(dtype, x, m, wire.data(), codec);
  return decode(dtype, wire.data(), wire.size(), m, back, codec);
}

wire_dtype dense_dtype(wire_dtype comm_dtype) {
  return comm_dtype == wire_dtype::sparse ? wire_dtype::fp32 : comm_dtype;
}

std::optional<double> reduction::residual_norm(uint32_t part) const {
  const auto* r = residual(part);
  if (!r) return std::nullopt;
  double sum = 0;
  for (const float v : *r) sum += static_cast<double>(v) * v;
  return std::sqrt(sum);
}

std::unique_ptr<reduction> make_reduction(const reduction_options& o) {
  if (o.dtype != wire_dtype::sparse)
    return std::make_unique<dense_reduction>(o.dtype, o.codec, o.error_feedback);
  if (o.shared_indices) return make_shared_sparse(o);
  return make_topk_sparse(o);
}

std::unique_ptr<reduction> exact_reduction() {
  return std::make_unique<dense_reduction>(wire_dtype::fp32, codec_options{}, false);
}

}  // namespace longwave::comm
