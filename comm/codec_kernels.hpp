#pragma once
// Internal to the codecs: the per-CPU-level kernel table behind comm/codec.hpp. One instance per level
// (codec_scalar.cpp, codec_avx2.cpp, codec_avx512.cpp); all of them produce bit-identical results.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "comm/codec.hpp"

namespace longwave::comm::detail {

/// The bits of a float and back (memcpy: no aliasing UB), shared by the dispatcher and the scalar kernels.
inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The per-block int8 encode runs abs_max and int8_quantize once per block: a multiple of 32 keeps every block
// at the chunk's offset from a 64-byte boundary (so AVX-512's aligned steps apply to each block) and lets
// AVX2's 32-value quantize step divide it (no scalar tail except in the last block).
static_assert(int8_block % 32 == 0, "int8_block must be a multiple of 32");

/// Largest |x| of a chunk as raw bits of the non-negative float; >= 0x7f800000 means a NaN or inf was
/// present. Taking the max of the bit patterns is exact, so every level returns the same value.
using abs_max_bits = uint32_t;

/// Smallest and largest value of a chunk (codebook pass 1). Exact for a chunk without NaN; +-inf shows up as
/// lo = -inf or hi = +inf. NaN values are skipped (lo and hi are NaN only if src[0] is), so a NaN elsewhere
/// must be caught by codebook_codes; it costs pass 1 nothing, which runs at memory speed.
struct min_max {
  float lo;
  float hi;
};

/// How codebook_codes maps values to codes (comm/CODEC.md, "int8 with a codebook"). The code of x is defined
/// in double: code = min(255, floor((double(x) - lo) * scale * 2^-20)). When `fast` is set, a level may
/// compute it in fp32 as t = (x - lo32) * s8 (s8 = 256 / (hi - lo) in fp32) and must fall back to the double
/// formula for any value whose t is within `fast_margin` of an integer; CODEC.md proves that the fp32 result
/// equals the double one everywhere else.
struct codebook_map {
  double lo;     ///< min of the chunk
  double scale;  ///< 2^28 / (hi - lo) in double; 0 for a constant chunk
  bool fast;     ///< fp32 fast path allowed: hi - lo in fp32 is finite and >= 2^-64
  float lo32;    ///< lo as a float
  float s8;      ///< fl(256 / fl(hi - lo)) if fast
};

/// The fp32 fast path's safety margin in bins (CODEC.md: its error is below 2^-13.9 bins).
constexpr float fast_margin = 0x1p-12f;

/// The position of one finite value in [lo, hi] by the double definition (see codebook_sample_pos).
inline uint32_t codebook_pos_exact(float x, const codebook_map& m) {
  const auto p = static_cast<uint32_t>(static_cast<int32_t>((static_cast<double>(x) - m.lo) * m.scale));
  return p < (1u << 28) - 1 ? p : (1u << 28) - 1;
}

/// The code of one value by the double definition; false if x is NaN (or inf, which the caller has already
/// excluded). Shared by every level, for tails and for the values the fast path cannot decide.
inline bool codebook_code_exact(float x, const codebook_map& m, uint8_t& code) {
  if (!(x - x == 0.0f)) return false;                           // NaN or +-inf
  code = static_cast<uint8_t>(codebook_pos_exact(x, m) >> 20);  // 0 <= (x - lo) * scale < 2^29 in [lo, hi]
  return true;
}

/// The codebook's bin sums pack count << codebook_count_shift | sum of positions into one uint64_t per bin.
constexpr int codebook_count_shift = 42;

/// The kernels of one level. Byte pointers have no alignment requirement; n may be 0.
struct codec_kernels {
  simd_isa isa;
  void (*fp32_add)(const std::byte* src, size_t n, float* acc);
  void (*fp16_encode)(const float* src, size_t n, std::byte* dst);
  void (*fp16_decode)(const std::byte* src, size_t n, float* dst);
  void (*fp16_add)(const std::byte* src, size_t n, float* acc);
  void (*bf16_encode)(const float* src, size_t n, std::byte* dst);
  void (*bf16_decode)(const std::byte* src, size_t n, float* dst);
  void (*bf16_add)(const std::byte* src, size_t n, float* acc);
  abs_max_bits (*abs_max)(const float* src, size_t n);
  /// n >= 1. See min_max.
  min_max (*find_min_max)(const float* src, size_t n);
  /// q = clamp(round_half_even(x * inv_scale), -127, 127); finite input with |x * inv_scale| <= 2^22.
  void (*int8_quantize)(const float* src, size_t n, float inv_scale, std::byte* dst);
  /// dst = float(q) * scale, the product rounded to fp32 (never fused with an add).
  void (*int8_dequantize)(const std::byte* src, size_t n, float scale, float* dst);
  /// acc += float(q) * scale, the product rounded to fp32 before the add.
  void (*int8_dequantize_add)(const std::byte* src, size_t n, float scale, float* acc);
  /// Codebook codes of values in [lo, hi] or NaN (see codebook_map); returns false if any value is NaN or inf
  /// (codes are then unspecified). Every level writes the codes of the double definition.
  bool (*codebook_codes)(const float* src, size_t n, const codebook_map& m, std::byte* codes);
  /// Positions of the samples src[0], src[stride], ..., src[(count - 1) * stride] (finite, in [lo, hi]) by
  /// the double definition: pos = min(2^28 - 1, trunc((double(x) - lo) * scale)); pos >> 20 is the code.
  void (*codebook_sample_pos)(const float* src, size_t count, size_t stride, const codebook_map& m,
                              uint32_t* pos);
  /// codebook_codes fused with the sampling for stride 16 (nullptr at levels without it; m.fast must be set):
  /// also writes the positions of the samples src[0], src[16], ... of this call, as codebook_sample_pos does,
  /// so that the sampling takes no pass of its own.
  bool (*codebook_codes_sample16)(const float* src, size_t n, const codebook_map& m, std::byte* codes,
                                  uint32_t* pos);
  /// dst = table[b].
  void (*uint8_lookup)(const std::byte* src, size_t n, const float* table, float* dst);
  /// acc += table[b].
  void (*uint8_lookup_add)(const std::byte* src, size_t n, const float* table, float* acc);
};

/// The portable kernels (also used for the tails of the SIMD kernels).
const codec_kernels& scalar_kernels();
/// AVX2 + F16C kernels, or nullptr if this build has none (not x86-64 or not GCC/Clang).
const codec_kernels* avx2_kernels();
/// AVX-512 F/BW/VL kernels, or nullptr if this build has none.
const codec_kernels* avx512_kernels();

}  // namespace longwave::comm::detail
