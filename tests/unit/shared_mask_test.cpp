// Unit tests for comm/shared_mask (comm.sparse_indices = "shared"): the same indices for the same key, new
// ones each round, sparse_kept of them per chunk, strictly increasing and in range, every index sent within
// shared_mask_period rounds; and sparse_error_feedback's gather and subtract at given indices.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "comm/shared_mask.hpp"
#include "comm/sparse_codec.hpp"
#include "comm/sparse_error_feedback.hpp"

using namespace longwave::comm;

namespace {

sparse_options options(size_t chunk, double density) {
  sparse_options o;
  o.chunk = chunk;
  o.density = density;
  return o;
}

}  // namespace

CATCH_TEST_CASE("the shared mask is a function of its key, with sparse_kept increasing indices per chunk",
                "[comm][sparse]") {
  // Whole chunks, a short last chunk, a chunk not divisible by k, density 1 and a single-value chunk.
  for (const auto& [n, chunk, density] : std::vector<std::tuple<size_t, size_t, double>>{
           {4096 * 3 + 100, 4096, 0.0156}, {1000, 100, 0.3}, {777, 64, 0.07}, {50, 50, 1.0}, {9, 1, 0.5}}) {
    CATCH_INFO("n " << n << ", chunk " << chunk << ", density " << density);
    const auto o = options(chunk, density);
    for (uint64_t round = 1; round <= 5; ++round) {
      const mask_key key{1234, round, 2};
      const auto mask = shared_mask(n, o, key);
      CATCH_CHECK(mask == shared_mask(n, o, key));
      size_t at = 0;
      for (size_t start = 0; start < n; start += chunk) {
        const size_t len = std::min(chunk, n - start);
        const size_t k = sparse_kept(len, o);
        CATCH_REQUIRE(at + k <= mask.size());
        for (size_t j = 0; j < k; ++j, ++at) {
          CATCH_CHECK(mask[at] >= start);
          CATCH_CHECK(mask[at] < start + len);
          if (j > 0) CATCH_CHECK(mask[at] > mask[at - 1]);
        }
      }
      CATCH_CHECK(at == mask.size());
    }
  }
  CATCH_CHECK(shared_mask(0, options(64, 0.1), {}).empty());
}

CATCH_TEST_CASE("the shared mask changes with the round, the part and the seed", "[comm][sparse]") {
  const auto o = options(4096, 0.0156);
  const size_t n = 3 * 4096;
  const auto base = shared_mask(n, o, {7, 10, 0});
  CATCH_CHECK(base != shared_mask(n, o, {7, 11, 0}));
  CATCH_CHECK(base != shared_mask(n, o, {7, 10, 1}));
  CATCH_CHECK(base != shared_mask(n, o, {8, 10, 0}));
  // The chunks' phases differ (hashed per chunk), not one pattern repeated.
  const size_t k = sparse_kept(4096, o);
  bool differ = false;
  for (size_t j = 0; j < k; ++j) differ = differ || base[j] + 4096 != base[k + j];
  CATCH_CHECK(differ);
}

CATCH_TEST_CASE("the shared mask sends every index within shared_mask_period consecutive rounds",
                "[comm][sparse]") {
  for (const auto& [chunk, density] : std::vector<std::pair<size_t, double>>{
           {4096, 0.0156}, {100, 0.3}, {64, 0.07}, {1000, 0.03}, {10, 1.0}, {7, 0.5}}) {
    const auto o = options(chunk, density);
    const size_t n = 2 * chunk + chunk / 3 + 1;
    const size_t period = std::max(shared_mask_period(chunk, o), shared_mask_period(n % chunk, o));
    CATCH_INFO("chunk " << chunk << ", density " << density << ", period " << period);
    CATCH_CHECK(period <= static_cast<size_t>(std::ceil(1.0 / density)) + 1);
    for (const uint64_t first : {uint64_t{1}, uint64_t{1000003}}) {
      std::vector<int> sent(n, 0);
      for (uint64_t r = first; r < first + period; ++r)
        for (const size_t i : shared_mask(n, o, {99, r, 3})) ++sent[i];
      size_t missed = 0;
      for (const int c : sent) missed += c == 0;
      CATCH_CHECK(missed == 0);
    }
  }
}

CATCH_TEST_CASE("sparse error feedback at given indices keeps exactly what was not sent", "[comm][sparse]") {
  sparse_error_feedback ef(6, 0.5f);
  const std::vector<float> delta{1, 2, 3, 4, 5, 6};
  const std::vector<size_t> mask{1, 4};
  std::vector<float> v(2);
  CATCH_REQUIRE(ef.accumulate_and_gather(delta.data(), mask.data(), 2, v.data()));
  CATCH_CHECK(v == std::vector<float>{2, 5});
  const std::vector<float> sent{1.5f, 5};  // what the wire carried (quantized)
  ef.subtract(mask.data(), 2, sent.data());
  CATCH_CHECK(ef.residual() == std::vector<float>{1, 0.5f, 3, 4, 0, 6});
  // The next round decays the whole residual before adding.
  CATCH_REQUIRE(ef.accumulate_and_gather(delta.data(), mask.data(), 2, v.data()));
  CATCH_CHECK(ef.residual() == std::vector<float>{1.5f, 2.25f, 4.5f, 6, 5, 9});
  CATCH_CHECK(v == std::vector<float>{2.25f, 5});
  const std::vector<float> bad{0, NAN, 0, 0, 0, 0};
  CATCH_CHECK_FALSE(ef.accumulate_and_gather(bad.data(), mask.data(), 2, v.data()));
}
