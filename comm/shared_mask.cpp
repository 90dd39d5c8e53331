// The shared sparse mask: a comb per chunk with a hashed phase that advances one index per round.
#include "comm/shared_mask.hpp"

#include <algorithm>
#include <string>

#include "runtime/checksum/splitmix64.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::comm {
using runtime::splitmix64;

std::vector<size_t> shared_mask(size_t n, const sparse_options& o, const mask_key& key) {
  const std::string bad = sparse_options_error(o);
  LW_ASSERT(bad.empty(), "shared_mask: " + bad);
  std::vector<size_t> out;
  out.reserve(n / o.chunk * sparse_kept(o.chunk, o) + sparse_kept(n % o.chunk, o));
  const uint64_t base = splitmix64(splitmix64(key.seed) ^ key.part);
  for (size_t start = 0, chunk = 0; start < n; start += o.chunk, ++chunk) {
    // len <= 2^24 and k <= len, so j * len + t < k * len <= 2^48: no overflow.
    const uint64_t len = std::min(o.chunk, n - start);
    const uint64_t k = sparse_kept(static_cast<size_t>(len), o);
    const uint64_t t = (splitmix64(base ^ chunk) % len + key.round % len * k) % len;
    for (uint64_t j = 0; j < k; ++j) out.push_back(start + static_cast<size_t>((j * len + t) / k));
  }
  return out;
}

size_t shared_mask_period(size_t len, const sparse_options& o) {
  if (len == 0) return 1;
  const size_t k = sparse_kept(len, o);
  return (len + k - 1) / k;
}

}  // namespace longwave::comm
