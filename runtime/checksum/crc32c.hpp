#pragma once
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): portable slicing-by-8, plus the SSE4.2 crc32
// instruction when the CPU has it. Both give the same value; the wire and checkpoints depend on that.
#include <cstddef>
#include <cstdint>

namespace longwave::runtime {

/// CRC-32C of data[0..n), continuing from crc (pass the previous result to checksum data in pieces; 0 to
/// start). crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

/// The same CRC, always computed with the portable slicing-by-8 tables (for tests and comparisons).
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc = 0);

/// The CRC of a followed by b from crc32c(a) and crc32c(b), where len2 is b's length in bytes.
uint32_t crc32c_combine(uint32_t crc1, uint32_t crc2, size_t len2);

/// crc32c(data, n) computed in up to `threads` pieces at once (each at least 1 MB), then combined: the same
/// value, for model-sized buffers whose one-thread CRC is memory-bound.
uint32_t crc32c_parallel(const void* data, size_t n, unsigned threads);

/// True when crc32c() uses the CPU's crc32 instruction.
bool crc32c_hardware();

}  // namespace longwave::runtime
