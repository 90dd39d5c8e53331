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

/// Elements of elem_size bytes before p is 64-byte aligned (at most n; 0 if p is not elem_size aligned).
/// Kernels handle these first with a masked step so that their 64-byte loads or stores do not each split
/// across two cache lines: with a buffer at 16 mod 64 (malloc's usual offset for large blocks) that split
/// cost fp16 encode about 45% (13.4 against 24 GB/s at 64M values).
inline size_t align_head(const void* p, size_t elem_size, size_t n) {
  const size_t off = reinterpret_cast<uintptr_t>(p) & 63u;
  if (off == 0 || off % elem_size != 0) return 0;
  const size_t head = (64 - off) / elem_size;
  return head < n ? head : n;
}

LW_AVX512 void fp32_add(const std::byte* src, size_t n, float* acc) {
  size_t i = align_head(acc, 4, n);
  if (i != 0) {
    const __mmask16 m = tail_mask(i);
    _mm512_mask_storeu_ps(acc, m,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc), _mm512_maskz_loadu_ps(m, src)));
  }
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
  size_t i = align_head(src, 4, n);
  if (i != 0) _mm256_mask_storeu_epi16(dst, tail_mask(i), to_half(_mm512_maskz_loadu_ps(tail_mask(i), src)));
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
  size_t i = align_head(dst, 4, n);
  if (i != 0) _mm512_mask_storeu_ps(dst, tail_mask(i), load_half(src, tail_mask(i)));
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_half(src + 2 * i, 0xffff));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, load_half(src + 2 * i, m));
  }
}

LW_AVX512 void fp16_add(const std::byte* src, size_t n, float* acc) {
  size_t i = align_head(acc, 4, n);
  if (i != 0) {
    const __mmask16 m = tail_mask(i);
    _mm512_mask_storeu_ps(acc, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc), load_half(src, m)));
  }
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
  size_t i = align_head(src, 4, n);
  if (i != 0)
    _mm512_mask_cvtepi32_storeu_epi16(dst, tail_mask(i), to_bf16(_mm512_maskz_loadu_ps(tail_mask(i), src)));
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
  size_t i = align_head(dst, 4, n);
  if (i != 0) _mm512_mask_storeu_ps(dst, tail_mask(i), load_bf16(src, tail_mask(i)));
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_bf16(src + 2 * i, 0xffff));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, load_bf16(src + 2 * i, m));
  }
}

LW_AVX512 void bf16_add(const std::byte* src, size_t n, float* acc) {
  size_t i = align_head(acc, 4, n);
  if (i != 0) {
    const __mmask16 m = tail_mask(i);
    _mm512_mask_storeu_ps(acc, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc), load_bf16(src, m)));
  }
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
  size_t i = align_head(src, 4, n);
  __m512i m0 = _mm512_and_si512(_mm512_maskz_loadu_epi32(tail_mask(i), src), abs_mask);
  __m512i m1 = _mm512_setzero_si512();
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

// min(x, lo) returns lo when x is NaN, so NaN is skipped (codebook_codes catches it) unless src[0] is NaN,
// which then stays in every lane. Only min and max per vector, plus a prefetch: this pass reads the chunk
// from memory, and fewer instructions per cache line keep more loads in flight (measured at 64M values:
// 15 GB/s with the former |x| maximum, about 20 without it, more with the prefetch).
LW_AVX512 min_max find_min_max(const float* src, size_t n) {
  constexpr size_t prefetch_ahead = 512;  // values (2 KiB)
  __m512 lo0 = _mm512_set1_ps(src[0]), lo1 = lo0, hi0 = lo0, hi1 = lo0;
  size_t i = align_head(src, 4, n);
  if (i != 0) {
    const __mmask16 m = tail_mask(i);
    const __m512 x = _mm512_maskz_loadu_ps(m, src);
    lo0 = _mm512_mask_min_ps(lo0, m, x, lo0);
    hi0 = _mm512_mask_max_ps(hi0, m, x, hi0);
  }
  for (; i + 32 <= n; i += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(src + i + prefetch_ahead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(src + i + prefetch_ahead + 16), _MM_HINT_T0);
    const __m512 x = _mm512_loadu_ps(src + i);
    const __m512 y = _mm512_loadu_ps(src + i + 16);
    lo0 = _mm512_min_ps(x, lo0);
    hi0 = _mm512_max_ps(x, hi0);
    lo1 = _mm512_min_ps(y, lo1);
    hi1 = _mm512_max_ps(y, hi1);
  }
  for (; i < n; i += 16) {
    // Masked-off lanes load 0 and keep the accumulator (mask_min/mask_max), so they never count.
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, src + i);
    lo0 = _mm512_mask_min_ps(lo0, m, x, lo0);
    hi0 = _mm512_mask_max_ps(hi0, m, x, hi0);
  }
  return {_mm512_reduce_min_ps(_mm512_min_ps(lo0, lo1)), _mm512_reduce_max_ps(_mm512_max_ps(hi0, hi1))};
}

// The bits of |x|: their unsigned maximum is exact and order-free (see abs_max).
LW_AVX512 inline __m512i abs_bits(__m512 x) {
  return _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
}

// rne(x * inv) as int32, in the current rounding mode (nearest even by default), as the scalar level. The
// clamp to [-127, 127] comes after, on the bytes (codes16, codes64): a saturating narrowing, then a max with
// -127. For |x * inv| <= 2^22 that is the same as clamping the product first, at one instruction per 16 or
// 64 codes instead of two per 16 (the fused encode, in cache: 47 GB/s with the fp32 clamp, 58-59 with this).
LW_AVX512 inline __m512i quantize16(__m512 x, __m512 inv) {
  return _mm512_cvtps_epi32(_mm512_mul_ps(x, inv));
}

// 16 codes of 16 values.
LW_AVX512 inline __m128i codes16(__m512 x, __m512 inv) {
  return _mm_max_epi8(_mm512_cvtsepi32_epi8(quantize16(x, inv)), _mm_set1_epi8(-127));
}

// 64 codes of 64 values in four vectors: the saturating packs work within 128-bit lanes, the permutation puts
// the 16 groups of 4 codes back in order.
LW_AVX512 inline __m512i codes64(__m512 a, __m512 b, __m512 c, __m512 d, __m512 inv) {
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i ab = _mm512_packs_epi32(quantize16(a, inv), quantize16(b, inv));
  const __m512i cd = _mm512_packs_epi32(quantize16(c, inv), quantize16(d, inv));
  return _mm512_max_epi8(_mm512_permutexvar_epi32(order, _mm512_packs_epi16(ab, cd)), _mm512_set1_epi8(-127));
}

LW_AVX512 void int8_quantize(const float* src, size_t n, float inv_scale, std::byte* dst) {
  const __m512 inv = _mm512_set1_ps(inv_scale);
  size_t i = align_head(src, 4, n);
  if (i != 0) _mm_mask_storeu_epi8(dst, tail_mask(i), codes16(_mm512_maskz_loadu_ps(tail_mask(i), src), inv));
  for (; i + 16 <= n; i += 16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), codes16(_mm512_loadu_ps(src + i), inv));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm_mask_storeu_epi8(dst + i, m, codes16(_mm512_maskz_loadu_ps(m, src + i), inv));
  }
}

LW_AVX512 inline __m512 dequantize16(const std::byte* p, __mmask16 m, __m512 scale) {
  const __m512i q = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p));
  return keep_rounded(_mm512_mul_ps(_mm512_cvtepi32_ps(q), scale));
}

LW_AVX512 void int8_dequantize(const std::byte* src, size_t n, float scale, float* dst) {
  const __m512 s = _mm512_set1_ps(scale);
  size_t i = align_head(dst, 4, n);
  if (i != 0) _mm512_mask_storeu_ps(dst, tail_mask(i), dequantize16(src, tail_mask(i), s));
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, dequantize16(src + i, 0xffff, s));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, dequantize16(src + i, m, s));
  }
}

LW_AVX512 void int8_dequantize_add(const std::byte* src, size_t n, float scale, float* acc) {
  const __m512 s = _mm512_set1_ps(scale);
  size_t i = align_head(acc, 4, n);
  if (i != 0) {
    const __mmask16 m = tail_mask(i);
    _mm512_mask_storeu_ps(acc, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc), dequantize16(src, m, s)));
  }
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), dequantize16(src + i, 0xffff, s)));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(acc + i, m,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc + i), dequantize16(src + i, m, s)));
  }
}

// The whole chunk in one call. Each full block is read once, into 17 registers: steps aligned to 64 bytes of
// src (the same offset for every block, a block being a multiple of 64 bytes), the first (head values, maybe
// none) and the last masked. The |x| maximum and the codes both come from the registers, and the codes leave
// as 64-byte stores. In cache (one 4 MB chunk) this encodes at 58-59 GB/s against 45 for abs_max and
// int8_quantize inlined per block, which read the block twice and store 16 codes at a time. The chunk's
// last, shorter block takes that path.
[[gnu::flatten]] LW_AVX512 bool int8_encode_blocks(const float* src, size_t n, std::byte* scales,
                                                   std::byte* codes) {
  static_assert(int8_block % 64 == 0, "codes64 takes the 16-value steps of a block four at a time");
  constexpr int steps = int8_block / 16 + 1;
  const size_t head = align_head(src, 4, 16);
  const __mmask16 first = tail_mask(head);
  const __mmask16 last = tail_mask(16 - head);
  const __mmask64 last_codes = ~uint64_t{0} >> head;  // the block's last 64 - head codes
  size_t i = 0;
  for (; i + int8_block <= n; i += int8_block) {
    const float* p = src + i + head;
    __m512 x[steps];
    x[0] = _mm512_maskz_loadu_ps(first, src + i);
    for (int k = 1; k < steps - 1; ++k) x[k] = _mm512_loadu_ps(p + 16 * (k - 1));
    x[steps - 1] = _mm512_maskz_loadu_ps(last, p + int8_block - 16);
    __m512i m0 = abs_bits(x[0]);
    __m512i m1 = abs_bits(x[1]);
    for (int k = 2; k < steps; k += 2) {
      m0 = _mm512_max_epu32(m0, abs_bits(x[k]));
      if (k + 1 < steps) m1 = _mm512_max_epu32(m1, abs_bits(x[k + 1]));
    }
    float scale, inv;
    if (!int8_block_scale(_mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1)), scale, inv)) return false;
    std::memcpy(scales + 4 * (i / int8_block), &scale, sizeof scale);
    const __m512 r = _mm512_set1_ps(inv);
    std::byte* q = codes + i + head;
    _mm_mask_storeu_epi8(codes + i, first, codes16(x[0], r));
    for (int k = 1; k < steps; k += 4) {
      const __m512i c = codes64(x[k], x[k + 1], x[k + 2], x[k + 3], r);
      if (k + 4 < steps) {
        _mm512_storeu_si512(q + 16 * (k - 1), c);
      } else {
        _mm512_mask_storeu_epi8(q + 16 * (k - 1), last_codes, c);
      }
    }
  }
  return int8_encode_walk(src + i, n - i, scales + 4 * (i / int8_block), codes + i, abs_max, int8_quantize);
}

[[gnu::flatten]] LW_AVX512 void int8_decode_blocks(const std::byte* codes, const std::byte* scales, size_t n,
                                                   float* out, bool add) {
  int8_decode_walk(codes, scales, n, out, add, int8_dequantize, int8_dequantize_add);
}

// The fp32 fast path for 16 values (CODEC.md): with d = x - lo, t- = d * s8 - margin and t+ = d * s8 + margin
// (each one FMA, one rounding), c1 = trunc(t-) and c2 = trunc(t+). Where c1 == c2 the code is min(255, c2),
// which equals the double definition; the returned mask has the other lanes. c1 is converted as unsigned and
// c2 as signed, so a NaN (0xffffffff against 0x80000000) is always in the mask.
LW_AVX512 inline __m512i fast_codes16(__m512 x, __m512 lo, __m512 s8, __m512 margin, __mmask16& undecided) {
  const __m512 d = _mm512_sub_ps(x, lo);
  const __m512i c1 = _mm512_cvttps_epu32(_mm512_fmsub_ps(d, s8, margin));
  const __m512i c2 = _mm512_cvttps_epi32(_mm512_fmadd_ps(d, s8, margin));
  undecided = _mm512_cmpneq_epi32_mask(c1, c2);
  return c2;
}

// Codes the values at the set bits of `undecided` (lanes of src) by the double definition; false on a NaN.
inline bool patch_codes(const float* src, uint64_t undecided, const codebook_map& m, std::byte* codes) {
  for (; undecided != 0; undecided &= undecided - 1) {
    const int l = __builtin_ctzll(undecided);
    uint8_t c;
    if (!codebook_code_exact(src[l], m, c)) return false;
    codes[l] = std::byte{c};
  }
  return true;
}

LW_AVX512 bool codebook_codes(const float* src, size_t n, const codebook_map& m, std::byte* codes) {
  size_t i = 0;
  if (m.fast) {
    i = align_head(src, 4, n);
    if (!scalar_kernels().codebook_codes(src, i, m, codes)) return false;
    const __m512 lo = _mm512_set1_ps(m.lo32);
    const __m512 s8 = _mm512_set1_ps(m.s8);
    const __m512 margin = _mm512_set1_ps(fast_margin);
    // packus works within 128-bit lanes; this puts the 16 groups of 4 codes back in order.
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (; i + 64 <= n; i += 64) {
      for (int l = 0; l < 4; ++l)
        _mm_prefetch(reinterpret_cast<const char*>(src + i + 512 + 16 * l), _MM_HINT_T0);
      __mmask16 u0, u1, u2, u3;
      const __m512i c0 = fast_codes16(_mm512_loadu_ps(src + i), lo, s8, margin, u0);
      const __m512i c1 = fast_codes16(_mm512_loadu_ps(src + i + 16), lo, s8, margin, u1);
      const __m512i c2 = fast_codes16(_mm512_loadu_ps(src + i + 32), lo, s8, margin, u2);
      const __m512i c3 = fast_codes16(_mm512_loadu_ps(src + i + 48), lo, s8, margin, u3);
      // Unsigned saturation turns 256 into 255 (the clamp of the definition).
      const __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(c0, c1), _mm512_packus_epi32(c2, c3));
      _mm512_storeu_si512(codes + i, _mm512_permutexvar_epi32(order, b));
      // About 3% of the 64-value steps have a value within the margin of a bin edge (2^-11 of the values);
      // only those values take the double path.
      const uint64_t undecided = static_cast<uint64_t>(u0) | static_cast<uint64_t>(u1) << 16 |
                                 static_cast<uint64_t>(u2) << 32 | static_cast<uint64_t>(u3) << 48;
      if (undecided != 0 && !patch_codes(src + i, undecided, m, codes + i)) return false;
    }
  }
  return scalar_kernels().codebook_codes(src + i, n - i, m, codes + i);
}

// codebook_codes with the positions of the samples of stride 16 in the same loop. Each 64-value step holds
// four samples, lane L of each register (L is fixed by the alignment head); they go through the same double
// operations as codebook_pos_exact, four at a time.
LW_AVX512 bool codebook_codes_sample16(const float* src, size_t n, const codebook_map& m, std::byte* codes,
                                       uint32_t* pos) {
  const auto pos_exact = [&](size_t from, size_t to) {
    for (size_t j = (from + 15) / 16 * 16; j < to; j += 16) *pos++ = codebook_pos_exact(src[j], m);
  };
  size_t i = align_head(src, 4, n);
  if (!scalar_kernels().codebook_codes(src, i, m, codes)) return false;
  pos_exact(0, i);
  const __m512 lo = _mm512_set1_ps(m.lo32);
  const __m512 s8 = _mm512_set1_ps(m.s8);
  const __m512 margin = _mm512_set1_ps(fast_margin);
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  // Lane L of x0 and x1 into lanes 0 and 1, then lanes 0, 1 of both pairs into lanes 0-3.
  const int lane = static_cast<int>((16 - i) & 15);
  const __m512i pick2 = _mm512_setr_epi32(lane, 16 + lane, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i pick4 = _mm512_setr_epi32(0, 1, 16, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m256d lo_d = _mm256_set1_pd(m.lo);
  const __m256d scale_d = _mm256_set1_pd(m.scale);
  const __m128i max_pos = _mm_set1_epi32((1 << 28) - 1);
  for (; i + 64 <= n; i += 64) {
    for (int l = 0; l < 4; ++l)
      _mm_prefetch(reinterpret_cast<const char*>(src + i + 512 + 16 * l), _MM_HINT_T0);
    const __m512 x0 = _mm512_loadu_ps(src + i);
    const __m512 x1 = _mm512_loadu_ps(src + i + 16);
    const __m512 x2 = _mm512_loadu_ps(src + i + 32);
    const __m512 x3 = _mm512_loadu_ps(src + i + 48);
    __mmask16 u0, u1, u2, u3;
    const __m512i c0 = fast_codes16(x0, lo, s8, margin, u0);
    const __m512i c1 = fast_codes16(x1, lo, s8, margin, u1);
    const __m512i c2 = fast_codes16(x2, lo, s8, margin, u2);
    const __m512i c3 = fast_codes16(x3, lo, s8, margin, u3);
    const __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(c0, c1), _mm512_packus_epi32(c2, c3));
    _mm512_storeu_si512(codes + i, _mm512_permutexvar_epi32(order, b));
    const uint64_t undecided = static_cast<uint64_t>(u0) | static_cast<uint64_t>(u1) << 16 |
                               static_cast<uint64_t>(u2) << 32 | static_cast<uint64_t>(u3) << 48;
    if (undecided != 0 && !patch_codes(src + i, undecided, m, codes + i)) return false;
    // The four samples: finite here (a NaN or inf would have failed patch_codes), inside [lo, hi].
    const __m512 s01 = _mm512_permutex2var_ps(x0, pick2, x1);
    const __m512 s23 = _mm512_permutex2var_ps(x2, pick2, x3);
    const __m128 s = _mm512_castps512_ps128(_mm512_permutex2var_ps(s01, pick4, s23));
    const __m256d d = _mm256_mul_pd(_mm256_sub_pd(_mm256_cvtps_pd(s), lo_d), scale_d);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(pos), _mm_min_epu32(_mm256_cvttpd_epi32(d), max_pos));
    pos += 4;
  }
  if (!scalar_kernels().codebook_codes(src + i, n - i, m, codes + i)) return false;
  pos_exact(i, n);
  return true;
}

// 16 samples per gather, then the same double operations as the scalar level (exact IEEE, same bits).
LW_AVX512 void codebook_sample_pos(const float* src, size_t count, size_t stride, const codebook_map& m,
                                   uint32_t* pos) {
  const __m512i idx =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(stride)));
  const __m512d lo = _mm512_set1_pd(m.lo);
  const __m512d scale = _mm512_set1_pd(m.scale);
  const __m256i max_pos = _mm256_set1_epi32((1 << 28) - 1);
  size_t j = 0;
  for (; j + 16 <= count; j += 16) {
    const __m512 x = _mm512_i32gather_ps(idx, src + j * stride, 4);
    const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d b = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    const __m256i pa =
        _mm256_min_epu32(_mm512_cvttpd_epi32(_mm512_mul_pd(_mm512_sub_pd(a, lo), scale)), max_pos);
    const __m256i pb =
        _mm256_min_epu32(_mm512_cvttpd_epi32(_mm512_mul_pd(_mm512_sub_pd(b, lo), scale)), max_pos);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pos + j), pa);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pos + j + 8), pb);
  }
  scalar_kernels().codebook_sample_pos(src + j * stride, count - j, stride, m, pos + j);
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
  size_t i = align_head(dst, 4, n);
  if (i != 0) _mm512_mask_storeu_ps(dst, tail_mask(i), lookup16(src, tail_mask(i), t));
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, lookup16(src + i, 0xffff, t));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, lookup16(src + i, m, t));
  }
}

LW_AVX512 void uint8_lookup_add(const std::byte* src, size_t n, const float* table, float* acc) {
  const table_regs t = load_table(table);
  size_t i = align_head(acc, 4, n);
  if (i != 0) {
    const __mmask16 m = tail_mask(i);
    _mm512_mask_storeu_ps(acc, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc), lookup16(src, m, t)));
  }
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
  size_t i = align_head(dst, 4, n);
  if (i != 0) uint8_lookup(src, i, table, dst);
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
  size_t i = align_head(acc, 4, n);
  if (i != 0) uint8_lookup_add(src, i, table, acc);
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
                               int8_encode_blocks,
                               int8_decode_blocks,
                               int8_quantize,
                               int8_dequantize,
                               int8_dequantize_add,
                               codebook_codes,
                               codebook_sample_pos,
                               codebook_codes_sample16,
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
