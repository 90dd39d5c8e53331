// AVX-512 (F, BW, VL) codec kernels, compiled with function target attributes and chosen at run time.
// Tails use masked loads and stores, so every element goes through the same instructions as the scalar
// level's arithmetic and gives the same bits.
#include "comm/codec_kernels.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

// GCC 12's AVX-512 headers initialise their "undefined" vectors with themselves, which
// -W(maybe-)uninitialized reports at every inlined intrinsic (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define LW_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

namespace longwave::comm::detail {
namespace {

// Keeps a product rounded to fp32: AVX-512F has FMA, and GCC would contract mul + add into it.
LW_AVX512 inline __m512 keep_rounded(__m512 v) {
  __asm__("" : "+v"(v));
  return v;
}

/// Lanes [0, r) for a tail of r < 16 elements.
inline __mmask16 tail_mask(size_t r) {
  return static_cast<__mmask16>((1u << r) - 1u);
}

LW_AVX512 void fp32_add(const std::byte* src, size_t n, float* acc) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(src + 4 * i);
    _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), v));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, src + 4 * i);
    _mm512_mask_storeu_ps(acc + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc + i), v));
  }
}

// Saturates finite values to +-65504 before vcvtps2ph (which would give inf), keeping inf and NaN.
// max/min return their second operand when one is NaN, so x goes second to carry NaN through.
LW_AVX512 inline __m256i to_half(__m512 x) {
  const __m512 lim = _mm512_set1_ps(65504.0f);
  __m512 c = _mm512_min_ps(lim, _mm512_max_ps(_mm512_set1_ps(-65504.0f), x));
  const __mmask16 inf = _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(__builtin_inff()), _CMP_EQ_OQ);
  c = _mm512_mask_mov_ps(c, inf, x);
  return _mm512_cvtps_ph(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

LW_AVX512 void fp16_encode(const float* src, size_t n, std::byte* dst) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i), to_half(_mm512_loadu_ps(src + i)));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm256_mask_storeu_epi16(dst + 2 * i, m, to_half(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

LW_AVX512 inline __m512 load_half(const std::byte* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

LW_AVX512 void fp16_decode(const std::byte* src, size_t n, float* dst) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_half(src + 2 * i, 0xffff));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, load_half(src + 2 * i, m));
  }
}

LW_AVX512 void fp16_add(const std::byte* src, size_t n, float* acc) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), load_half(src + 2 * i, 0xffff)));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(acc + i, m,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc + i), load_half(src + 2 * i, m)));
  }
}

// Round to nearest even of the top 16 bits, NaN -> 0x7fc0 (c10::BFloat16), in the low half of each lane.
// Not vcvtneps2bf16: it flushes denormals and keeps NaN payloads, so it differs from torch and the scalar
// level.
LW_AVX512 inline __m512i to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc00000));
  return _mm512_srli_epi32(r, 16);
}

LW_AVX512 void bf16_encode(const float* src, size_t n, std::byte* dst) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i),
                        _mm512_cvtepi32_epi16(to_bf16(_mm512_loadu_ps(src + i))));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_cvtepi32_storeu_epi16(dst + 2 * i, m, to_bf16(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

LW_AVX512 inline __m512 load_bf16(const std::byte* p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

LW_AVX512 void bf16_decode(const std::byte* src, size_t n, float* dst) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_bf16(src + 2 * i, 0xffff));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, load_bf16(src + 2 * i, m));
  }
}

LW_AVX512 void bf16_add(const std::byte* src, size_t n, float* acc) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), load_bf16(src + 2 * i, 0xffff)));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(acc + i, m,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc + i), load_bf16(src + 2 * i, m)));
  }
}

// The max of |x|'s bit patterns: exact, order-free, and NaN/inf compare above every finite value.
LW_AVX512 abs_max_bits abs_max(const float* src, size_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  __m512i m0 = _mm512_setzero_si512();
  __m512i m1 = _mm512_setzero_si512();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(src + i), abs_mask));
    m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_loadu_si512(src + i + 16), abs_mask));
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - i);
    m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_maskz_loadu_epi32(m, src + i), abs_mask));
  }
  return _mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1));
}

LW_AVX512 min_max find_min_max(const float* src, size_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  __m512 lo = _mm512_set1_ps(src[0]);
  __m512 hi = lo;
  __m512i am = _mm512_setzero_si512();
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, src + i);
    lo = _mm512_mask_min_ps(lo, m, lo, x);
    hi = _mm512_mask_max_ps(hi, m, hi, x);
    am = _mm512_max_epu32(am, _mm512_and_si512(_mm512_castps_si512(x), abs_mask));
  }
  return {_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi), _mm512_reduce_max_epu32(am)};
}

LW_AVX512 inline __m512i quantize16(__m512 x, __m512 inv) {
  const __m512 y = keep_rounded(_mm512_mul_ps(x, inv));
  const __m512 c = _mm512_min_ps(_mm512_set1_ps(127.0f), _mm512_max_ps(_mm512_set1_ps(-127.0f), y));
  return _mm512_cvtps_epi32(c);  // current rounding mode (nearest even by default), as the scalar level
}

LW_AVX512 void int8_quantize(const float* src, size_t n, float inv_scale, std::byte* dst) {
  const __m512 inv = _mm512_set1_ps(inv_scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm512_cvtepi32_epi8(quantize16(_mm512_loadu_ps(src + i), inv)));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_cvtepi32_storeu_epi8(dst + i, m, quantize16(_mm512_maskz_loadu_ps(m, src + i), inv));
  }
}

LW_AVX512 inline __m512 dequantize16(const std::byte* p, __mmask16 m, __m512 scale) {
  const __m512i q = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p));
  return keep_rounded(_mm512_mul_ps(_mm512_cvtepi32_ps(q), scale));
}

LW_AVX512 void int8_dequantize(const std::byte* src, size_t n, float scale, float* dst) {
  const __m512 s = _mm512_set1_ps(scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, dequantize16(src + i, 0xffff, s));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, dequantize16(src + i, m, s));
  }
}

LW_AVX512 void int8_dequantize_add(const std::byte* src, size_t n, float scale, float* acc) {
  const __m512 s = _mm512_set1_ps(scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), dequantize16(src + i, 0xffff, s)));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(acc + i, m,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc + i), dequantize16(src + i, m, s)));
  }
}

LW_AVX512 inline __m512i bin_pos16(const float* p, __mmask16 m, __m512d lo, __m512d scale) {
  const __m512 x = _mm512_maskz_loadu_ps(m, p);
  const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  const __m512d b = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  const __m256i qa = _mm512_cvttpd_epi32(_mm512_mul_pd(_mm512_sub_pd(a, lo), scale));
  const __m256i qb = _mm512_cvttpd_epi32(_mm512_mul_pd(_mm512_sub_pd(b, lo), scale));
  return _mm512_inserti64x4(_mm512_castsi256_si512(qa), qb, 1);
}

LW_AVX512 void codebook_bin(const float* src, size_t n, double lo, double scale, std::byte* codes,
                            uint32_t* pos) {
  const __m512d l = _mm512_set1_pd(lo);
  const __m512d s = _mm512_set1_pd(scale);
  const __m512i max_pos = _mm512_set1_epi32((1 << 28) - 1);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i q = _mm512_min_epu32(bin_pos16(src + i, 0xffff, l, s), max_pos);
    _mm512_storeu_si512(pos + i, q);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(_mm512_srli_epi32(q, 20)));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i q = _mm512_min_epu32(bin_pos16(src + i, m, l, s), max_pos);
    _mm512_mask_storeu_epi32(pos + i, m, q);
    _mm512_mask_cvtepi32_storeu_epi8(codes + i, m, _mm512_srli_epi32(q, 20));
  }
}

// The 256-entry table lives in 16 registers: vpermt2ps picks within each 32-entry pair by bits 0-4 of the
// code, and three blends by bits 5, 6 and 7 pick the pair. About twice as fast as vgatherdps on Zen 4.
struct table_regs {
  __m512 t[16];
};

LW_AVX512 inline table_regs load_table(const float* table) {
  table_regs r;
  for (int k = 0; k < 16; ++k) r.t[k] = _mm512_loadu_ps(table + 16 * k);
  return r;
}

LW_AVX512 inline __m512 lookup16(const std::byte* p, __mmask16 m, const table_regs& t) {
  const __m512i idx = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, p));
  __m512 r[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm512_permutex2var_ps(t.t[2 * k], idx, t.t[2 * k + 1]);
  const __mmask16 b5 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(32));
  const __mmask16 b6 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(64));
  const __mmask16 b7 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(128));
  const __m512 a0 = _mm512_mask_mov_ps(r[0], b5, r[1]);
  const __m512 a1 = _mm512_mask_mov_ps(r[2], b5, r[3]);
  const __m512 a2 = _mm512_mask_mov_ps(r[4], b5, r[5]);
  const __m512 a3 = _mm512_mask_mov_ps(r[6], b5, r[7]);
  return _mm512_mask_mov_ps(_mm512_mask_mov_ps(a0, b6, a1), b7, _mm512_mask_mov_ps(a2, b6, a3));
}

LW_AVX512 void uint8_lookup(const std::byte* src, size_t n, const float* table, float* dst) {
  const table_regs t = load_table(table);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, lookup16(src + i, 0xffff, t));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, lookup16(src + i, m, t));
  }
}

LW_AVX512 void uint8_lookup_add(const std::byte* src, size_t n, const float* table, float* acc) {
  const table_regs t = load_table(table);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), lookup16(src + i, 0xffff, t)));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(acc + i, m,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc + i), lookup16(src + i, m, t)));
  }
}

// With AVX-512 VBMI the table is four byte planes (plane j holds byte j of every entry, 256 bytes = 4
// registers): vpermi2b picks 64 bytes from the low or high 128 entries by bits 0-6 of each code, a blend on
// bit 7 chooses, and byte and word unpacks rebuild the floats. The unpacks work within 128-bit lanes, so the
// codes are first permuted (a 4x4 transpose of 4-byte groups) such that the four results come out in order.
#define LW_VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi")))

struct byte_planes {
  __m512i p[4][4];  // [byte j][quarter of the 256 entries]
};

LW_VBMI inline byte_planes load_planes(const float* table) {
  alignas(64) uint8_t planes[4][256];
  const auto* bytes = reinterpret_cast<const uint8_t*>(table);
  for (int b = 0; b < 256; ++b)
    for (int j = 0; j < 4; ++j) planes[j][b] = bytes[4 * b + j];
  byte_planes r;
  for (int j = 0; j < 4; ++j)
    for (int q = 0; q < 4; ++q) r.p[j][q] = _mm512_load_si512(planes[j] + 64 * q);
  return r;
}

LW_VBMI inline __m512i transpose_index() {
  alignas(64) uint8_t idx[64];
  for (int p = 0; p < 64; ++p) idx[p] = static_cast<uint8_t>(16 * ((p % 16) / 4) + 4 * (p / 16) + p % 4);
  return _mm512_load_si512(idx);
}

/// Decodes 64 codes into out[0..4) (values 0-15, 16-31, 32-47, 48-63).
LW_VBMI inline void lookup64(__m512i codes, const byte_planes& t, __m512i perm, __m512i out[4]) {
  const __m512i c = _mm512_permutexvar_epi8(perm, codes);
  const __mmask64 high = _mm512_movepi8_mask(c);
  __m512i r[4];
  for (int j = 0; j < 4; ++j) {
    const __m512i lo = _mm512_permutex2var_epi8(t.p[j][0], c, t.p[j][1]);
    const __m512i hi = _mm512_permutex2var_epi8(t.p[j][2], c, t.p[j][3]);
    r[j] = _mm512_mask_blend_epi8(high, lo, hi);
  }
  const __m512i lo01 = _mm512_unpacklo_epi8(r[0], r[1]), hi01 = _mm512_unpackhi_epi8(r[0], r[1]);
  const __m512i lo23 = _mm512_unpacklo_epi8(r[2], r[3]), hi23 = _mm512_unpackhi_epi8(r[2], r[3]);
  out[0] = _mm512_unpacklo_epi16(lo01, lo23);
  out[1] = _mm512_unpackhi_epi16(lo01, lo23);
  out[2] = _mm512_unpacklo_epi16(hi01, hi23);
  out[3] = _mm512_unpackhi_epi16(hi01, hi23);
}

LW_VBMI void uint8_lookup_vbmi(const std::byte* src, size_t n, const float* table, float* dst) {
  const byte_planes t = load_planes(table);
  const __m512i perm = transpose_index();
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512i v[4];
    lookup64(_mm512_loadu_si512(src + i), t, perm, v);
    for (int k = 0; k < 4; ++k) _mm512_storeu_si512(dst + i + 16 * k, v[k]);
  }
  if (i < n) uint8_lookup(src + i, n - i, table, dst + i);
}

LW_VBMI void uint8_lookup_add_vbmi(const std::byte* src, size_t n, const float* table, float* acc) {
  const byte_planes t = load_planes(table);
  const __m512i perm = transpose_index();
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512i v[4];
    lookup64(_mm512_loadu_si512(src + i), t, perm, v);
    for (int k = 0; k < 4; ++k) {
      float* a = acc + i + 16 * k;
      _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), _mm512_castsi512_ps(v[k])));
    }
  }
  if (i < n) uint8_lookup_add(src + i, n - i, table, acc + i);
}

bool has_vbmi() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vbmi");
}

}  // namespace

const codec_kernels* avx512_kernels() {
  static const codec_kernels k{simd_isa::avx512,
                               fp32_add,
                               fp16_encode,
                               fp16_decode,
                               fp16_add,
                               bf16_encode,
                               bf16_decode,
                               bf16_add,
                               abs_max,
                               find_min_max,
                               int8_quantize,
                               int8_dequantize,
                               int8_dequantize_add,
                               codebook_bin,
                               has_vbmi() ? uint8_lookup_vbmi : uint8_lookup,
                               has_vbmi() ? uint8_lookup_add_vbmi : uint8_lookup_add};
  return &k;
}

}  // namespace longwave::comm::detail

#else

namespace longwave::comm::detail {
const codec_kernels* avx512_kernels() {
  return nullptr;
}
}  // namespace longwave::comm::detail

#endif
