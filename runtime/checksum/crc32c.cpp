// CRC-32C: slicing-by-8 tables built at compile time, and an SSE4.2 path chosen once at run time.
#include "runtime/checksum/crc32c.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define LW_CRC32C_X86 1
#endif

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "comm/crc32c.cpp assumes a little-endian host (slicing-by-8)"
#endif

namespace longwave::runtime {
namespace {

using crc_tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr crc_tables make_crc_tables() {
  crc_tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
    t[0][i] = c;
  }
  for (size_t k = 1; k < 8; ++k)
    for (size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
  return t;
}

constexpr crc_tables crc_table = make_crc_tables();

uint32_t crc_slicing8(const unsigned char* p, size_t n, uint32_t crc) {
  const auto& t = crc_table;
  crc = ~crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    --n;
  }
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= crc;
    crc = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
          t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    --n;
  }
  return ~crc;
}

// Appending zeros to a CRC is a linear operator over GF(2): a 32 x 32 bit matrix, one word a column.
uint32_t gf2_times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec != 0; vec >>= 1, ++mat)
    if (vec & 1) sum ^= *mat;
  return sum;
}

void gf2_square(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = gf2_times(mat, mat[n]);
}

// odd = the operator of four zero bits, the start of every squaring to a byte and beyond (even: scratch).
void four_zero_bits(uint32_t* odd, uint32_t* even) {
  odd[0] = 0x82F63B78u;  // one zero bit
  uint32_t row = 1;
  for (int n = 1; n < 32; ++n, row <<= 1) odd[n] = row;
  gf2_square(even, odd);  // two zero bits
  gf2_square(odd, even);  // four zero bits
}

#ifdef LW_CRC32C_X86
// The crc32 instruction has a latency of 3 cycles but issues every cycle, so three independent streams over
// adjacent blocks run about three times faster than one. The streams are merged by "appending zeros" to the
// earlier CRC: a linear operator over GF(2), tabulated for the two block lengths used (Mark Adler's method).
constexpr size_t long_block = 8192;  // powers of two (see zeros_operator)
constexpr size_t short_block = 256;

using shift_table = std::array<std::array<uint32_t, 256>, 4>;

// The operator that feeds len zero bytes through the (non-inverted) CRC register; len a power of two.
void zeros_operator(uint32_t* even, size_t len) {
  uint32_t odd[32];
  four_zero_bits(odd, even);
  for (;;) {
    gf2_square(even, odd);  // one zero byte on the first pass, then doubling
    len >>= 1;
    if (len == 0) return;
    gf2_square(odd, even);
    len >>= 1;
    if (len == 0) break;
  }
  for (int n = 0; n < 32; ++n) even[n] = odd[n];
}

shift_table make_shift_table(size_t len) {
  uint32_t op[32];
  zeros_operator(op, len);
  shift_table t{};
  for (uint32_t n = 0; n < 256; ++n)
    for (int k = 0; k < 4; ++k) t[k][n] = gf2_times(op, n << (8 * k));
  return t;
}

uint32_t shift(const shift_table& t, uint32_t crc) {
  return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
}

uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

__attribute__((target("sse4.2"))) uint64_t crc_blocks(const unsigned char*& p, size_t& n, uint64_t c0,
                                                      size_t block, const shift_table& t) {
  while (n >= 3 * block) {
    uint64_t c1 = 0, c2 = 0;
    for (const unsigned char* end = p + block; p < end; p += 8) {
      c0 = _mm_crc32_u64(c0, load64(p));
      c1 = _mm_crc32_u64(c1, load64(p + block));
      c2 = _mm_crc32_u64(c2, load64(p + 2 * block));
    }
    c0 = shift(t, static_cast<uint32_t>(c0)) ^ c1;
    c0 = shift(t, static_cast<uint32_t>(c0)) ^ c2;
    p += 2 * block;
    n -= 3 * block;
  }
  return c0;
}

__attribute__((target("sse4.2"))) uint32_t crc_sse42(const unsigned char* p, size_t n, uint32_t crc) {
  static const shift_table long_shift = make_shift_table(long_block);
  static const shift_table short_shift = make_shift_table(short_block);
  uint64_t c = ~crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  c = crc_blocks(p, n, c, long_block, long_shift);
  c = crc_blocks(p, n, c, short_block, short_shift);
  for (; n >= 8; p += 8, n -= 8) c = _mm_crc32_u64(c, load64(p));
  while (n > 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  return ~static_cast<uint32_t>(c);
}

bool detect_sse42() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}
#endif

}  // namespace

bool crc32c_hardware() {
#ifdef LW_CRC32C_X86
  static const bool has = detect_sse42();
  return has;
#else
  return false;
#endif
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
#ifdef LW_CRC32C_X86
  if (crc32c_hardware()) return crc_sse42(p, n, crc);
#endif
  return crc_slicing8(p, n, crc);
}

uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc) {
  return crc_slicing8(static_cast<const unsigned char*>(data), n, crc);
}

uint32_t crc32c_combine(uint32_t crc1, uint32_t crc2, size_t len2) {
  if (len2 == 0) return crc1;
  // zlib's crc32_combine with the Castagnoli polynomial: square the one-zero-bit operator up to a byte, then
  // apply the operator of each power of two set in len2 to crc1.
  uint32_t even[32], odd[32];
  four_zero_bits(odd, even);
  for (;;) {
    gf2_square(even, odd);  // a byte on the first pass, then doubling
    if (len2 & 1) crc1 = gf2_times(even, crc1);
    len2 >>= 1;
    if (len2 == 0) break;
    gf2_square(odd, even);
    if (len2 & 1) crc1 = gf2_times(odd, crc1);
    len2 >>= 1;
    if (len2 == 0) break;
  }
  return crc1 ^ crc2;
}

uint32_t crc32c_parallel(const void* data, size_t n, unsigned threads) {
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t parts = std::clamp<size_t>(threads, 1, std::max<size_t>(1, n / (1U << 20)));  // >= 1 MB each
  if (parts <= 1) return crc32c(p, n);
  const size_t step = (n / parts + 63) / 64 * 64;
  std::vector<uint32_t> crcs(parts);
  std::vector<size_t> begins(parts), lens(parts);
  for (size_t i = 0; i < parts; ++i) {
    begins[i] = std::min(n, i * step);
    lens[i] = (i + 1 == parts ? n : std::min(n, begins[i] + step)) - begins[i];
  }
  const auto piece = [&](size_t i) { crcs[i] = crc32c(p + begins[i], lens[i]); };
  std::vector<std::thread> pool;
  pool.reserve(parts - 1);
  size_t spawned = 1;  // pieces 1..spawned-1 run on threads; the rest here (a thread that could not start)
  try {
    for (; spawned < parts; ++spawned) pool.emplace_back(piece, spawned);
  } catch (const std::system_error&) {
  }
  piece(0);
  for (size_t i = spawned; i < parts; ++i) piece(i);
  for (auto& th : pool) th.join();
  uint32_t crc = crcs[0];
  for (size_t i = 1; i < parts; ++i) crc = crc32c_combine(crc, crcs[i], lens[i]);
  return crc;
}

}  // namespace longwave::runtime
