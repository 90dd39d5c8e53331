#pragma once
// splitmix64's finaliser: a fast, well-mixed 64-bit hash of a 64-bit value, for seeded choices that every
// process must make alike (data windows, shared sparse masks). Not a checksum of data.
#include <cstdint>

namespace longwave::runtime {

/// A well-mixed 64-bit value from x (Steele, Lea and Flood's SplitMix64 step).
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace longwave::runtime
