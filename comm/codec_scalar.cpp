// Portable codec kernels: the reference every SIMD level must match bit for bit, and the SIMD levels' tails.
// Integer-only fp16/bf16 conversions, so the result does not depend on the FP environment (DAZ, FTZ).
#include <cstring>

#include "comm/codec_kernels.hpp"

namespace longwave::comm::detail {
namespace {

uint16_t load_u16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

void store_u16(std::byte* p, uint16_t v) {
  std::memcpy(p, &v, sizeof v);
}

// GCC contracts a * b + c into one FMA whenever the target has FMA (even with -std=c++17), which rounds once
// instead of twice and would make this level differ from the others. The empty asm keeps the product an
// fp32 value. Only needed when this file itself is compiled for an FMA target (-march=native, AArch64).
inline float keep_rounded(float v) {
#if defined(__FMA__) || defined(__FP_FAST_FMAF)
#if defined(__x86_64__) || defined(__i386__)
  __asm__("" : "+x"(v));
#elif defined(__aarch64__)
  __asm__("" : "+w"(v));
#else
  volatile float t = v;
  v = t;
#endif
#endif
  return v;
}

// IEEE binary16, round to nearest even. Finite values at or beyond 65520 (which would round to inf) saturate
// to +-65504; inf stays inf; NaN becomes a quiet NaN keeping the sign and the top 10 payload bits (what
// F16C's vcvtps2ph does). Branch-free so that the compiler vectorizes it; no step depends on the rounding
// mode, DAZ or FTZ.
uint16_t float_to_half(float f) {
  const uint32_t x = bits_of(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  // |f| >= 2^-14, a normal half: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest
  // even in one add.
  const uint32_t normal = (ax - 0x38000000u + 0xfffu + ((ax >> 13) & 1u)) >> 13;
  // |f| < 2^-14, a subnormal half in units of 2^-24: v = |f| * 2^24 < 1024 is exact, as are its integer part
  // w and fraction; frac - 1/2 is exact in sign and zero only on a tie, so rounding to nearest even needs no
  // float comparison. (Clamping ax first keeps v finite.)
  const float v = float_of(ax < 0x38800000u ? ax : 0x38800000u) * 0x1p24f;
  const auto w = static_cast<uint32_t>(static_cast<int32_t>(v));
  const uint32_t d = bits_of((v - static_cast<float>(static_cast<int32_t>(w))) - 0.5f);
  const auto above_half = static_cast<uint32_t>(static_cast<int32_t>(d) > 0);
  const auto tie = static_cast<uint32_t>((d << 1) == 0);  // +0 or -0
  const uint32_t subnormal = w + (above_half | (tie & w & 1u));
  // Select with masks, not ?:, so no float operation sits on a conditional path (with -ftrapping-math that
  // would stop the vectorizer).
  const uint32_t is_sub = 0u - static_cast<uint32_t>(ax < 0x38800000u);
  const uint32_t is_sat = 0u - static_cast<uint32_t>(ax >= 0x477ff000u && ax < 0x7f800000u);  // |f| >= 65520
  const uint32_t is_inf = 0u - static_cast<uint32_t>(ax == 0x7f800000u);
  const uint32_t is_nan = 0u - static_cast<uint32_t>(ax > 0x7f800000u);
  const uint32_t is_normal = ~(is_sub | is_sat | is_inf | is_nan);
  const uint32_t h = (subnormal & is_sub) | (normal & is_normal) | (0x7bffu & is_sat) | (0x7c00u & is_inf) |
                     ((0x7e00u | ((ax >> 13) & 0x3ffu)) & is_nan);
  return static_cast<uint16_t>(sign | h);
}

// Exact. NaN is quieted (the top payload bit set), as F16C's vcvtph2ps does. Subnormal halves m * 2^-24 are
// float(m) * 2^-24, exact and a normal float. Branch-free so that the compiler vectorizes it.
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  const uint32_t normal = ((e + 112) << 23) | (m << 13);
  const uint32_t special = 0x7f800000u | (m << 13) | (m != 0 ? 0x400000u : 0u);
  const uint32_t subnormal = bits_of(static_cast<float>(static_cast<int32_t>(m)) * 0x1p-24f);
  // Select with masks, not ?:, so no float operation sits on a conditional path (see float_to_half).
  const uint32_t is_sub = 0u - static_cast<uint32_t>(e == 0);
  const uint32_t is_special = 0u - static_cast<uint32_t>(e == 0x1f);
  return float_of(sign | (subnormal & is_sub) | (special & is_special) | (normal & ~(is_sub | is_special)));
}

// bfloat16 exactly as c10::BFloat16(float): round to nearest even of the top 16 bits, any NaN -> 0x7fc0.
// Finite values within half a bf16 ulp of FLT_MAX or beyond round to inf, as in torch.
uint16_t float_to_bf16(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float bf16_to_float(uint16_t h) {
  return float_of(static_cast<uint32_t>(h) << 16);
}

void fp32_add(const std::byte* src, size_t n, float* acc) {
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, src + 4 * i, sizeof v);
    acc[i] += v;
  }
}

void fp16_encode(const float* src, size_t n, std::byte* dst) {
  for (size_t i = 0; i < n; ++i) store_u16(dst + 2 * i, float_to_half(src[i]));
}

void fp16_decode(const std::byte* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = half_to_float(load_u16(src + 2 * i));
}

void fp16_add(const std::byte* src, size_t n, float* acc) {
  for (size_t i = 0; i < n; ++i) acc[i] += half_to_float(load_u16(src + 2 * i));
}

void bf16_encode(const float* src, size_t n, std::byte* dst) {
  for (size_t i = 0; i < n; ++i) store_u16(dst + 2 * i, float_to_bf16(src[i]));
}

void bf16_decode(const std::byte* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(load_u16(src + 2 * i));
}

void bf16_add(const std::byte* src, size_t n, float* acc) {
  for (size_t i = 0; i < n; ++i) acc[i] += bf16_to_float(load_u16(src + 2 * i));
}

abs_max_bits abs_max(const float* src, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t a = bits_of(src[i]) & 0x7fffffffu;
    m = a > m ? a : m;
  }
  return m;
}

// NaN never replaces lo or hi (the comparison is false), as in the SIMD levels' min(x, lo).
min_max find_min_max(const float* src, size_t n) {
  min_max r{src[0], src[0]};
  for (size_t i = 0; i < n; ++i) {
    const float x = src[i];
    r.lo = x < r.lo ? x : r.lo;
    r.hi = x > r.hi ? x : r.hi;
  }
  return r;
}

void int8_quantize(const float* src, size_t n, float inv_scale, std::byte* dst) {
  // Adding and subtracting 1.5 * 2^23 rounds |y| <= 2^22 to an integer in the current rounding mode, the
  // same rounding as the SIMD levels' cvtps2dq.
  constexpr float magic = 12582912.0f;
  for (size_t i = 0; i < n; ++i) {
    const float y = keep_rounded(src[i] * inv_scale);
    // |y| <= 127 * (1 + 2^-23) by the caller's scale, so clamping the integer equals clamping y first (as the
    // SIMD levels do), and it vectorizes.
    int32_t q = static_cast<int32_t>((y + magic) - magic);
    q = q < -127 ? -127 : (q > 127 ? 127 : q);
    dst[i] = static_cast<std::byte>(static_cast<uint8_t>(q));
  }
}

float int8_value(std::byte b) {
  return static_cast<float>(static_cast<int8_t>(std::to_integer<uint8_t>(b)));
}

void int8_dequantize(const std::byte* src, size_t n, float scale, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = int8_value(src[i]) * scale;
}

void int8_dequantize_add(const std::byte* src, size_t n, float scale, float* acc) {
  for (size_t i = 0; i < n; ++i) acc[i] += keep_rounded(int8_value(src[i]) * scale);
}

bool int8_encode_blocks(const float* src, size_t n, std::byte* scales, std::byte* codes) {
  return int8_encode_walk(src, n, scales, codes, abs_max, int8_quantize);
}

void int8_decode_blocks(const std::byte* codes, const std::byte* scales, size_t n, float* out, bool add) {
  int8_decode_walk(codes, scales, n, out, add, int8_dequantize, int8_dequantize_add);
}

// The reference: every code by the double definition (the fp32 fast path is only for the SIMD levels).
bool codebook_codes(const float* src, size_t n, const codebook_map& m, std::byte* codes) {
  for (size_t i = 0; i < n; ++i) {
    uint8_t c;
    if (!codebook_code_exact(src[i], m, c)) return false;
    codes[i] = static_cast<std::byte>(c);
  }
  return true;
}

void codebook_sample_pos(const float* src, size_t count, size_t stride, const codebook_map& m,
                         uint32_t* pos) {
  for (size_t j = 0; j < count; ++j) pos[j] = codebook_pos_exact(src[j * stride], m);
}

void uint8_lookup(const std::byte* src, size_t n, const float* table, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = table[std::to_integer<uint8_t>(src[i])];
}

void uint8_lookup_add(const std::byte* src, size_t n, const float* table, float* acc) {
  for (size_t i = 0; i < n; ++i) acc[i] += table[std::to_integer<uint8_t>(src[i])];
}

}  // namespace

const codec_kernels& scalar_kernels() {
  static const codec_kernels k{simd_isa::scalar,
                               fp32_add,
                               fp16_encode,
                               fp16_decode,
                               fp16_add,
                               bf16_encode,
                               bf16_decode,
                               bf16_add,
                               abs_max,
                               find_min_max,
                               int8_encode_blocks,
                               int8_decode_blocks,
                               int8_quantize,
                               int8_dequantize,
                               int8_dequantize_add,
                               codebook_codes,
                               codebook_sample_pos,
                               nullptr,
                               uint8_lookup,
                               uint8_lookup_add};
  return k;
}

}  // namespace longwave::comm::detail
