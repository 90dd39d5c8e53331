// The rank-ordered average of gathered sparse messages (see sparse_sum.hpp).
#include "comm/sparse_sum.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace longwave::comm {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

/// Each rank's factor under robust clipping: min(1, median norm / its norm) over the ranks of positive
/// weight (1 for the others); *med and *clipped say what it did.
std::vector<double> clip_scales(const gathered& g, const std::vector<double>& norms, double* med,
                                size_t* clipped) {
  const size_t world = g.weights.size();
  std::vector<double> scale(world, 1.0);
  std::vector<double> live;
  for (size_t r = 0; r < world; ++r)
    if (g.weights[r] > 0) live.push_back(norms[r]);
  *med = median(live);
  for (size_t r = 0; r < world; ++r)
    if (g.weights[r] > 0 && norms[r] > *med) {
      scale[r] = *med / norms[r];
      ++*clipped;
    }
  return scale;
}

}  // namespace

bool sparse_mean(const gathered& g, size_t n, const sparse_options& o, bool clip, float* out,
                 std::string* why, sparse_mean_stats* stats) {
  const size_t world = g.weights.size();
  auto fail = [&](std::string text) {
    if (why) *why = std::move(text);
    return false;
  };
  if (g.messages.size() != world * g.bytes)
    return fail(
        fmt::format("{} bytes gathered for {} messages of {} bytes", g.messages.size(), world, g.bytes));
  double total = 0;
  for (const double w : g.weights) total += w;
  if (!(total > 0)) {  // every rank weighed 0: zeros (collective.hpp)
    std::fill(out, out + n, 0.0f);
    return true;
  }
  // Every message of positive weight is validated (and its norm taken) before out is touched; then only the
  // sent values are added, so the cost is the k values per chunk of each rank, not world dense vectors.
  auto message = [&](size_t r) { return g.messages.data() + r * g.bytes; };
  std::vector<double> norms(world, 0.0);
  for (size_t r = 0; r < world; ++r) {
    if (!(g.weights[r] > 0)) continue;
    std::string reason;
    double sum_sq = 0;
    if (!sparse_sum_squares(message(r), g.bytes, n, o, &sum_sq, &reason))
      return fail(fmt::format("the sparse message of rank {} does not decode: {}", r, reason));
    norms[r] = std::sqrt(sum_sq);
  }
  double med = 0;
  size_t clipped = 0;
  const auto scale = clip ? clip_scales(g, norms, &med, &clipped) : std::vector<double>(world, 1.0);
  std::fill(out, out + n, 0.0f);
  for (size_t r = 0; r < world; ++r) {
    if (!(g.weights[r] > 0)) continue;
    // The division by the total weight rides on each rank's factor: no pass over the n values.
    const auto c = static_cast<float>(g.weights[r] * scale[r] / total);
    sparse_decode_accumulate(message(r), g.bytes, n, out, o, nullptr, c);  // valid: checked above
  }
  if (stats) {
    stats->norms = std::move(norms);
    stats->median_norm = med;
    stats->clipped = clipped;
  }
  return true;
}

}  // namespace longwave::comm
