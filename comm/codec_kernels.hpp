#pragma once
// Internal to the codecs: the per-CPU-level kernel table behind comm/codec.hpp. One instance per level
// (codec_scalar.cpp, codec_avx2.cpp, codec_avx512.cpp); all of them produce bit-identical results.
#include <cfloat>
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

// The fused int8 kernels walk a chunk block by block: a multiple of 32 keeps every block at the chunk's
// offset from a 64-byte boundary (so AVX-512's aligned steps apply to each block) and lets AVX2's 32-value
// quantize step divide it (no scalar tail except in the last block).
static_assert(int8_block % 32 == 0, "int8_block must be a multiple of 32");

/// Largest |x| of a chunk as raw bits of the non-negative float; >= 0x7f800000 means a NaN or inf was
/// present. Taking the max of the bit patterns is exact, so every level returns the same value.
using abs_max_bits = uint32_t;

/// int8 blocks whose max |x| is below this flush to zero, so that every scale is a normal float and its
/// reciprocal is finite (error <= max |x| < 1.5e-36).
constexpr float int8_min_abs_max = 127.0f * FLT_MIN;
/// The largest valid int8 scale: any code (even -128, which encode never writes) times it stays finite.
constexpr float int8_max_scale = FLT_MAX / 128.0f;

/// The int8 scale rule, the one copy every level uses (CODEC.md, "int8 with a symmetric scale per block",
/// steps 2-4): the scale of a block with max |x| = float_of(m_bits) and the factor its codes are computed
/// with. False (the chunk is poisoned) if the block holds NaN or inf, or if its scale would exceed
/// int8_max_scale (|x| beyond ~3.39e38). A block below int8_min_abs_max flushes to zero: scale = inv = 0, so
/// every code is rne(x * 0) = 0.
inline bool int8_block_scale(abs_max_bits m_bits, float& scale, float& inv) {
  scale = 0.0f;
  inv = 0.0f;
  if (m_bits >= 0x7f800000u) return false;  // NaN or inf in the block
  const float m = float_of(m_bits);
  if (m < int8_min_abs_max) return true;
  scale = m / 127.0f;
  inv = 127.0f / m;
  return scale <= int8_max_scale;
}

/// The block walk of the levels' int8_encode_blocks: for each block, the level's abs_max, the scale by
/// int8_block_scale, then the level's quantize. False as soon as a block poisons the chunk. The level passes
/// its own per-block kernels and calls this from an [[gnu::flatten]] int8_encode_blocks, so that everything
/// inlines into that one function (compiled for the level's target): no call per block.
template <class AbsMax, class Quantize>
[[gnu::always_inline]] inline bool int8_encode_walk(const float* src, size_t n, std::byte* scales,
                                                    std::byte* codes, AbsMax abs_max, Quantize quantize) {
  for (size_t i = 0; i < n; i += int8_block) {
    const size_t len = n - i < int8_block ? n - i : int8_block;
    float scale, inv;
    if (!int8_block_scale(abs_max(src + i, len), scale, inv)) return false;
    std::memcpy(scales + 4 * (i / int8_block), &scale, sizeof scale);
    quantize(src + i, len, inv, codes + i);
  }
  return true;
}

/// The block walk of the levels' int8_decode_blocks: each block's scale, then the level's dequantize (or
/// dequantize_add), inlined as in int8_encode_walk.
template <class Dequantize, class DequantizeAdd>
[[gnu::always_inline]] inline void int8_decode_walk(const std::byte* codes, const std::byte* scales, size_t n,
                                                    float* out, bool add, Dequantize dequantize,
                                                    DequantizeAdd dequantize_add) {
  for (size_t i = 0; i < n; i += int8_block) {
    const size_t len = n - i < int8_block ? n - i : int8_block;
    float scale;
    std::memcpy(&scale, scales + 4 * (i / int8_block), sizeof scale);
    if (add) {
      dequantize_add(codes + i, len, scale, out + i);
    } else {
      dequantize(codes + i, len, scale, out + i);
    }
  }
}

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
  /// The plain int8 encode of a chunk of n values (CODEC.md), all blocks in one call: each block's scale by
  /// int8_block_scale, stored at scales + 4b (fp32, little-endian, no alignment), and its codes at codes + i.
  /// False if a block poisons the chunk; scales and codes are then unspecified (the caller poisons them).
  bool (*int8_encode_blocks)(const float* src, size_t n, std::byte* scales, std::byte* codes);
  /// The plain int8 decode of a chunk, all blocks in one call: out = float(q) * s_b, or with add
  /// out += float(q) * s_b, the product rounded to fp32 first. The caller has validated every scale.
  void (*int8_decode_blocks)(const std::byte* codes, const std::byte* scales, size_t n, float* out, bool add);
  /// One block's pieces of the two above, used inside them (AVX2 takes the scalar ones for its tails).
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
/// The kernels of a level this CPU runs (asserts isa_supported).
const codec_kernels& kernels_for(simd_isa isa);

}  // namespace longwave::comm::detail
