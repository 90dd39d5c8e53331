#pragma once
// The shared sparse mask (comm.sparse_indices = "shared"): the value indices that every node sends in one
// round and ring label part, the same on every node, from the run's seed alone (no exchange).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/sparse_codec.hpp"

namespace longwave::comm {

/// Where the mask comes from: every node passes the same values for the same ring label.
struct mask_key {
  uint64_t seed = 0;   ///< run.seed
  uint64_t round = 0;  ///< the ring label's round
  uint32_t part = 0;   ///< the ring label's second part (streaming's fragment sync)
};

/// The indices, strictly increasing and in [0, n), of the values sent for key out of n: per chunk of o.chunk
/// values (the last one shorter) k = sparse_kept(len, o) of them, a comb p_j = floor((j * len + t) / k),
/// j < k, whose phase t = (hash(seed, part, chunk) + round * k) mod len moves every index on by one each
/// round. A comb rather than a fresh random draw: every value is sent at least once in any
/// shared_mask_period(len, o) consecutive rounds, so no residual waits unboundedly; the hashed phase
/// decorrelates chunks, parts and seeds. o must be valid (LW_ASSERT).
std::vector<size_t> shared_mask(size_t n, const sparse_options& o, const mask_key& key);

/// ceil(len / k): the rounds within which a chunk of len values has sent every index (1 for len = 0).
size_t shared_mask_period(size_t len, const sparse_options& o);

}  // namespace longwave::comm
