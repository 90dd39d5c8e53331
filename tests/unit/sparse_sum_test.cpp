// Unit tests for comm/sparse_sum: the rank-ordered weighted mean of gathered sparse messages, ranks of weight
// 0 skipped unread, a bad message refused by rank with the output untouched, and clipping to the median norm.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "comm/sparse_codec.hpp"
#include "comm/sparse_sum.hpp"

using namespace longwave::comm;

namespace {

std::vector<float> random_vec(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

/// The gathered messages of vectors xs with weights ws.
gathered gather(const std::vector<std::vector<float>>& xs, const std::vector<double>& ws,
                const sparse_options& o) {
  gathered g;
  g.bytes = sparse_encoded_size(xs[0].size(), o);
  g.weights = ws;
  for (const auto& x : xs) {
    std::vector<std::byte> m(g.bytes);
    sparse_encode(x.data(), x.size(), m.data(), o);
    g.messages.insert(g.messages.end(), m.begin(), m.end());
  }
  return g;
}

std::vector<float> decoded(const gathered& g, size_t r, size_t n, const sparse_options& o) {
  std::vector<float> x(n);
  CATCH_REQUIRE(sparse_decode(g.messages.data() + r * g.bytes, g.bytes, n, x.data(), o));
  return x;
}

double norm(const std::vector<float>& x) {
  double s = 0;
  for (const float v : x) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

}  // namespace

CATCH_TEST_CASE("sparse_mean is the weighted mean of the decoded messages, ranks of weight 0 skipped",
                "[unit][comm][sparse]") {
  sparse_options o;
  o.chunk = 256;
  o.density = 0.05;
  o.value_bits = 4;
  const size_t n = 1000;
  auto g = gather({random_vec(n, 1, 1), random_vec(n, 1, 2), random_vec(n, 1, 3)}, {1.0, 3.0, 0.0}, o);
  // Rank 2 has weight 0: its bytes are not even read (garbage here).
  for (size_t i = 2 * g.bytes; i < 3 * g.bytes; ++i) g.messages[i] = std::byte{0xff};
  std::vector<float> out(n, 7.0f);
  std::string why;
  sparse_mean_stats stats;
  CATCH_REQUIRE(sparse_mean(g, n, o, false, out.data(), &why, &stats));
  const auto a = decoded(g, 0, n, o), b = decoded(g, 1, n, o);
  size_t nonzero = 0;
  for (size_t i = 0; i < n; ++i) {
    const double want = (1.0 * a[i] + 3.0 * b[i]) / 4.0;
    CATCH_CHECK(std::fabs(out[i] - want) <= 1e-6 * (1 + std::fabs(want)));
    nonzero += out[i] != 0.0f;
  }
  // Each message keeps about 5 %, so the mean of two holds at most about 10 % nonzero values.
  CATCH_CHECK(nonzero > 0);
  CATCH_CHECK(nonzero <= 2 * 4 * sparse_kept(256, o));
  CATCH_CHECK(stats.clipped == 0);
  CATCH_CHECK(stats.norms[0] == Approx(norm(a)));
  // The same input gives the same bits.
  std::vector<float> again(n);
  CATCH_REQUIRE(sparse_mean(g, n, o, false, again.data()));
  CATCH_CHECK(again == out);
}

CATCH_TEST_CASE(
    "sparse_mean refuses a message that does not decode, naming the rank, and leaves out as it was",
    "[unit][comm][sparse]") {
  sparse_options o;
  const size_t n = 5000;
  auto g = gather({random_vec(n, 1, 4), random_vec(n, 1, 5)}, {1.0, 1.0}, o);
  g.messages[g.bytes + 3] = std::byte{0xff};  // rank 1's first lo: a NaN bit pattern
  std::vector<float> out(n, 7.0f);
  std::string why;
  CATCH_CHECK_FALSE(sparse_mean(g, n, o, false, out.data(), &why));
  CATCH_CHECK(why.find("rank 1") != std::string::npos);
  CATCH_CHECK(out == std::vector<float>(n, 7.0f));
  // Every weight 0 (client sampling with no drawn client on a live node): zeros, as every backend gives.
  g = gather({random_vec(n, 1, 4), random_vec(n, 1, 5)}, {0.0, 0.0}, o);
  CATCH_CHECK(sparse_mean(g, n, o, false, out.data(), &why));
  CATCH_CHECK(out == std::vector<float>(n, 0.0f));
  // A size that does not match is refused too.
  g.messages.pop_back();
  g.weights = {1.0, 1.0};
  CATCH_CHECK_FALSE(sparse_mean(g, n, o, false, out.data(), &why));
}

CATCH_TEST_CASE("with clipping a contribution far above the median norm is scaled down to it",
                "[unit][comm][sparse]") {
  sparse_options o;
  o.chunk = 512;
  o.density = 0.1;
  const size_t n = 4096;
  // Rank 1 diverges: 1000 times the others' scale.
  auto g = gather({random_vec(n, 1, 6), random_vec(n, 1000, 7), random_vec(n, 1, 8)}, {1.0, 1.0, 1.0}, o);
  std::vector<float> plain(n), clipped(n);
  sparse_mean_stats stats;
  CATCH_REQUIRE(sparse_mean(g, n, o, false, plain.data()));
  CATCH_REQUIRE(sparse_mean(g, n, o, true, clipped.data(), nullptr, &stats));
  CATCH_CHECK(stats.clipped == 1);
  const double n0 = norm(decoded(g, 0, n, o)), n2 = norm(decoded(g, 2, n, o));
  CATCH_CHECK(stats.median_norm == Approx(std::max(n0, n2)));
  // Without clipping the diverging node dominates the mean; with it, the mean's norm is at most the median's.
  CATCH_CHECK(norm(plain) > 100 * stats.median_norm / 3);
  CATCH_CHECK(norm(clipped) <= stats.median_norm * (1 + 1e-6));
}
