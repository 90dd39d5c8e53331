// Unit tests for comm/sparse_codec and comm/sparse_error_feedback: exact top-k against a full sort (ties,
// partial last chunk), the byte layout of comm/CODEC.md read back independently, the value bound for 2 and
// 4 bits, error feedback, and refusal of malformed or truncated messages (including random mutations).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "comm/codec.hpp"
#include "comm/sparse_codec.hpp"
#include "comm/sparse_error_feedback.hpp"

using longwave::comm::sparse_decode;
using longwave::comm::sparse_decode_accumulate;
using longwave::comm::sparse_decode_subtract;
using longwave::comm::sparse_encode;
using longwave::comm::sparse_encoded_size;
using longwave::comm::sparse_error_feedback;
using longwave::comm::sparse_kept;
using longwave::comm::sparse_options;
using longwave::comm::sparse_options_error;

namespace {

std::vector<std::byte> encode_vec(const std::vector<float>& x, const sparse_options& o) {
  std::vector<std::byte> out(sparse_encoded_size(x.size(), o));
  sparse_encode(x.data(), x.size(), out.data(), o);
  return out;
}

/// One chunk as CODEC.md lays it out, read by this test's own parser.
struct parsed_chunk {
  float lo = 0, hi = 0;
  std::vector<uint32_t> idx, code;
};

uint32_t read_bits(const std::byte* p, size_t bit, unsigned w) {
  uint32_t v = 0;
  for (unsigned b = 0; b < w; ++b, ++bit)
    v |= ((std::to_integer<uint32_t>(p[bit / 8]) >> (bit % 8)) & 1u) << b;
  return v;
}

std::vector<parsed_chunk> parse(const std::vector<std::byte>& enc, size_t n, const sparse_options& o) {
  std::vector<parsed_chunk> out;
  const std::byte* p = enc.data();
  for (size_t start = 0; start < n; start += o.chunk) {
    const size_t len = std::min(o.chunk, n - start);
    const size_t k = sparse_kept(len, o);
    unsigned w = 1;
    while ((size_t{1} << w) < len) ++w;
    parsed_chunk c;
    std::memcpy(&c.lo, p, 4);
    std::memcpy(&c.hi, p + 4, 4);
    for (size_t j = 0; j < k; ++j) c.idx.push_back(read_bits(p + 8, j * w, w));
    const std::byte* codes = p + 8 + (k * w + 7) / 8;
    for (size_t j = 0; j < k; ++j) c.code.push_back(read_bits(codes, j * o.value_bits, o.value_bits));
    p = codes + (k * o.value_bits + 7) / 8;
    out.push_back(c);
  }
  CATCH_REQUIRE(static_cast<size_t>(p - enc.data()) == enc.size());
  return out;
}

/// Reference top-k: sort indices by |x| descending, ties by index, keep k, return them ascending.
std::vector<uint32_t> sorted_top_k(const float* x, size_t len, size_t k) {
  std::vector<uint32_t> order(len);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const float fa = std::fabs(x[a]), fb = std::fabs(x[b]);
    return fa != fb ? fa > fb : a < b;
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

/// Random values with many exact ties: half from a few levels, half Gaussian.
std::vector<float> tied_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::uniform_int_distribution<int> level(-4, 4);
  std::vector<float> x(n);
  for (float& v : x) v = (rng() & 1) ? normal(rng) : static_cast<float>(level(rng)) * 5e-4f;
  return x;
}

// The bound of CODEC.md: half a step plus 2^-21 of the chunk's largest magnitude.
double value_bound(const parsed_chunk& c, unsigned bits) {
  const float step = (c.hi - c.lo) / static_cast<float>((1u << (bits - 1)) - 1);
  return step / 2.0 + 0x1p-21 * c.hi;
}

}  // namespace

CATCH_TEST_CASE("Sparse options are validated and each bad field is named", "[unit][codec]") {
  CATCH_CHECK(sparse_options_error({}).empty());
  CATCH_CHECK(sparse_options_error({0, 0.1, 2}).find("chunk") == 0);
  CATCH_CHECK(sparse_options_error({(size_t{1} << 24) + 1, 0.1, 2}).find("chunk") == 0);
  for (double d : {0.0, -0.1, 1.0000001, std::nan("")}) {
    CATCH_CHECK(sparse_options_error({4096, d, 2}).find("density") == 0);
  }
  CATCH_CHECK(sparse_options_error({4096, 1.0, 4}).empty());
  for (unsigned b : {0u, 1u, 3u, 8u})
    CATCH_CHECK(sparse_options_error({4096, 0.1, b}).find("value_bits") == 0);
  std::string why;
  std::vector<std::byte> enc(16);
  float out[4];
  CATCH_CHECK_FALSE(sparse_decode(enc.data(), enc.size(), 4, out, {4096, 0.1, 3}, &why));
  CATCH_CHECK(why.find("value_bits") != std::string::npos);
}

CATCH_TEST_CASE("A small chunk encodes to the bytes CODEC.md lays out", "[unit][codec]") {
  // chunk 8, density 0.25: k = 2 of 8, 3-bit indices. |-3| and the tie |2| = |-2| (the lower index wins).
  const std::vector<float> x = {0.1f, -3.0f, 0.5f, 2.0f, -2.0f, 0.0f, 1.0f, 0.2f};
  const sparse_options o{8, 0.25, 2};
  const auto enc = encode_vec(x, o);
  // lo = 2 (the smallest kept magnitude), hi = 3; indices 1 | 3 << 3; codes (sign 1, q 1), (0, 0).
  const std::vector<uint8_t> want = {0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x40, 0x40, 0x19, 0x03};
  CATCH_REQUIRE(enc.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) CATCH_CHECK(std::to_integer<uint8_t>(enc[i]) == want[i]);
  std::vector<float> dec(8, 7.0f);
  CATCH_REQUIRE(sparse_decode(enc.data(), enc.size(), 8, dec.data(), o));
  CATCH_CHECK(dec == std::vector<float>{0, -3, 0, 2, 0, 0, 0, 0});
}

CATCH_TEST_CASE("Top-k is exact against a full sort, ties to the lower index, last chunk partial",
                "[unit][codec]") {
  for (size_t chunk : {size_t{1}, size_t{7}, size_t{64}, size_t{4096}}) {
    for (double density : {0.0156, 0.1, 0.5, 1.0}) {
      for (unsigned bits : {2u, 4u}) {
        const sparse_options o{chunk, density, bits};
        const size_t n = 3 * chunk + chunk / 2 + 1;
        const auto x = tied_values(n, static_cast<uint32_t>(chunk * 7 + bits));
        const auto enc = encode_vec(x, o);
        const auto chunks = parse(enc, n, o);
        for (size_t c = 0; c < chunks.size(); ++c) {
          const size_t start = c * chunk;
          const size_t len = std::min(chunk, n - start);
          CATCH_REQUIRE(chunks[c].idx == sorted_top_k(x.data() + start, len, sparse_kept(len, o)));
        }
      }
    }
  }
}

CATCH_TEST_CASE("Sparse values decode within half a step, unsent values to 0, signs and extremes exact",
                "[unit][codec]") {
  for (unsigned bits : {2u, 4u}) {
    for (double density : {0.0156, 0.03, 0.25}) {
      const sparse_options o{4096, density, bits};
      const size_t n = 5 * 4096 + 1234;
      std::mt19937 rng(bits);
      std::student_t_distribution<float> heavy(3.0f);
      std::vector<float> x(n);
      for (float& v : x) v = 1e-3f * heavy(rng);
      const auto enc = encode_vec(x, o);
      const auto chunks = parse(enc, n, o);
      std::vector<float> dec(n, 1.0f);
      CATCH_REQUIRE(sparse_decode(enc.data(), enc.size(), n, dec.data(), o));
      double worst = 0.0;  // error / bound over all sent values
      size_t sent = 0;
      for (size_t c = 0; c < chunks.size(); ++c) {
        const auto& ch = chunks[c];
        const size_t start = c * o.chunk;
        const size_t len = std::min(o.chunk, n - start);
        float hi = 0.0f;
        for (size_t i = 0; i < len; ++i) hi = std::max(hi, std::fabs(x[start + i]));
        float kept_min = FLT_MAX;
        for (uint32_t i : ch.idx) kept_min = std::min(kept_min, std::fabs(x[start + i]));
        CATCH_CHECK(ch.lo == kept_min);
        std::vector<bool> kept(len, false);
        for (size_t j = 0; j < ch.idx.size(); ++j) {
          const size_t i = start + ch.idx[j];
          kept[ch.idx[j]] = true;
          ++sent;
          CATCH_CHECK(std::signbit(dec[i]) == std::signbit(x[i]));
          CATCH_CHECK(std::fabs(x[i]) >= ch.lo);  // every kept magnitude is at least lo
          CATCH_CHECK(ch.hi == hi);
          if (std::fabs(x[i]) == hi) CATCH_CHECK(std::fabs(dec[i]) == hi);
          if (std::fabs(x[i]) == ch.lo) CATCH_CHECK(std::fabs(dec[i]) == ch.lo);
          worst = std::max(worst, std::fabs(static_cast<double>(dec[i]) - x[i]) / value_bound(ch, bits));
        }
        for (size_t i = 0; i < len; ++i) {
          if (kept[i]) continue;
          CATCH_CHECK(dec[start + i] == 0.0f);
          CATCH_CHECK(std::fabs(x[start + i]) <= ch.lo);  // what is dropped is no larger than what is kept
        }
      }
      CATCH_INFO("bits " << bits << " density " << density << ": worst error / bound " << worst);
      CATCH_CHECK(worst <= 1.0);
      CATCH_CHECK(worst > 0.5);  // the bound is reached in part, so it is not vacuous
      CATCH_CHECK(sent == 5 * sparse_kept(4096, o) + sparse_kept(1234, o));
    }
  }
}

CATCH_TEST_CASE("Sparse decode_accumulate and decode_subtract add and remove exactly what decode gives",
                "[unit][codec]") {
  const sparse_options o{512, 0.05, 4};
  const size_t n = 2000;
  const auto x = tied_values(n, 3);
  const auto base = tied_values(n, 4);
  const auto enc = encode_vec(x, o);
  std::vector<float> dec(n), acc = base, sub = base;
  CATCH_REQUIRE(sparse_decode(enc.data(), enc.size(), n, dec.data(), o));
  CATCH_REQUIRE(sparse_decode_accumulate(enc.data(), enc.size(), n, acc.data(), o));
  CATCH_REQUIRE(sparse_decode_subtract(enc.data(), enc.size(), n, sub.data(), o));
  for (size_t i = 0; i < n; ++i) {
    CATCH_CHECK(acc[i] == base[i] + dec[i]);
    CATCH_CHECK(sub[i] == base[i] - dec[i]);
  }
}

CATCH_TEST_CASE("Sparse compression at density 0.0156 and 2 bits is over 100x fp32 and over 25x int8",
                "[unit][codec]") {
  const size_t n = 14'000'000;
  const sparse_options o{4096, 0.0156, 2};
  const size_t bytes = sparse_encoded_size(n, o);
  // 4096 values: k = 64, 8 header bytes, 64 12-bit indices (96 bytes), 64 2-bit codes (16 bytes).
  CATCH_CHECK(sparse_encoded_size(4096, o) == 120);
  CATCH_CHECK(sparse_encoded_size(0, o) == 0);
  const double vs_fp32 = 4.0 * static_cast<double>(n) / static_cast<double>(bytes);
  const double vs_int8 =
      static_cast<double>(longwave::comm::encoded_size(longwave::comm::wire_dtype::int8, n)) / bytes;
  CATCH_WARN("sparse (density 0.0156, 2 bits) is " << vs_fp32 << "x smaller than fp32, " << vs_int8
                                                   << "x smaller than int8");
  CATCH_CHECK(vs_fp32 >= 100.0);
  CATCH_CHECK(vs_int8 >= 25.0);
}

CATCH_TEST_CASE("Sparse error feedback keeps exactly what the message did not carry", "[unit][codec]") {
  const size_t n = 3 * 1024 + 100;
  for (float decay : {0.0f, 0.9f, 1.0f}) {
    const sparse_options o{1024, 0.03, 2};
    sparse_error_feedback ef(n + 10, decay);
    std::vector<double> true_sum(n, 0.0), sent_sum(n, 0.0);
    std::vector<std::byte> enc(sparse_encoded_size(n, o));
    std::vector<float> dec(n);
    for (int round = 0; round < 50; ++round) {
      const auto delta = tied_values(n, 100 + round);
      const std::vector<float> e_old(ef.residual().begin() + 10, ef.residual().end());
      CATCH_REQUIRE(ef.encode(delta.data(), n, 10, enc.data(), o));
      CATCH_REQUIRE(sparse_decode(enc.data(), enc.size(), n, dec.data(), o));
      double worst = 0.0;
      for (size_t i = 0; i < n; ++i) {
        const float v = decay * e_old[i] + delta[i];
        const float e_new = ef.residual()[10 + i];
        // e_new = fl(v - decoded): exact up to one rounding of v's size.
        worst = std::max(
            worst, std::fabs(static_cast<double>(e_new) + dec[i] - v) / std::max(std::fabs(v), FLT_MIN));
        if (dec[i] == 0.0f) CATCH_REQUIRE(e_new == v);
        true_sum[i] += delta[i];
        sent_sum[i] += dec[i];
      }
      CATCH_REQUIRE(worst <= 0x1p-23);
    }
    CATCH_CHECK(
        std::all_of(ef.residual().begin(), ef.residual().begin() + 10, [](float v) { return v == 0; }));
    if (decay == 1.0f) {
      // With no decay nothing is lost: what was sent plus what is held equals the sum of all deltas.
      double worst = 0.0;
      for (size_t i = 0; i < n; ++i) {
        worst = std::max(worst, std::fabs(sent_sum[i] + ef.residual()[10 + i] - true_sum[i]));
      }
      CATCH_CHECK(worst < 1e-8);
    }
  }
  sparse_error_feedback ef(4, 0.5f);
  const float big[4] = {1, 2, 3, 4};
  std::vector<std::byte> enc(sparse_encoded_size(4, {4, 0.5, 2}));
  CATCH_REQUIRE(ef.encode(big, 4, 0, enc.data(), {4, 0.5, 2}));
  CATCH_CHECK(ef.residual()[0] == 1.0f);  // 1 and 2 were not sent
  CATCH_CHECK(ef.residual()[3] == 0.0f);  // 4 = hi is sent exactly
  ef.reset();
  CATCH_CHECK(ef.residual() == std::vector<float>(4, 0.0f));
}

CATCH_TEST_CASE("Non-finite input poisons its chunk: the encoder says so and every decoder refuses it",
                "[unit][codec]") {
  const sparse_options o{64, 0.1, 4};
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity(), FLT_MAX}) {
    auto x = tied_values(200, 9);
    x[130] = bad;
    // FLT_MAX is finite: its chunk is sent, and decodes to a finite value.
    std::vector<std::byte> enc(sparse_encoded_size(x.size(), o));
    const bool ok = sparse_encode(x.data(), x.size(), enc.data(), o);
    std::vector<float> dec(x.size(), 5.0f);
    std::string why;
    const bool decoded = sparse_decode(enc.data(), enc.size(), x.size(), dec.data(), o, &why);
    CATCH_CHECK(decoded == ok);
    CATCH_CHECK(ok == (bad == FLT_MAX));
    if (bad != FLT_MAX) {
      CATCH_CHECK(why.find("chunk 2: bad scale") == 0);
      CATCH_CHECK(dec == std::vector<float>(x.size(), 5.0f));
    } else {
      CATCH_CHECK(std::all_of(dec.begin(), dec.end(), [](float v) { return std::isfinite(v); }));
      CATCH_CHECK(dec[130] == FLT_MAX);
    }
    sparse_error_feedback ef(x.size(), 1.0f);
    CATCH_CHECK(ef.encode(x.data(), x.size(), 0, enc.data(), o) == ok);
  }
}

CATCH_TEST_CASE("Malformed sparse messages are refused with their reason and the output untouched",
                "[unit][codec]") {
  const sparse_options o{100, 0.05, 2};  // k = 5 of 100, 7-bit indices (35 bits: 5 padding bits)
  const size_t n = 250;                  // chunks of 100, 100, 50 (k = 3 of 50, 6-bit indices)
  const auto x = tied_values(n, 11);
  const auto good = encode_vec(x, o);
  CATCH_REQUIRE(good.size() == 2 * (8 + 5 + 2) + (8 + 3 + 1));
  const auto refused = [&](std::vector<std::byte> bytes, const std::string& reason, size_t count = 0) {
    if (count == 0) count = n;
    std::vector<float> out(n, 3.0f);
    std::string why;
    const bool ok = sparse_decode(bytes.data(), bytes.size(), count, out.data(), o, &why);
    std::vector<float> acc(n, 3.0f);
    const bool ok_acc = sparse_decode_accumulate(bytes.data(), bytes.size(), count, acc.data(), o);
    CATCH_INFO("expected: " << reason << "; got: " << why);
    CATCH_CHECK_FALSE(ok);
    CATCH_CHECK_FALSE(ok_acc);
    CATCH_CHECK(why.find(reason) != std::string::npos);
    CATCH_CHECK(out == std::vector<float>(n, 3.0f));
    CATCH_CHECK(acc == std::vector<float>(n, 3.0f));
  };
  const auto set_float = [](std::vector<std::byte> b, size_t at, float v) {
    std::memcpy(b.data() + at, &v, 4);
    return b;
  };
  const auto set_byte = [](std::vector<std::byte> b, size_t at, uint8_t v) {
    b[at] = std::byte{v};
    return b;
  };
  auto shorter = good;
  shorter.pop_back();
  refused(shorter, "expected");
  auto longer = good;
  longer.push_back(std::byte{0});
  refused(longer, "expected");
  refused(good, "expected", n - 1);
  refused({}, "expected");
  for (float s : {std::nanf(""), INFINITY, -1.0f, -0.0f, FLT_MAX}) {
    refused(set_float(good, 15, s), "chunk 1: bad scale");  // lo of chunk 1 (FLT_MAX: above hi)
    if (s != FLT_MAX) refused(set_float(good, 34, s), "chunk 2: bad scale");  // hi of chunk 2
  }
  refused(set_float(good, 34, 0.0f), "chunk 2: bad scale");  // hi below lo
  // Chunk 2 (50 values): its first index set to 63 (6 bits), out of range.
  refused(set_byte(good, 38, static_cast<uint8_t>((std::to_integer<uint8_t>(good[38]) | 0x3f))), "outside");
  // Chunk 0: the second index made equal to the first.
  {
    auto b = good;
    const uint32_t first = std::to_integer<uint32_t>(b[8]) & 0x7f;
    uint64_t bits = 0;
    std::memcpy(&bits, b.data() + 8, 5);
    bits = (bits & ~(uint64_t{0x7f} << 7)) | (uint64_t{first} << 7);
    std::memcpy(b.data() + 8, &bits, 5);
    refused(b, "not increasing");
  }
  refused(set_byte(good, 12, std::to_integer<uint8_t>(good[12]) | 0x80),
          "padding");  // index padding, chunk 0
  refused(set_byte(good, 14, std::to_integer<uint8_t>(good[14]) | 0x80), "padding");  // code padding, chunk 0
  std::vector<float> out(n);
  CATCH_CHECK(sparse_decode(good.data(), good.size(), n, out.data(), o));
}

CATCH_TEST_CASE("Random mutations and truncations of a sparse message never decode out of bounds",
                "[unit][codec]") {
  const sparse_options o{64, 0.1, 4};
  const size_t n = 3 * 64 + 17;
  const auto good = encode_vec(tied_values(n, 21), o);
  std::mt19937 rng(5);
  int accepted = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    auto b = good;
    switch (trial % 4) {
      case 0: b[rng() % b.size()] ^= std::byte{static_cast<uint8_t>(1u << (rng() % 8))}; break;
      case 1:
        for (int m = 0; m < 4; ++m) b[rng() % b.size()] = std::byte{static_cast<uint8_t>(rng())};
        break;
      case 2: b.resize(rng() % b.size()); break;
      default: b.resize(b.size() + 1 + rng() % 8, std::byte{static_cast<uint8_t>(rng())}); break;
    }
    // An exact-size copy, so ASan sees any read past the message.
    std::vector<std::byte> exact(b.begin(), b.end());
    std::vector<float> out(n, 0.0f);
    std::string why;
    if (sparse_decode(exact.data(), exact.size(), n, out.data(), o, &why)) {
      ++accepted;
      CATCH_REQUIRE(std::all_of(out.begin(), out.end(), [](float v) { return std::isfinite(v); }));
    } else {
      CATCH_REQUIRE_FALSE(why.empty());
      CATCH_REQUIRE(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }));
    }
  }
  CATCH_INFO("accepted " << accepted << " of 5000 mutations");
  CATCH_CHECK(accepted < 5000);
}

CATCH_TEST_CASE(
    "error feedback on a vector large enough for several encode threads gives the bytes of one pass",
    "[unit][comm][sparse]") {
  // 3M values and a partial last chunk: the ranges split at whole chunks, each written at its own offset.
  sparse_options o;
  o.chunk = 4096;
  o.density = 0.02;
  const size_t n = (size_t{3} << 20) + 1234;
  std::mt19937 rng(21);
  std::normal_distribution<float> gauss(0.f, 1.f);
  std::vector<float> e0(n), delta(n);
  for (auto& v : e0) v = gauss(rng);
  for (auto& v : delta) v = gauss(rng);
  sparse_error_feedback ef(e0, 0.9f);
  std::vector<std::byte> got(sparse_encoded_size(n, o));
  CATCH_REQUIRE(ef.encode(delta.data(), n, 0, got.data(), o));
  // The reference, serially: e = 0.9 e0 + delta, its encoding, and e minus its own decoding.
  std::vector<float> e(n);
  for (size_t i = 0; i < n; ++i) e[i] = 0.9f * e0[i] + delta[i];
  const auto want = encode_vec(e, o);
  CATCH_CHECK(got == want);
  CATCH_REQUIRE(sparse_decode_subtract(want.data(), want.size(), n, e.data(), o));
  CATCH_CHECK(ef.residual() == e);
  // A NaN in the last range poisons the message and leaves every value at decay * e_old + delta.
  delta[n - 5] = std::numeric_limits<float>::quiet_NaN();
  const auto before = ef.residual();
  CATCH_CHECK_FALSE(ef.encode(delta.data(), n, 0, got.data(), o));
  for (size_t i : {size_t{0}, n / 2, n - 6}) CATCH_CHECK(ef.residual()[i] == 0.9f * before[i] + delta[i]);
}
