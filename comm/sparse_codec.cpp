// Sparse codec: exact per-chunk top-k by magnitude, bit-packed indices and 2/4-bit magnitude codes, and the
// validation of peer data. Scalar and integer-exact selection, so every build gives the same bytes.
#include "comm/sparse_codec.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "comm/codec_kernels.hpp"
#include "runtime/errors/errors.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire format is little-endian");

namespace longwave::comm {
namespace {

using detail::bits_of;
using detail::float_of;

constexpr size_t max_chunk = size_t{1} << 24;
constexpr size_t header_bytes = 8;             // fp32 lo, fp32 hi
constexpr uint32_t poison_bits = 0x7fc00000u;  // quiet NaN in lo: a chunk with non-finite input
constexpr uint32_t abs_mask = 0x7fffffffu;
constexpr uint32_t inf_bits = 0x7f800000u;

// Bits per index in a chunk of len values: enough for len - 1, at least 1.
unsigned index_bits(size_t len) {
  unsigned w = 1;
  while (w < 32 && (size_t{1} << w) < len) ++w;
  return w;
}

size_t bytes_for_bits(size_t bits) {
  return (bits + 7) / 8;
}

// Bytes of one chunk of len values: header, packed indices, packed codes (each section padded to a byte).
size_t chunk_bytes(size_t len, const sparse_options& o) {
  const size_t k = sparse_kept(len, o);
  return header_bytes + bytes_for_bits(k * index_bits(len)) + bytes_for_bits(k * o.value_bits);
}

// Magnitude levels of value_bits: 2^(value_bits - 1).
uint32_t levels(const sparse_options& o) {
  return uint32_t{1} << (o.value_bits - 1);
}

// Distance between magnitude levels lo, lo + step, ..., the top level being hi itself.
float level_step(float lo, float hi, uint32_t top_level) {
  return (hi - lo) / static_cast<float>(top_level);
}

// Little-endian bit stream: bit j of the stream is bit j % 8 of byte j / 8; a field's low bit comes first.
class bit_writer {
 public:
  explicit bit_writer(std::byte* dst) : dst_(dst) {}
  void put(uint32_t v, unsigned w) {
    acc_ |= uint64_t{v} << n_;
    n_ += w;
    while (n_ >= 8) {
      *dst_++ = static_cast<std::byte>(acc_ & 0xff);
      acc_ >>= 8;
      n_ -= 8;
    }
  }
  // Writes the partial last byte (zero padding); returns the end of the section.
  std::byte* finish() {
    if (n_ > 0) *dst_++ = static_cast<std::byte>(acc_ & 0xff);
    acc_ = 0;
    n_ = 0;
    return dst_;
  }

 private:
  std::byte* dst_;
  uint64_t acc_ = 0;
  unsigned n_ = 0;
};

class bit_reader {
 public:
  explicit bit_reader(const std::byte* src) : src_(src) {}
  uint32_t get(unsigned w) {
    while (n_ < w) {
      acc_ |= uint64_t{std::to_integer<uint8_t>(*src_++)} << n_;
      n_ += 8;
    }
    const auto v = static_cast<uint32_t>(acc_ & ((uint64_t{1} << w) - 1));
    acc_ >>= w;
    n_ -= w;
    return v;
  }
  // True if the bits left in the last byte read (the section's padding) are all zero.
  bool padding_zero() const { return acc_ == 0; }

 private:
  const std::byte* src_;
  uint64_t acc_ = 0;
  unsigned n_ = 0;
};

// Buckets of the top 11 bits of |x| (exponent and 3 significand bits): the bucket holding the k-th largest
// magnitude is found from a histogram, and only its values are sorted.
constexpr int bucket_shift = 20;
constexpr size_t buckets = size_t{1} << (31 - bucket_shift);

// Scratch of one encode call, sized for its largest chunk.
struct select_scratch {
  explicit select_scratch(size_t len) : mag(len), candidates(len), idx(len), hist(buckets) {}
  std::vector<uint32_t> mag;  // |x| bits of the chunk (non-negative floats order as their bits)
  std::vector<uint32_t> candidates;
  std::vector<uint32_t> idx;  // the kept indices, ascending
  std::vector<uint32_t> hist;
};

// The k largest |x| of the chunk in s.mag, exactly, ties to the lower index: indices ascending into s.idx.
// Returns the k-th largest |x| bits. Every selection with the same keys gives the same set, so any exact
// method gives the same bytes.
uint32_t select_top_k(size_t len, size_t k, select_scratch& s) {
  const uint32_t* mag = s.mag.data();
  uint32_t* hist = s.hist.data();
  std::fill(hist, hist + buckets, 0u);
  for (size_t i = 0; i < len; ++i) ++hist[mag[i] >> bucket_shift];
  size_t above = 0;  // values in buckets above b
  uint32_t b = buckets - 1;
  while (above + hist[b] < k) above += hist[b--];
  size_t m = 0;
  for (size_t i = 0; i < len; ++i) {
    if ((mag[i] >> bucket_shift) == b) s.candidates[m++] = mag[i];
  }
  const size_t need = k - above;  // 1 .. m values of bucket b are kept
  uint32_t* c = s.candidates.data();
  std::nth_element(c, c + (need - 1), c + m, std::greater<uint32_t>());
  const uint32_t t = c[need - 1];
  for (size_t j = 0; j + 1 < need; ++j) above += c[j] > t ? 1 : 0;
  size_t ties = k - above;  // values equal to t that are kept: the first ones in index order
  size_t out = 0;
  for (size_t i = 0; i < len; ++i) {
    if (mag[i] > t || (mag[i] == t && ties > 0)) {
      if (mag[i] == t) --ties;
      s.idx[out++] = static_cast<uint32_t>(i);
    }
  }
  return t;
}

// Encodes one chunk; false if it was written poisoned.
bool encode_chunk(const float* x, size_t len, const sparse_options& o, select_scratch& s, std::byte* dst) {
  const size_t k = sparse_kept(len, o);
  const unsigned w = index_bits(len);
  const uint32_t top_level = levels(o) - 1;
  uint32_t* mag = s.mag.data();
  const uint32_t* idx = s.idx.data();
  bool finite = true;
  uint32_t hi_bits = 0;
  for (size_t i = 0; i < len; ++i) {
    mag[i] = bits_of(x[i]) & abs_mask;
    finite &= mag[i] < inf_bits;
    hi_bits = std::max(hi_bits, mag[i]);
  }
  const float lo = float_of(select_top_k(len, k, s));  // the smallest kept magnitude
  const float hi = float_of(hi_bits);
  const float step = level_step(lo, hi, top_level);
  const bool ok = finite;
  const float header[2] = {ok ? lo : float_of(poison_bits), ok ? hi : 0.0f};
  std::memcpy(dst, header, header_bytes);
  bit_writer out(dst + header_bytes);
  for (size_t j = 0; j < k; ++j) out.put(ok ? idx[j] : static_cast<uint32_t>(j), w);
  out = bit_writer(out.finish());
  for (size_t j = 0; j < k && ok; ++j) {
    const float a = float_of(mag[idx[j]]);
    uint32_t q = 0;
    if (step > 0.0f) q = std::min(top_level, static_cast<uint32_t>(std::nearbyint((a - lo) / step)));
    const uint32_t sign = bits_of(x[idx[j]]) >> 31;
    out.put(sign << (o.value_bits - 1) | q, o.value_bits);
  }
  for (size_t j = 0; j < k && !ok; ++j) out.put(0, o.value_bits);
  out.finish();
  return ok;
}

bool fail(std::string* why, std::string msg) {
  if (why) *why = std::move(msg);
  return false;
}

// A header is valid if 0 <= lo <= hi < inf, with -0 refused (encode never writes it).
bool valid_header(float lo, float hi) {
  if ((bits_of(lo) >> 31) != 0 || (bits_of(hi) >> 31) != 0) return false;
  return std::isfinite(hi) && lo <= hi;
}

// Walks every chunk of a message of n values, validating it; calls apply(i, value) for each sent value. The
// same walk validates (with a no-op apply) before anything is written.
template <class Apply>
bool walk(const std::byte* src, size_t bytes, size_t n, const sparse_options& o, std::string* why,
          Apply apply) {
  const std::string bad = sparse_options_error(o);
  if (!bad.empty()) return fail(why, "sparse options: " + bad);
  const size_t want = sparse_encoded_size(n, o);
  if (bytes != want) {
    return fail(why, std::to_string(bytes) + " bytes for " + std::to_string(n) + " values, expected " +
                         std::to_string(want));
  }
  const uint32_t top_level = levels(o) - 1;
  const unsigned vb = o.value_bits;
  for (size_t start = 0, c = 0; start < n; start += o.chunk, ++c) {
    const size_t len = std::min(o.chunk, n - start);
    const size_t k = sparse_kept(len, o);
    const unsigned w = index_bits(len);
    float header[2];
    std::memcpy(header, src, header_bytes);
    const float lo = header[0];
    const float hi = header[1];
    // Built only for a refusal: a string per chunk would cost more than the decode.
    const auto where = [c] { return "chunk " + std::to_string(c); };
    if (!valid_header(lo, hi)) {
      return fail(why, where() + ": bad scale (lo " + std::to_string(lo) + ", hi " + std::to_string(hi) +
                           "): must be finite with 0 <= lo <= hi");
    }
    const float step = level_step(lo, hi, top_level);
    bit_reader ir(src + header_bytes);
    const std::byte* codes = src + header_bytes + bytes_for_bits(k * w);
    bit_reader cr(codes);
    uint32_t prev = 0;
    for (size_t j = 0; j < k; ++j) {
      const uint32_t i = ir.get(w);
      if (i >= len)
        return fail(why, where() + ": index " + std::to_string(i) + " outside its " + std::to_string(len) +
                             " values");
      if (j > 0 && i <= prev) return fail(why, where() + ": indices not increasing");
      prev = i;
      const uint32_t code = cr.get(vb);
      const uint32_t q = code & top_level;
      const float m = q == top_level ? hi : lo + static_cast<float>(q) * step;
      apply(start + i, (code >> (vb - 1)) != 0 ? -m : m);
    }
    if (!ir.padding_zero() || !cr.padding_zero()) return fail(why, where() + ": nonzero padding bits");
    src += chunk_bytes(len, o);
  }
  return true;
}

template <class Apply>
bool validate_then_apply(const std::byte* src, size_t bytes, size_t n, const sparse_options& o,
                         std::string* why, Apply apply) {
  if (!walk(src, bytes, n, o, why, [](size_t, float) {})) return false;
  return walk(src, bytes, n, o, nullptr, apply);
}

}  // namespace

std::string sparse_options_error(const sparse_options& o) {
  if (o.chunk < 1 || o.chunk > max_chunk) {
    return "chunk = " + std::to_string(o.chunk) + " is outside 1 .. " + std::to_string(max_chunk);
  }
  if (!(o.density > 0.0 && o.density <= 1.0)) {
    return "density = " + std::to_string(o.density) + " is outside (0, 1]";
  }
  if (o.value_bits != 2 && o.value_bits != 4) {
    return "value_bits = " + std::to_string(o.value_bits) + " is not 2 or 4";
  }
  return {};
}

size_t sparse_kept(size_t len, const sparse_options& o) {
  if (len == 0) return 0;
  const auto k = static_cast<size_t>(std::llround(o.density * static_cast<double>(len)));
  return std::clamp<size_t>(k, 1, len);
}

size_t sparse_encoded_size(size_t n, const sparse_options& o) {
  const std::string bad = sparse_options_error(o);
  LW_ASSERT(bad.empty(), "sparse codec: " + bad);
  const size_t full = n / o.chunk;
  const size_t rest = n % o.chunk;
  size_t total;
  if (__builtin_mul_overflow(full, chunk_bytes(o.chunk, o), &total)) return SIZE_MAX;
  if (rest != 0 && __builtin_add_overflow(total, chunk_bytes(rest, o), &total)) return SIZE_MAX;
  return total;
}

bool sparse_encode(const float* src, size_t n, std::byte* dst, const sparse_options& o) {
  const std::string bad = sparse_options_error(o);
  LW_ASSERT(bad.empty(), "sparse codec: " + bad);
  const size_t c = std::min(o.chunk, n);
  select_scratch s(c);
  bool ok = true;
  for (size_t start = 0; start < n; start += o.chunk) {
    const size_t len = std::min(o.chunk, n - start);
    ok &= encode_chunk(src + start, len, o, s, dst);
    dst += chunk_bytes(len, o);
  }
  return ok;
}

bool sparse_decode(const std::byte* src, size_t bytes, size_t n, float* dst, const sparse_options& o,
                   std::string* why) {
  if (!walk(src, bytes, n, o, why, [](size_t, float) {})) return false;
  if (n != 0) std::memset(dst, 0, n * sizeof(float));
  return walk(src, bytes, n, o, nullptr, [dst](size_t i, float v) { dst[i] = v; });
}

bool sparse_decode_accumulate(const std::byte* src, size_t bytes, size_t n, float* acc,
                              const sparse_options& o, std::string* why, float scale) {
  return validate_then_apply(src, bytes, n, o, why, [acc, scale](size_t i, float v) { acc[i] += scale * v; });
}

bool sparse_sum_squares(const std::byte* src, size_t bytes, size_t n, const sparse_options& o, double* sum_sq,
                        std::string* why) {
  double s = 0;
  if (!walk(src, bytes, n, o, why, [&s](size_t, float v) { s += static_cast<double>(v) * v; })) return false;
  *sum_sq = s;
  return true;
}

bool sparse_decode_subtract(const std::byte* src, size_t bytes, size_t n, float* acc, const sparse_options& o,
                            std::string* why) {
  return validate_then_apply(src, bytes, n, o, why, [acc](size_t i, float v) { acc[i] -= v; });
}

}  // namespace longwave::comm
