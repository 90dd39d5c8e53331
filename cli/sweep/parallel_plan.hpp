#pragma once
// How many points of a sweep run at once, and with how many torch threads each, from the cores and the
// points' thread needs.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cli/sweep/sweep_file.hpp"

namespace longwave::cli::sweep {

/// How many points run at once and with how many torch threads each.
struct parallel_plan {
  size_t cores = 1;
  /// "auto" packs points: a point starts while the running points' threads plus its own fit the cores
  /// (a point that needs more than the cores runs alone). An integer N runs N at once, whatever they need.
  bool pack_by_threads = false;
  size_t at_once = 1;  ///< the most points at once (auto: the cores over the smallest need)
  int64_t limit = 1;   ///< an integer parallel's N (auto: the point count)
  std::string text;    ///< the decision, one line

  /// The train.threads override a point gets, or 0 for none: only points whose config leaves it at 0
  /// (cores / workers) and only when points share the machine; 1 per worker under auto, else
  /// cores / (N x workers).
  int64_t threads_for(const sweep_point& p) const;
};

/// Decides from the cores and the thread needs of the points that will run (train.workers x train.threads,
/// 0 threads counted as 1). parallel: 0 = "auto", else N.
parallel_plan plan_parallel(int64_t parallel, size_t cores, const std::vector<const sweep_point*>& to_run);

}  // namespace longwave::cli::sweep
