#pragma once
// The report's six charts built from a run's records: loss, validation perplexity, utilization and stalls
// per worker, all-reduce seconds and bytes per round.
#include <vector>

#include "cli/report/charts.hpp"
#include "cli/report/summary.hpp"

namespace longwave::cli::report {

/// The charts in page order, one series (or a set per worker) per node; resumes are marked.
std::vector<line_chart> build_charts(const report_data& r);

}  // namespace longwave::cli::report
