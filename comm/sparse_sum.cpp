// The rank-ordered average of gathered sparse messages (see sparse_sum.hpp).
#include "comm/sparse_sum.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace longwave::comm {

namespace {

double l2(const std::vector<float>& x) {
  double s = 0;
  for (const float v : x) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
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
  if (!(total > 0)) return fail("no rank contributed a positive weight");
  // Every message of positive weight is decoded (and so validated) before out is touched; the second pass
  // decodes again rather than holding world decoded vectors.
  std::vector<float> x(n);
  std::vector<double> norms(world, 0.0);
  auto decode_rank = [&](size_t r, std::string* reason) {
    return sparse_decode(g.messages.data() + r * g.bytes, g.bytes, n, x.data(), o, reason);
  };
  for (size_t r = 0; r < world; ++r) {
    if (!(g.weights[r] > 0)) continue;
    std::string reason;
    if (!decode_rank(r, &reason))
      return fail(fmt::format("the sparse message of rank {} does not decode: {}", r, reason));
    norms[r] = l2(x);
  }
  std::vector<double> scale(world, 1.0);
  double med = 0;
  size_t clipped = 0;
  if (clip) {
    std::vector<double> live;
    for (size_t r = 0; r < world; ++r)
      if (g.weights[r] > 0) live.push_back(norms[r]);
    med = median(live);
    for (size_t r = 0; r < world; ++r)
      if (g.weights[r] > 0 && norms[r] > med) {
        scale[r] = med / norms[r];
        ++clipped;
      }
  }
  std::fill(out, out + n, 0.0f);
  for (size_t r = 0; r < world; ++r) {
    if (!(g.weights[r] > 0)) continue;
    decode_rank(r, nullptr);  // valid: the first pass checked it
    const auto c = static_cast<float>(g.weights[r] * scale[r]);
    for (size_t i = 0; i < n; ++i) out[i] += c * x[i];
  }
  const auto w = static_cast<float>(total);
  for (size_t i = 0; i < n; ++i) out[i] /= w;
  if (stats) {
    stats->norms = std::move(norms);
    stats->median_norm = med;
    stats->clipped = clipped;
  }
  return true;
}

}  // namespace longwave::comm
