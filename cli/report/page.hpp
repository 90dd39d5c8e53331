#pragma once
// `longwave report RUN_DIR`: turns a run's metrics.jsonl (or a cluster run's <node>/metrics.jsonl files) into
// one self-contained HTML page with inline SVG charts and a summary table.
#include <string>

namespace longwave::cli::report {

/// Reads RUN_DIR/metrics.jsonl, or every RUN_DIR/<node>/metrics.jsonl of a cluster run (one series per node),
/// and writes one HTML file with no scripts and no network references: train loss and val perplexity over
/// steps, utilization and stall seconds per worker over wall time, all-reduce seconds and bytes per round,
/// and a summary table. Malformed lines are skipped with a warning; a truncated last line (a killed run) is
/// ignored. `out_path` empty means RUN_DIR/report.html. Returns 0 on success, 2 on bad input (no run
/// directory, no metrics.jsonl, no valid line, no output directory), 1 when the file cannot be written;
/// every failure prints one line to stderr naming the file.
int write(const std::string& run_dir, const std::string& out_path);

/// The report's style sheet (cards, tables, chart figures), for other pages in the same look (the sweep's).
const char* page_css();

}  // namespace longwave::cli::report
