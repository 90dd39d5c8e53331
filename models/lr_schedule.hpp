#pragma once
// Inner learning rate: linear warm-up, then cosine decay to min_ratio * peak.
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace longwave::models {

/// Learning rate at inner step `step` (0-based) of `total`.
inline double warmup_cosine_lr(double peak, int64_t step, int64_t warmup, int64_t total, double min_ratio) {
  if (warmup > 0 && step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / span);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return peak * (min_ratio + (1.0 - min_ratio) * cosine);
}

/// diloco.adaptive_steps: the schedule's step for inner step k (0-based) of a node's round of h steps, in
/// `round` (from 1) of H-step rounds. Each step advances the schedule by H / h (its share of the round's
/// tokens), so every node ends round r at r * H, whatever its h; h = H gives the plain count.
inline int64_t schedule_step(uint64_t round, int64_t k, int64_t h, int64_t H) {
  return static_cast<int64_t>(round - 1) * H + (h > 0 ? k * H / h : k);
}

}  // namespace longwave::models
