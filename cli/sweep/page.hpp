#pragma once
// out_dir/sweep.html: one self-contained page (inline SVG, no scripts, no network) with what a researcher
// looks at first: final loss against each swept key, loss curves per point, a heat map over two keys, the
// scaling-law fits and a table of every point.
#include <string>
#include <vector>

#include "cli/sweep/results.hpp"
#include "cli/sweep/scaling.hpp"
#include "cli/sweep/sweep_file.hpp"

namespace longwave::cli::sweep {

/// The page's HTML. Charts use `longwave report`'s SVG line charts (cli/report/charts.hpp).
std::string sweep_page(const sweep_spec& s, const std::vector<point_result>& results,
                       const scaling_fits& fits);

}  // namespace longwave::cli::sweep
