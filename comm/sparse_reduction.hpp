#pragma once
// comm.dtype = "sparse"'s two reductions (comm/reduction.hpp chooses): each node's own top-k all-gathered, or
// the values at shared seeded indices summed on the dense collective as int8.
#include <memory>

#include "comm/reduction.hpp"

namespace longwave::comm {

/// Top-k per chunk with SparseLoCo's error feedback; the collective all-gathers every node's message and
/// each node takes their rank-ordered mean (comm/sparse_sum.hpp), optionally clipped to the median norm.
std::unique_ptr<reduction> make_topk_sparse(const reduction_options& o);

/// Shared indices: e <- ef_decay * e + x, v = e[mask] quantized as the collective's int8 will, e[mask] -= v;
/// the collective averages every node's v (the same indices everywhere, so they add up on the way and the
/// bytes do not grow with the nodes), and the data becomes 0 except at the mask.
std::unique_ptr<reduction> make_shared_sparse(const reduction_options& o);

}  // namespace longwave::comm
