#pragma once
// The sweep's scaling-law fits ([fit]): L(N) = A * N^-alpha + E per group of points (a method) over model
// sizes N, and L(D) over tokens D for each group and size; printed, written to fit.json and drawn.
#include <string>
#include <vector>

#include "cli/sweep/fit.hpp"
#include "cli/sweep/results.hpp"
#include "cli/sweep/sweep_file.hpp"

namespace longwave::cli::sweep {

/// One fit and the data behind it.
struct group_fit {
  std::string group;   ///< "run.mode=diloco" (the group_by values), "" for one group
  std::string size;    ///< token fits: the size the curve is for, e.g. "params=1.84e+06"
  std::string x_name;  ///< "N" (params), a size key such as "model.dim", or "D" (tokens)
  power_law fit;
  std::vector<double> x, y;
};

/// Every fit of a sweep.
struct scaling_fits {
  std::string size_key;  ///< [fit] size
  std::vector<group_fit> sizes;
  std::vector<group_fit> tokens;
};

/// Fits the points that are done: final val loss against size per group, and the val loss curves against
/// tokens per group and size (when [fit] tokens).
scaling_fits fit_scaling(const sweep_spec& s, const std::vector<point_result>& results);

/// One line per fit: "fit run.mode=diloco: L(N) = A·N^-alpha + E, A=... ± ..., alpha=..., E=... (rms residual
/// ..., n points, k sizes)", or why it was not fitted.
std::vector<std::string> fit_lines(const scaling_fits& f);

/// fit.json: every fit with its values, errors, rms residual and data.
std::string fits_json(const scaling_fits& f);

}  // namespace longwave::cli::sweep
