// How many points of a sweep run at once, and with how many torch threads (cli/sweep/parallel_plan.hpp).
#include "cli/sweep/parallel_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

namespace longwave::cli::sweep {

int64_t parallel_plan::threads_for(const sweep_point& p) const {
  if (p.cfg.train.threads > 0) return 0;
  if (pack_by_threads) return 1;
  if (limit > 1) return std::max<int64_t>(1, static_cast<int64_t>(cores) / (limit * p.cfg.train.workers));
  return 0;
}

parallel_plan plan_parallel(int64_t parallel, size_t cores, const std::vector<const sweep_point*>& to_run) {
  parallel_plan pl;
  pl.cores = std::max<size_t>(1, cores);
  if (to_run.empty()) {
    pl.text = "nothing to run";
    return pl;
  }
  int64_t lo = INT64_MAX, hi = 0;
  for (const auto* p : to_run) lo = std::min(lo, p->thread_need()), hi = std::max(hi, p->thread_need());
  const std::string needs = fmt::format(
      "{} cores; each point needs {} (train.workers x train.threads, 0 threads counted as 1)", pl.cores,
      lo == hi ? fmt::format("{} thread{}", lo, lo == 1 ? "" : "s") : fmt::format("{}-{} threads", lo, hi));
  const auto c = static_cast<int64_t>(pl.cores);
  if (parallel == 0) {
    if (2 * lo > c || to_run.size() < 2) {
      pl.text =
          needs + ": parallel = auto runs one point at a time (train.threads = 0 stays cores / workers)";
      return pl;
    }
    pl.pack_by_threads = true;
    pl.limit = static_cast<int64_t>(to_run.size());
    pl.at_once = static_cast<size_t>(std::min<int64_t>(pl.limit, c / lo));
    pl.text = fmt::format(
        "{}: parallel = auto runs up to {} points at once while their threads fit the cores; a point whose "
        "train.threads is 0 gets 1 thread per worker",
        needs, pl.at_once);
    return pl;
  }
  pl.limit = parallel;
  pl.at_once = static_cast<size_t>(std::min<int64_t>(parallel, static_cast<int64_t>(to_run.size())));
  pl.text = fmt::format("{}: parallel = {} runs {} point{} at once", needs, parallel, pl.at_once,
                        pl.at_once == 1 ? "" : "s");
  if (parallel > 1)
    pl.text += fmt::format(
        "; a point whose train.threads is 0 gets cores / ({} x workers) threads per worker (at least 1)",
        parallel);
  if (static_cast<int64_t>(pl.at_once) * lo > c && pl.at_once > 1)
    pl.text += "; more threads than cores: the points slow each other down";
  return pl;
}

}  // namespace longwave::cli::sweep
