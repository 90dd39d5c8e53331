// Wire codecs: chunk headers (int8 block scales, codebook table), validation of peer data and the choice of
// the kernel level. The per-level kernels are in codec_scalar.cpp, codec_avx2.cpp and codec_avx512.cpp.
#include "comm/codec.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "comm/codec_kernels.hpp"
#include "runtime/errors/errors.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire format is little-endian");
static_assert(sizeof(float) == 4, "fp32 is 4 bytes");

namespace longwave::comm {
namespace {

using detail::bits_of;
using detail::codec_kernels;
using detail::float_of;
using detail::simd_isa;

constexpr size_t codebook_bins = 256;
constexpr size_t codebook_header_bytes = codebook_bins * 4;
constexpr uint32_t poison_bits = 0x7fc00000u;  // quiet NaN: the header of a non-finite int8 chunk

// memcpy with a null pointer is undefined even for 0 bytes; n == 0 chunks may come with null pointers.
void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

void zero_bytes(void* dst, size_t bytes) {
  if (bytes != 0) std::memset(dst, 0, bytes);
}

/// The dense dtypes this file codes chunk by chunk (sparse messages are sparse_codec.hpp's).
bool valid_dtype(wire_dtype dt) {
  return static_cast<uint8_t>(dt) <= static_cast<uint8_t>(wire_dtype::int8);
}

// --- int8, symmetric per-block scales -------------------------------------------------------------------
// Header = fp32 scale s_b of each block of int8_block values, then n int8 codes q, x^ = q * s_b.

constexpr size_t scale_bytes = 4;

size_t int8_blocks(size_t n) {
  return n / int8_block + (n % int8_block != 0 ? 1 : 0);
}

void poison_int8_blocks(std::byte* dst, size_t n) {
  const size_t nb = int8_blocks(n);
  const float poison = float_of(poison_bits);
  for (size_t b = 0; b < nb; ++b) std::memcpy(dst + scale_bytes * b, &poison, scale_bytes);
  zero_bytes(dst + scale_bytes * nb, n);
}

// The level's kernel walks all blocks (scales by detail::int8_block_scale, the one copy of the rule).
void encode_int8_blocks(const codec_kernels& k, const float* src, size_t n, std::byte* dst) {
  if (!k.int8_encode_blocks(src, n, dst, dst + scale_bytes * int8_blocks(n))) {
    poison_int8_blocks(dst, n);  // the whole chunk: every decoder rejects it
  }
}

// +0, or a normal float up to int8_max_scale; rejects NaN, inf, negatives (-0 too), denormals, huge values.
bool valid_scale(float s) {
  return bits_of(s) == 0u || (s >= FLT_MIN && s <= detail::int8_max_scale);
}

bool decode_int8_blocks(const codec_kernels& k, const std::byte* src, size_t n, float* out, bool add) {
  const size_t nb = int8_blocks(n);
  // Every scale first, so that a bad one leaves out untouched.
  for (size_t b = 0; b < nb; ++b) {
    float scale;
    std::memcpy(&scale, src + scale_bytes * b, scale_bytes);
    if (!valid_scale(scale)) return false;
  }
  k.int8_decode_blocks(src + scale_bytes * nb, src, n, out, add);
  return true;
}

// --- int8, codebook: header = 256 fp32 bin values, then n uint8 codes b, x^ = table[b] ----------------
//
// Codes are defined in double: pos = min(2^28 - 1, trunc((x - min) * 2^28 / (max - min))), b = pos >> 20; the
// SIMD levels compute them in fp32 with a margin and fall back to double near bin edges, which gives the same
// codes (CODEC.md). table[b] = min + mean(pos) * (max - min) / 2^28 over the values of bin b in a fixed
// subsample of the chunk (every sample_stride-th value), so every entry lies in its bin. Exact integer sums
// over a subsample defined by index: the same table on every level.

// Values per codebook_codes call (32 KiB of input, still in L1/L2 for the samples that follow); large enough
// that the call's set-up does not show.
constexpr size_t codebook_block = 8192;

// Every stride-th value of a chunk (index 0, stride, 2 stride, ...) goes into the bin means: 1 for chunks of
// fewer than 2^16 values, then the largest power of two <= n / 2^15, at most 16, so at least 2^15 values are
// sampled. Exact per-value sums cost about 1 ns per value (a scattered add each), more than the rest of the
// encode; a 1 MiB chunk (~2^20 values) samples 65536, 256 per bin on average.
size_t sample_stride(size_t n) {
  size_t s = 1;
  while (s < 16 && (n >> 15) >= 2 * s) s *= 2;
  return s;
}

// Bin sums of the samples. Each entry packs count << 42 | sum of positions: one 64-bit add per sample.
// pos < 2^28, so up to 16384 samples per entry keep the sum below 2^42. Two sets (alternate samples) so that
// consecutive samples in one bin do not all wait on one store. Exact integers: the order does not matter.
struct bin_sums {
  static constexpr int count_shift = detail::codebook_count_shift;
  static constexpr size_t capacity = 16384;  // samples between flushes (all in one set at worst)

  uint64_t packed[2][codebook_bins] = {};
  uint64_t count[codebook_bins] = {};
  double pos_sum[codebook_bins] = {};
  uint32_t pos[codebook_block];  // positions of one block's samples
  size_t pending = 0;

  // The samples of one block, src[0], src[stride], ...: positions from the kernel (or from codes_sample16,
  // fused with the codes, if `fused`), then one add each. False if codes_sample16 found a NaN.
  bool add_block(const codec_kernels& k, const float* src, size_t len, size_t stride,
                 const detail::codebook_map& m, std::byte* codes, bool fused) {
    if (pending + codebook_block > capacity) flush();
    const size_t count = (len + stride - 1) / stride;
    if (fused) {
      if (!k.codebook_codes_sample16(src, len, m, codes, pos)) return false;
    } else {
      k.codebook_sample_pos(src, count, stride, m, pos);
    }
    // Locals, so that the loop does not reload anything through the stores into `packed`.
    uint64_t* set0 = packed[0];
    uint64_t* set1 = packed[1];
    constexpr uint64_t one = uint64_t{1} << count_shift;
    size_t j = 0;
    for (; j + 2 <= count; j += 2) {
      set0[pos[j] >> 20] += one + pos[j];
      set1[pos[j + 1] >> 20] += one + pos[j + 1];
    }
    if (j < count) set0[pos[j] >> 20] += one + pos[j];
    pending += count;
    return true;
  }

  void flush() {
    constexpr uint64_t sum_mask = (uint64_t{1} << count_shift) - 1;
    for (size_t b = 0; b < codebook_bins; ++b) {
      for (auto& set : packed) {
        count[b] += set[b] >> count_shift;
        pos_sum[b] += static_cast<double>(set[b] & sum_mask);
        set[b] = 0;
      }
    }
    pending = 0;
  }
};

void poison_codebook(std::byte* dst, size_t n) {
  float table[codebook_bins];
  for (float& t : table) t = float_of(poison_bits);
  std::memcpy(dst, table, sizeof table);
  zero_bytes(dst + codebook_header_bytes, n);
}

void encode_int8_codebook(const codec_kernels& k, const float* src, size_t n, std::byte* dst) {
  float table[codebook_bins] = {};
  std::byte* codes = dst + codebook_header_bytes;
  if (n == 0) {
    std::memcpy(dst, table, sizeof table);
    return;
  }
  // lo and hi skip NaN (unless src[0] is NaN: then both are NaN); codebook_codes reports the others.
  const detail::min_max mm = k.find_min_max(src, n);
  if (!(mm.lo > -HUGE_VALF && mm.hi < HUGE_VALF)) {  // NaN or inf
    poison_codebook(dst, n);
    return;
  }
  // + 0.0f turns -0 into +0: which zero a min/max returns depends on the order of the comparisons.
  const float lo = mm.lo + 0.0f;
  const float hi = mm.hi + 0.0f;
  const double range = static_cast<double>(hi) - static_cast<double>(lo);  // no overflow in double
  if (range == 0.0) {
    // A constant chunk: every value in bin 0, table[0] = lo, exact. Only a NaN elsewhere could spoil it.
    if (k.abs_max(src, n) >= 0x7f800000u) {
      poison_codebook(dst, n);
      return;
    }
    for (size_t b = 0; b < codebook_bins; ++b) {
      table[b] = static_cast<float>(lo + (static_cast<double>(b) + 0.5) * (range / codebook_bins));
    }
    std::memcpy(dst, table, sizeof table);
    zero_bytes(codes, n);
    return;
  }
  detail::codebook_map m{};
  m.lo = lo;
  m.scale = 0x1p28 / range;
  m.lo32 = lo;
  // The fp32 fast path needs hi - lo finite in fp32 and not so small that 256 / (hi - lo) overflows or that
  // flushing denormals (DAZ/FTZ) could move a value by more than 2^-18 of a bin (CODEC.md).
  const float range32 = hi - lo;
  m.fast = range32 < HUGE_VALF && range32 >= 0x1p-100f;
  if (m.fast) m.s8 = 256.0f / range32;
  const size_t stride = sample_stride(n);
  auto sums = std::make_unique<bin_sums>();
  // AVX-512 computes the positions of stride-16 samples in its code loop (no pass of their own).
  const bool fused = k.codebook_codes_sample16 != nullptr && m.fast && stride == 16;
  for (size_t b = 0; b < n; b += codebook_block) {
    const size_t len = std::min(n - b, codebook_block);
    if (!fused && !k.codebook_codes(src + b, len, m, codes + b)) {
      poison_codebook(dst, n);
      return;
    }
    // codebook_block is a multiple of every stride, so the samples of a block start at its first value.
    if (!sums->add_block(k, src + b, len, stride, m, codes + b, fused)) {
      poison_codebook(dst, n);
      return;
    }
  }
  sums->flush();
  for (size_t b = 0; b < codebook_bins; ++b) {
    // The mean of the bin's samples; a bin without samples gets its centre. Both lie in the bin.
    const double v = sums->count[b] != 0
                         ? lo + sums->pos_sum[b] / static_cast<double>(sums->count[b]) * (range * 0x1p-28)
                         : lo + (static_cast<double>(b) + 0.5) * (range / codebook_bins);
    float t = static_cast<float>(v);
    t = t < lo ? lo : (t > hi ? hi : t);  // the exact value lies in [lo, hi]; keeps rounding from leaving it
    table[b] = t;
  }
  std::memcpy(dst, table, sizeof table);
}

bool decode_int8_codebook(const codec_kernels& k, const std::byte* src, size_t n, float* out, bool add) {
  float table[codebook_bins];
  std::memcpy(table, src, sizeof table);
  for (float t : table) {
    if ((bits_of(t) & 0x7f800000u) == 0x7f800000u) return false;  // NaN or inf
  }
  if (add) {
    k.uint8_lookup_add(src + codebook_header_bytes, n, table, out);
  } else {
    k.uint8_lookup(src + codebook_header_bytes, n, table, out);
  }
  return true;
}

bool decode_impl(const codec_kernels& k, wire_dtype dt, const std::byte* src, size_t bytes, size_t n,
                 float* out, const codec_options& o, bool add) {
  if (!valid_dtype(dt) || bytes != encoded_size(dt, n, o)) return false;
  switch (dt) {
    case wire_dtype::fp32:
      if (add) {
        k.fp32_add(src, n, out);
      } else {
        copy_bytes(out, src, bytes);
      }
      return true;
    case wire_dtype::fp16: (add ? k.fp16_add : k.fp16_decode)(src, n, out); return true;
    case wire_dtype::bf16: (add ? k.bf16_add : k.bf16_decode)(src, n, out); return true;
    case wire_dtype::int8:
      return o.int8_codebook ? decode_int8_codebook(k, src, n, out, add)
                             : decode_int8_blocks(k, src, n, out, add);
    case wire_dtype::sparse: return false;
  }
  return false;
}

}  // namespace

size_t encoded_size(wire_dtype dt, size_t n, const codec_options& o) {
  constexpr size_t max = SIZE_MAX;
  switch (dt) {
    case wire_dtype::fp32: return n <= max / 4 ? 4 * n : max;
    case wire_dtype::fp16:
    case wire_dtype::bf16: return n <= max / 2 ? 2 * n : max;
    case wire_dtype::int8: {
      // int8_blocks(n) <= max / int8_block + 1, so the plain header cannot overflow.
      const size_t header = o.int8_codebook ? codebook_header_bytes : scale_bytes * int8_blocks(n);
      return n <= max - header ? header + n : max;
    }
    case wire_dtype::sparse: return max;  // not a chunk codec: sparse_encoded_size
  }
  return max;
}

void encode(wire_dtype dt, const float* src, size_t n, std::byte* dst, const codec_options& o) {
  detail::encode(detail::active_isa(), dt, src, n, dst, o);
}

bool decode_accumulate(wire_dtype dt, const std::byte* src, size_t bytes, size_t n, float* acc,
                       const codec_options& o) {
  return detail::decode_accumulate(detail::active_isa(), dt, src, bytes, n, acc, o);
}

bool decode(wire_dtype dt, const std::byte* src, size_t bytes, size_t n, float* dst, const codec_options& o) {
  return detail::decode(detail::active_isa(), dt, src, bytes, n, dst, o);
}

const char* simd_level() {
  return to_string(detail::active_isa());
}

namespace detail {

const codec_kernels& kernels_for(simd_isa isa) {
  LW_ASSERT(isa_supported(isa), std::string("codec kernel level not supported here: ") + to_string(isa));
  switch (isa) {
    case simd_isa::avx2: return *avx2_kernels();
    case simd_isa::avx512: return *avx512_kernels();
    case simd_isa::scalar: break;
  }
  return scalar_kernels();
}

const char* to_string(simd_isa isa) {
  switch (isa) {
    case simd_isa::scalar: return "scalar";
    case simd_isa::avx2: return "avx2";
    case simd_isa::avx512: return "avx512";
  }
  return "invalid";
}

std::optional<simd_isa> parse_simd_isa(std::string_view s) {
  for (simd_isa isa : {simd_isa::scalar, simd_isa::avx2, simd_isa::avx512}) {
    if (s == to_string(isa)) return isa;
  }
  return std::nullopt;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// CPUID leaf 1, ECX bit 29: clang 14's __builtin_cpu_supports does not know "f16c" (GCC's does).
static bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
#endif

bool isa_supported(simd_isa isa) {
  switch (isa) {
    case simd_isa::scalar: return true;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    case simd_isa::avx2:
      __builtin_cpu_init();
      return avx2_kernels() != nullptr && __builtin_cpu_supports("avx2") && cpu_has_f16c();
    case simd_isa::avx512:
      __builtin_cpu_init();
      return avx512_kernels() != nullptr && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
    case simd_isa::avx2:
    case simd_isa::avx512: return false;
#endif
  }
  return false;
}

simd_isa select_isa(const char* env_value) {
  simd_isa want = simd_isa::avx512;
  if (env_value != nullptr && *env_value != '\0') {
    if (auto parsed = parse_simd_isa(env_value)) want = *parsed;
  }
  for (int level = static_cast<int>(want); level > 0; --level) {
    if (isa_supported(static_cast<simd_isa>(level))) return static_cast<simd_isa>(level);
  }
  return simd_isa::scalar;
}

simd_isa active_isa() {
  static const simd_isa isa = [] {
    const char* env = std::getenv("LONGWAVE_SIMD");
    const simd_isa chosen = select_isa(env);
    if (env != nullptr && *env != '\0') {
      const auto want = parse_simd_isa(env);
      if (!want) {
        std::fprintf(stderr, "longwave: LONGWAVE_SIMD=%s is not one of scalar, avx2, avx512; using %s\n", env,
                     to_string(chosen));
      } else if (*want != chosen) {
        std::fprintf(stderr, "longwave: LONGWAVE_SIMD=%s is not supported by this CPU; using %s\n", env,
                     to_string(chosen));
      }
    }
    return chosen;
  }();
  return isa;
}

void encode(simd_isa isa, wire_dtype dt, const float* src, size_t n, std::byte* dst, const codec_options& o) {
  LW_ASSERT(valid_dtype(dt), "encode: not a wire_dtype value: " + std::to_string(static_cast<int>(dt)));
  const codec_kernels& k = kernels_for(isa);
  switch (dt) {
    case wire_dtype::fp32: copy_bytes(dst, src, 4 * n); return;
    case wire_dtype::fp16: k.fp16_encode(src, n, dst); return;
    case wire_dtype::bf16: k.bf16_encode(src, n, dst); return;
    case wire_dtype::int8:
      if (o.int8_codebook) {
        encode_int8_codebook(k, src, n, dst);
      } else {
        encode_int8_blocks(k, src, n, dst);
      }
      return;
    case wire_dtype::sparse: return;  // refused by the assertion above
  }
}

bool decode_accumulate(simd_isa isa, wire_dtype dt, const std::byte* src, size_t bytes, size_t n, float* acc,
                       const codec_options& o) {
  return decode_impl(kernels_for(isa), dt, src, bytes, n, acc, o, true);
}

bool decode(simd_isa isa, wire_dtype dt, const std::byte* src, size_t bytes, size_t n, float* dst,
            const codec_options& o) {
  return decode_impl(kernels_for(isa), dt, src, bytes, n, dst, o, false);
}

}  // namespace detail

}  // namespace longwave::comm
