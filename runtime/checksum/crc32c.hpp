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

/// True when crc32c() uses the CPU's crc32 instruction.
bool crc32c_hardware();

}  // namespace longwave::runtime
