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

/// Largest |x| of a chunk as raw bits of the non-negative float; >= 0x7f800000 means a NaN or inf was
/// present. Taking the max of the bit patterns is exact, so every level returns the same value.
using abs_max_bits = uint32_t;

/// Smallest and largest value of a chunk, meaningful only if abs_max < 0x7f800000 (the chunk is finite).
struct min_max {
  float lo;
  float hi;
  abs_max_bits abs_max;
};

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
  /// n >= 1.
  min_max (*find_min_max)(const float* src, size_t n);
  /// q = clamp(round_half_even(x * inv_scale), -127, 127); finite input with |x * inv_scale| <= 2^22.
  void (*int8_quantize)(const float* src, size_t n, float inv_scale, std::byte* dst);
  /// dst = float(q) * scale, the product rounded to fp32 (never fused with an add).
  void (*int8_dequantize)(const std::byte* src, size_t n, float scale, float* dst);
  /// acc += float(q) * scale, the product rounded to fp32 before the add.
  void (*int8_dequantize_add)(const std::byte* src, size_t n, float scale, float* acc);
  /// Codebook bins, in double: pos = min(2^28 - 1, trunc((double(x) - lo) * scale)), code = pos >> 20. The
  /// caller guarantees 0 <= (x - lo) * scale < 2^29.
  void (*codebook_bin)(const float* src, size_t n, double lo, double scale, std::byte* codes, uint32_t* pos);
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
