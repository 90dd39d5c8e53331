#pragma once
// Wire codecs for pseudo-gradient chunks: fp32 (copy), fp16, bf16 and int8 (a scale per block of 256 values,
// or a 256-bin codebook per chunk), encoded in one dtype and decoded (and accumulated) in fp32. Formats and
// bounds: comm/CODEC.md.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "config/train_config.hpp"

namespace longwave::comm {

/// Element type of a chunk on the wire: the enum of comm.dtype, whose numeric values are part of the wire
/// format. Its names ("fp32", "fp16", "bf16", "int8") are the config's: config::to_string(dt) ("invalid" for
/// a value outside the enum) and config::from_string<wire_dtype>(name).
using wire_dtype = config::wire_dtype;

/// Values per fp32 scale of the plain int8 codec: a chunk of n values has ceil(n / int8_block) scales. Part
/// of the wire format (both ends must use the same build).
constexpr size_t int8_block = 256;

/// Variants of a dtype; both ends of a link must use the same options.
struct codec_options {
  /// int8 only: 256 bins over [min, max] of the chunk with a 256-entry fp32 table of bin means
  /// (1024-byte header) instead of a symmetric scale per block of int8_block values (4 bytes each).
  bool int8_codebook = false;
};

/// Bytes that encode(dt, n, o) writes: 4n (fp32), 2n (fp16, bf16), 4 * ceil(n / int8_block) + n (int8),
/// 1024 + n (int8 codebook).
/// Returns SIZE_MAX if that does not fit in size_t or dt is not a wire_dtype value, so any real byte count
/// fails decode's size check.
size_t encoded_size(wire_dtype dt, size_t n, const codec_options& o = {});

/// Encodes n floats into dst, which must hold encoded_size(dt, n, o) bytes (no alignment needed). One call is
/// one chunk: int8 computes its scales (or codebook) over these n values, blocks counted from src[0].
/// Non-finite input: fp32/fp16/bf16 carry NaN and inf through; int8 writes a chunk that every decoder rejects
/// (see CODEC.md).
void encode(wire_dtype dt, const float* src, size_t n, std::byte* dst, const codec_options& o = {});

/// acc[i] += decoded[i] for i < n, in fp32. Returns false, leaving acc unchanged, if bytes !=
/// encoded_size(dt, n, o), dt is not a wire_dtype value, or the int8 header is invalid (scale NaN, inf,
/// negative or out of range; a codebook entry not finite). Use it to validate a peer's data.
bool decode_accumulate(wire_dtype dt, const std::byte* src, size_t bytes, size_t n, float* acc,
                       const codec_options& o = {});

/// dst[i] = decoded[i] for i < n; validates like decode_accumulate and leaves dst unchanged on false.
bool decode(wire_dtype dt, const std::byte* src, size_t bytes, size_t n, float* dst,
            const codec_options& o = {});

/// The kernel level the functions above use: "scalar", "avx2" or "avx512". Chosen once per process from the
/// CPU, or from LONGWAVE_SIMD=scalar|avx2|avx512 (a level the CPU lacks falls back to the best one below).
const char* simd_level();

/// Explicit kernel levels, for tests and benchmarks. Every level gives bit-identical bytes and sums.
namespace detail {

/// Kernel levels, lowest first.
enum class simd_isa : uint8_t { scalar = 0, avx2 = 1, avx512 = 2 };

/// "scalar", "avx2" or "avx512".
const char* to_string(simd_isa isa);

/// Parses "scalar", "avx2" or "avx512"; nullopt for anything else.
std::optional<simd_isa> parse_simd_isa(std::string_view s);

/// True if this build and CPU can run isa (scalar: always; avx2 needs AVX2, F16C; avx512 needs F, BW, VL).
bool isa_supported(simd_isa isa);

/// The level for a LONGWAVE_SIMD value (nullptr: unset): the best supported level, or the requested one if
/// supported, else the best supported level below it. Pure apart from reading the CPU's features.
simd_isa select_isa(const char* env_value);

/// The level in use (select_isa(getenv("LONGWAVE_SIMD")), computed once; warns on stderr once if the value
/// is not a level or not supported).
simd_isa active_isa();

/// encode at an explicit level; isa must be supported (LW_ASSERT).
void encode(simd_isa isa, wire_dtype dt, const float* src, size_t n, std::byte* dst,
            const codec_options& o = {});

/// decode_accumulate at an explicit level; isa must be supported (LW_ASSERT).
bool decode_accumulate(simd_isa isa, wire_dtype dt, const std::byte* src, size_t bytes, size_t n, float* acc,
                       const codec_options& o = {});

/// decode at an explicit level; isa must be supported (LW_ASSERT).
bool decode(simd_isa isa, wire_dtype dt, const std::byte* src, size_t bytes, size_t n, float* dst,
            const codec_options& o = {});

}  // namespace detail

}  // namespace longwave::comm
