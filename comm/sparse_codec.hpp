#pragma once
// Sparse wire codec for pseudo-gradients: per chunk, the k largest-magnitude values (exact top-k, ties to the
// lower index), their indices bit-packed and their magnitudes quantized to 2 or 4 bits. Format:
// comm/CODEC.md.
#include <cstddef>
#include <cstdint>
#include <string>

namespace longwave::comm {

/// The sparse codec's parameters; part of the wire format (both ends must use the same ones).
struct sparse_options {
  /// Values per chunk (top-k runs per chunk, chunks counted from the first value); 1 .. 2^24.
  size_t chunk = 4096;
  /// Kept fraction, in (0, 1]: a chunk of L values keeps k = max(1, round(density * L)).
  double density = 0.0156;
  /// Bits per kept value: 1 sign bit and value_bits - 1 magnitude bits. 2 or 4.
  unsigned value_bits = 2;
};

/// Empty if o is valid, else one line naming the bad field and its allowed range.
std::string sparse_options_error(const sparse_options& o);

/// Values kept out of a chunk of len values: max(1, round(density * len)) (0 for len = 0).
size_t sparse_kept(size_t len, const sparse_options& o);

/// Bytes that sparse_encode writes for n values: exact, a function of n and o only. SIZE_MAX on overflow.
/// o must be valid (LW_ASSERT).
size_t sparse_encoded_size(size_t n, const sparse_options& o);

/// Encodes n floats into dst, which must hold sparse_encoded_size(n, o) bytes (no alignment needed). Output
/// bytes depend only on the input values and o. A chunk holding NaN or ±inf is written poisoned: every
/// decoder refuses it. Returns false if any chunk was poisoned. o must be valid (LW_ASSERT).
bool sparse_encode(const float* src, size_t n, std::byte* dst, const sparse_options& o);

/// dst[i] = decoded value of i, 0 where nothing was sent, for i < n. Returns false, leaving dst unchanged, if
/// bytes != sparse_encoded_size(n, o) or the data is invalid (a scale that is negative, NaN or inf, or
/// lo > hi; an index out of its chunk or not increasing; nonzero padding bits). `why`, if given,
/// receives one line saying what was wrong. Use it to validate a peer's data.
bool sparse_decode(const std::byte* src, size_t bytes, size_t n, float* dst, const sparse_options& o,
                   std::string* why = nullptr);

/// acc[i] += scale * decoded value of i (only the sent ones are touched; one fp32 product and one sum);
/// validates like sparse_decode and leaves acc unchanged on false.
bool sparse_decode_accumulate(const std::byte* src, size_t bytes, size_t n, float* acc,
                              const sparse_options& o, std::string* why = nullptr, float scale = 1.0f);

/// *sum_sq = the sum of the squared decoded values (in double, in index order); validates like sparse_decode.
bool sparse_sum_squares(const std::byte* src, size_t bytes, size_t n, const sparse_options& o, double* sum_sq,
                        std::string* why = nullptr);

/// acc[i] -= decoded value of i: what error feedback removes from its residual. Validates like sparse_decode.
bool sparse_decode_subtract(const std::byte* src, size_t bytes, size_t n, float* acc, const sparse_options& o,
                            std::string* why = nullptr);

}  // namespace longwave::comm
