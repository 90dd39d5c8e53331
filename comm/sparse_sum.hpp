#pragma once
// The average of gathered sparse messages (comm/collective.hpp's allgather): each rank's message decoded and
// added in rank order, optionally clipped to the round's median norm, so every node gets the same bits.
#include <cstddef>
#include <string>
#include <vector>

#include "comm/collective.hpp"
#include "comm/sparse_codec.hpp"

namespace longwave::comm {

/// What sparse_mean saw, for the metrics.
struct sparse_mean_stats {
  std::vector<double> norms;  ///< L2 norm of each rank's decoded message (0 for ranks of weight 0)
  double median_norm = 0;     ///< median of the contributing ranks' norms (computed only with clip)
  size_t clipped = 0;         ///< contributions scaled down to the median
};

/// out[i] = sum_r (c_r / sum_r w_r) * x_r[i] for i < n, ranks in order, where x_r is the decoding of rank r's
/// message and c_r = w_r, or with clip w_r * min(1, median / |x_r|), the median over the ranks of positive
/// weight (Templar's robust aggregation: a diverging or faulty node cannot dominate). Ranks of weight 0 are
/// skipped. The result depends only on g, n and o (plain fp32 loops, no FMA). Returns false, out unchanged
/// and `why` naming the rank, if a message of positive weight does not decode or no weight is positive.
bool sparse_mean(const gathered& g, size_t n, const sparse_options& o, bool clip, float* out,
                 std::string* why = nullptr, sparse_mean_stats* stats = nullptr);

}  // namespace longwave::comm
