#pragma once
// `longwave sweep`: runs the points of a sweep as `longwave run` child processes, one after another or
// several at once, skips the points an earlier invocation finished, forwards Ctrl-C, and keeps the results,
// the page and the fits up to date after every point.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cli/sweep/parallel_plan.hpp"
#include "cli/sweep/sweep_file.hpp"

namespace longwave::cli::sweep {

/// What the command line adds to the sweep file.
struct sweep_options {
  std::string exe;            ///< the longwave binary that runs each point (/proc/self/exe)
  bool fresh = false;         ///< start every point over (`longwave run --fresh`), ignoring earlier results
  bool dry_run = false;       ///< print the plan; run nothing
  bool results_only = false;  ///< rebuild results, page and fits from what is on disk; run nothing
  int64_t parallel = -1;      ///< --parallel: overrides [sweep] parallel (0 = auto); -1: the file's
};

/// Runs the sweep. Returns 0 when every point is done, 1 when some failed (named at the end), 4 when another
/// sweep holds out_dir, 130 after Ctrl-C (the same command resumes).
int run_sweep(sweep_spec& s, const sweep_options& o);

}  // namespace longwave::cli::sweep
