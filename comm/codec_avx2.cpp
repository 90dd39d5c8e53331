// AVX2 + F16C codec kernels, compiled with function target attributes (the library has no -mavx2) and chosen
// at run time. Tails shorter than one step go to the scalar kernels, which give the same bits.
#include "comm/codec_kernels.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define LW_AVX2 __attribute__((target("avx2,f16c")))

namespace longwave::comm::detail {
namespace {

// Keeps a product rounded to fp32: GCC would otherwise contract mul + add into an FMA where the target has
// it.
LW_AVX2 inline __m256 keep_rounded(__m256 v) {
  __asm__("" : "+x"(v));
  return v;
}

LW_AVX2 inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

LW_AVX2 inline float hmin(__m256 v) {
  __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_min_ps(m, _mm_movehl_ps(m, m));
  m = _mm_min_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

LW_AVX2 inline uint32_t hmax_u32(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
}

LW_AVX2 void fp32_add(const std::byte* src, size_t n, float* acc) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 4 * i));
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), v));
  }
  scalar_kernels().fp32_add(src + 4 * i, n - i, acc + i);
}

// Saturates finite values to +-65504 before vcvtps2ph (which would give inf), keeping inf and NaN.
// max/min return their second operand when one is NaN, so x goes second to carry NaN through.
LW_AVX2 inline __m128i to_half(__m256 x) {
  const __m256 lim = _mm256_set1_ps(65504.0f);
  const __m256 neg_lim = _mm256_set1_ps(-65504.0f);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000));
  __m256 c = _mm256_min_ps(lim, _mm256_max_ps(neg_lim, x));
  c = _mm256_blendv_ps(c, x, _mm256_cmp_ps(_mm256_and_ps(x, abs_mask), inf, _CMP_EQ_OQ));
  return _mm256_cvtps_ph(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

LW_AVX2 void fp16_encode(const float* src, size_t n, std::byte* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), to_half(_mm256_loadu_ps(src + i)));
  }
  scalar_kernels().fp16_encode(src + i, n - i, dst + 2 * i);
}

LW_AVX2 inline __m256 load_half(const std::byte* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

LW_AVX2 void fp16_decode(const std::byte* src, size_t n, float* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_half(src + 2 * i));
  scalar_kernels().fp16_decode(src + 2 * i, n - i, dst + i);
}

LW_AVX2 void fp16_add(const std::byte* src, size_t n, float* acc) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), load_half(src + 2 * i)));
  }
  scalar_kernels().fp16_add(src + 2 * i, n - i, acc + i);
}

// Round to nearest even of the top 16 bits, NaN -> 0x7fc0 (c10::BFloat16), in the low half of each lane.
LW_AVX2 inline __m256i to_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc00000), nan);
  return _mm256_srli_epi32(r, 16);
}

LW_AVX2 void bf16_encode(const float* src, size_t n, std::byte* dst) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    // packus works per 128-bit lane: [a0-3 b0-3 | a4-7 b4-7] -> reorder the 64-bit quarters.
    const __m256i p =
        _mm256_packus_epi32(to_bf16(_mm256_loadu_ps(src + i)), to_bf16(_mm256_loadu_ps(src + i + 8)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i), _mm256_permute4x64_epi64(p, 0xd8));
  }
  scalar_kernels().bf16_encode(src + i, n - i, dst + 2 * i);
}

LW_AVX2 inline __m256 load_bf16(const std::byte* p) {
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}

LW_AVX2 void bf16_decode(const std::byte* src, size_t n, float* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16(src + 2 * i));
  scalar_kernels().bf16_decode(src + 2 * i, n - i, dst + i);
}

LW_AVX2 void bf16_add(const std::byte* src, size_t n, float* acc) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), load_bf16(src + 2 * i)));
  }
  scalar_kernels().bf16_add(src + 2 * i, n - i, acc + i);
}

// The max of |x|'s bit patterns: exact, order-free, and NaN/inf compare above every finite value.
LW_AVX2 abs_max_bits abs_max(const float* src, size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  __m256i m0 = _mm256_setzero_si256();
  __m256i m1 = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8));
    m0 = _mm256_max_epu32(m0, _mm256_and_si256(a, abs_mask));
    m1 = _mm256_max_epu32(m1, _mm256_and_si256(b, abs_mask));
  }
  const uint32_t m = hmax_u32(_mm256_max_epu32(m0, m1));
  if (i == n) return m;  // every full int8 block
  const uint32_t t = scalar_kernels().abs_max(src + i, n - i);
  return m > t ? m : t;
}

// min(x, lo) returns lo when x is NaN, so NaN is skipped (codebook_codes catches it) unless src[0] is NaN,
// which then stays in every lane. Only min and max per vector: this pass reads the chunk from memory, and
// fewer instructions per cache line keep more loads in flight.
LW_AVX2 min_max find_min_max(const float* src, size_t n) {
  min_max r{src[0], src[0]};
  size_t i = 0;
  if (n >= 16) {
    __m256 lo0 = _mm256_set1_ps(src[0]), lo1 = lo0, hi0 = lo0, hi1 = lo0;
    for (; i + 16 <= n; i += 16) {
      const __m256 x = _mm256_loadu_ps(src + i);
      const __m256 y = _mm256_loadu_ps(src + i + 8);
      lo0 = _mm256_min_ps(x, lo0);
      hi0 = _mm256_max_ps(x, hi0);
      lo1 = _mm256_min_ps(y, lo1);
      hi1 = _mm256_max_ps(y, hi1);
    }
    r = {hmin(_mm256_min_ps(lo0, lo1)), hmax(_mm256_max_ps(hi0, hi1))};
  }
  for (; i < n; ++i) {
    r.lo = src[i] < r.lo ? src[i] : r.lo;
    r.hi = src[i] > r.hi ? src[i] : r.hi;
  }
  return r;
}

// rne(x * inv) as int32, in the current rounding mode (nearest even by default), as the scalar level. The
// clamp to [-127, 127] comes after, on the bytes: the saturating packs, then a max with -127. For
// |x * inv| <= 2^22 that is the same as clamping the product first, at one instruction per 32 codes instead
// of two per 8.
LW_AVX2 inline __m256i quantize8(const float* p, __m256 inv) {
  return _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p), inv));
}

// packs works per 128-bit lane; this permutation puts the four 8-value groups back in order.
LW_AVX2 inline __m256i unshuffle_packed_bytes(__m256i v) {
  return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

LW_AVX2 void int8_quantize(const float* src, size_t n, float inv_scale, std::byte* dst) {
  const __m256 inv = _mm256_set1_ps(inv_scale);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i ab = _mm256_packs_epi32(quantize8(src + i, inv), quantize8(src + i + 8, inv));
    const __m256i cd = _mm256_packs_epi32(quantize8(src + i + 16, inv), quantize8(src + i + 24, inv));
    const __m256i q = unshuffle_packed_bytes(_mm256_packs_epi16(ab, cd));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_max_epi8(q, _mm256_set1_epi8(-127)));
  }
  if (i < n) scalar_kernels().int8_quantize(src + i, n - i, inv_scale, dst + i);
}

LW_AVX2 inline __m256 dequantize8(const std::byte* p, __m256 scale) {
  const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return keep_rounded(_mm256_mul_ps(_mm256_cvtepi32_ps(q), scale));
}

LW_AVX2 void int8_dequantize(const std::byte* src, size_t n, float scale, float* dst) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, dequantize8(src + i, s));
  if (i < n) scalar_kernels().int8_dequantize(src + i, n - i, scale, dst + i);
}

// Four steps per iteration: with one, the loop inlined into int8_decode_blocks ran about 7% slower in cache
// than the former call per block (49 against 53 GB/s); with four, 60 against 57.
LW_AVX2 void int8_dequantize_add(const std::byte* src, size_t n, float scale, float* acc) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 32; k += 8)
      _mm256_storeu_ps(acc + i + k, _mm256_add_ps(_mm256_loadu_ps(acc + i + k), dequantize8(src + i + k, s)));
  }
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), dequantize8(src + i, s)));
  }
  if (i < n) scalar_kernels().int8_dequantize_add(src + i, n - i, scale, acc + i);
}

// The whole chunk in one call, the per-block kernels above inlined (flatten). A full block takes no scalar
// tail; only the chunk's last, shorter block can.
[[gnu::flatten]] LW_AVX2 bool int8_encode_blocks(const float* src, size_t n, std::byte* scales,
                                                 std::byte* codes) {
  return int8_encode_walk(src, n, scales, codes, abs_max, int8_quantize);
}

[[gnu::flatten]] LW_AVX2 void int8_decode_blocks(const std::byte* codes, const std::byte* scales, size_t n,
                                                 float* out, bool add) {
  int8_decode_walk(codes, scales, n, out, add, int8_dequantize, int8_dequantize_add);
}

// The fp32 fast path for 8 values (CODEC.md): t = (x - lo) * s8, c1 = trunc(t - margin), c2 = trunc(t +
// margin). Where c1 == c2 the code is min(255, c2), which equals the double definition; `flag` gets nonzero
// lanes where they differ, or where t is NaN (c2 = 0x80000000, so c2 >> 9 != 0).
LW_AVX2 inline __m256i fast_codes8(const float* p, __m256 lo, __m256 s8, __m256 margin, __m256i& flag) {
  const __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(p), lo), s8);
  const __m256i c1 = _mm256_cvttps_epi32(_mm256_sub_ps(t, margin));
  const __m256i c2 = _mm256_cvttps_epi32(_mm256_add_ps(t, margin));
  flag = _mm256_or_si256(flag, _mm256_or_si256(_mm256_xor_si256(c1, c2), _mm256_srli_epi32(c2, 9)));
  return c2;
}

LW_AVX2 bool codebook_codes(const float* src, size_t n, const codebook_map& m, std::byte* codes) {
  size_t i = 0;
  if (m.fast) {
    const __m256 lo = _mm256_set1_ps(m.lo32);
    const __m256 s8 = _mm256_set1_ps(m.s8);
    const __m256 margin = _mm256_set1_ps(fast_margin);
    for (; i + 32 <= n; i += 32) {
      __m256i flag = _mm256_setzero_si256();
      const __m256i c0 = fast_codes8(src + i, lo, s8, margin, flag);
      const __m256i c1 = fast_codes8(src + i + 8, lo, s8, margin, flag);
      const __m256i c2 = fast_codes8(src + i + 16, lo, s8, margin, flag);
      const __m256i c3 = fast_codes8(src + i + 24, lo, s8, margin, flag);
      // Unsigned saturation turns 256 into 255 (the clamp of the definition).
      const __m256i ab = _mm256_packus_epi32(c0, c1);
      const __m256i cd = _mm256_packus_epi32(c2, c3);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i),
                          unshuffle_packed_bytes(_mm256_packus_epi16(ab, cd)));
      if (!_mm256_testz_si256(flag, flag) && !scalar_kernels().codebook_codes(src + i, 32, m, codes + i))
        return false;
    }
  }
  return scalar_kernels().codebook_codes(src + i, n - i, m, codes + i);
}

// Sample positions stay scalar at this level (a gather of 8 plus the double arithmetic gains little here).
void codebook_sample_pos(const float* src, size_t count, size_t stride, const codebook_map& m,
                         uint32_t* pos) {
  scalar_kernels().codebook_sample_pos(src, count, stride, m, pos);
}

// Table lookups stay scalar: vgatherdps was slower than scalar loads on Zen 4 (0.47 vs 0.26 ns per value,
// in cache).
void uint8_lookup(const std::byte* src, size_t n, const float* table, float* dst) {
  scalar_kernels().uint8_lookup(src, n, table, dst);
}

void uint8_lookup_add(const std::byte* src, size_t n, const float* table, float* acc) {
  scalar_kernels().uint8_lookup_add(src, n, table, acc);
}

}  // namespace

const codec_kernels* avx2_kernels() {
  static const codec_kernels k{simd_isa::avx2,
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
  return &k;
}

}  // namespace longwave::comm::detail

#else

namespace longwave::comm::detail {
const codec_kernels* avx2_kernels() {
  return nullptr;
}
}  // namespace longwave::comm::detail

#endif
