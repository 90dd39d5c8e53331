// libFuzzer target: a peer's sparse message (comm/sparse_codec.hpp) as the communicator reads it after the
// all-gather: sparse_decode, sparse_decode_accumulate, sparse_sum_squares and sparse_mean must agree on
// whether it is valid, never read outside it, and agree on its values when it is.
//
// Input: [options][n, 2 bytes little-endian][message]. options: bits 0-1 the chunk (64, 300, 1000, 4096),
// bit 2 value_bits 4 (else 2), bits 3-5 the density (0.01, 0.03, 0.1, 0.2, 0.5, 0.9, 1, 0.0156).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "comm/sparse_codec.hpp"
#include "comm/sparse_sum.hpp"
#include "fuzz/fuzz_seeds.hpp"

using namespace longwave::comm;

namespace {

constexpr size_t max_values = 1u << 14;  // a real message is larger; the fuzzer's stay fast

sparse_options options_of(uint8_t b) {
  static const size_t chunks[] = {64, 300, 1000, 4096};
  static const double densities[] = {0.01, 0.03, 0.1, 0.2, 0.5, 0.9, 1.0, 0.0156};
  sparse_options o;
  o.chunk = chunks[b & 3];
  o.value_bits = (b & 4) ? 4 : 2;
  o.density = densities[(b >> 3) & 7];
  return o;
}

void write_seeds(const std::string& dir) {
  std::mt19937 rng(5);
  std::normal_distribution<float> gauss(0.f, 1e-2f);
  for (const uint8_t b : {uint8_t{0x00}, uint8_t{0x05}, uint8_t{0x12}, uint8_t{0x3b}, uint8_t{0x37}}) {
    const auto o = options_of(b);
    for (const size_t n : {size_t{1}, size_t{700}, size_t{5000}}) {
      std::vector<float> x(n);
      for (auto& v : x) v = gauss(rng);
      std::vector<uint8_t> in = {b, static_cast<uint8_t>(n & 0xff), static_cast<uint8_t>(n >> 8)};
      in.resize(3 + sparse_encoded_size(n, o));
      sparse_encode(x.data(), n, reinterpret_cast<std::byte*>(in.data() + 3), o);
      longwave::fuzz::write_seed(dir, "sparse_" + std::to_string(b) + "_" + std::to_string(n), in.data(),
                                 in.size());
    }
  }
}

}  // namespace

LW_FUZZ_INITIALIZE(write_seeds)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using longwave::fuzz::fail;
  if (size < 3) return 0;
  const auto o = options_of(data[0]);
  const size_t n = std::min<size_t>(data[1] | size_t{data[2]} << 8, max_values);
  // The message in a buffer of its own size, so that ASan sees any read beyond it.
  const std::vector<std::byte> msg(reinterpret_cast<const std::byte*>(data + 3),
                                   reinterpret_cast<const std::byte*>(data + size));
  std::vector<float> decoded(n, 7.0f), acc(n, 0.0f);
  const bool ok = sparse_decode(msg.data(), msg.size(), n, decoded.data(), o);
  if (!ok && decoded != std::vector<float>(n, 7.0f)) fail("a refused message changed the output");
  if (sparse_decode_accumulate(msg.data(), msg.size(), n, acc.data(), o) != ok)
    fail("decode and decode_accumulate disagree on validity");
  double sum_sq = -1;
  if (sparse_sum_squares(msg.data(), msg.size(), n, o, &sum_sq) != ok)
    fail("decode and sum_squares disagree on validity");
  if (!ok) return 0;
  double want = 0;
  for (size_t i = 0; i < n; ++i) {
    if (acc[i] != decoded[i] && !(std::isnan(acc[i]) && std::isnan(decoded[i])))
      fail("decode_accumulate into zeros differs from decode");
    want += static_cast<double>(decoded[i]) * decoded[i];
  }
  if (sum_sq != want) fail("sum_squares differs from the decoded values' squares");
  // Two ranks sending it, weights 1 and 3, with and without clipping: valid, and the mean of equal messages
  // stays within rounding of the message.
  gathered g;
  g.bytes = msg.size();
  g.weights = {1.0, 3.0};
  g.messages = msg;
  g.messages.insert(g.messages.end(), msg.begin(), msg.end());
  std::vector<float> mean(n);
  for (const bool clip : {false, true}) {
    if (!sparse_mean(g, n, o, clip, mean.data())) fail("sparse_mean refused a valid message");
    for (size_t i = 0; i < n; ++i)
      if (std::isfinite(decoded[i]) && std::fabs(mean[i] - decoded[i]) > 1e-5f * (1 + std::fabs(decoded[i])))
        fail("the mean of two equal messages is not the message");
  }
  return 0;
}
