#pragma once
// What each point of a sweep gave: read from its run's out_dir (metrics.jsonl, result.json), kept as one row
// per point in out_dir/results.csv and results.jsonl, and the per-point record that lets a resumed sweep
// skip the points that finished.
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cli/sweep/sweep_file.hpp"
#include "runtime/files/atomic_file.hpp"

namespace longwave::cli::sweep {

/// One point's outcome and its curves.
struct point_result {
  /// "pending" (not run yet), "running" (started, not ended: it resumes), "done", "failed" (exit_code says
  /// how), "interrupted" (Ctrl-C on the sweep), "stale" (its folder holds a run of other settings or another
  /// base config: it starts over), "in use" (a live run holds its folder: not started, no exit code).
  std::string status = "pending";
  int exit_code = -1;
  double val_loss = std::numeric_limits<double>::quiet_NaN();
  double val_ppl = std::numeric_limits<double>::quiet_NaN();
  double tokens = std::numeric_limits<double>::quiet_NaN();  ///< trained, all workers
  double wall_s = std::numeric_limits<double>::quiet_NaN();  ///< the run's sessions, summed
  double bytes_sent = std::numeric_limits<double>::quiet_NaN();
  double utilization = std::numeric_limits<double>::quiet_NaN();  ///< workers' compute / wall time
  double params = std::numeric_limits<double>::quiet_NaN();
  double steps = std::numeric_limits<double>::quiet_NaN();  ///< inner steps per worker
  std::vector<std::pair<double, double>> val_curve;         ///< (tokens, val loss) of each evaluation
  std::vector<std::pair<double, double>> train_curve;       ///< (tokens, train loss) of each step
  std::string log;                                          ///< the run's output: out_dir/points/<id>/log.txt
};

/// Fills r's numbers and curves from a run's out_dir's metrics.jsonl (tokens: inner steps x workers x batch x
/// seq_len).
/// Leaves them NaN where the run wrote nothing (it failed before training). Without a readable metrics.jsonl
/// the final figures come from result.json. Returns why the metrics could not be read ("": they were).
/// Never throws.
std::string read_run(const std::string& run_dir, point_result& r);

/// out_dir/points/<id>/point.json: written when the point's run ends (status, exit code, the overrides it
/// ran with).
void write_point_record(const sweep_point& p, const point_result& r);
/// A hash of the point's resolved config (its settings and the base config's text as loaded), its name and
/// directories left out (training_identity).
std::string config_fingerprint(const sweep_point& p);
/// config_fingerprint(p) first, then what records of earlier versions hold for the same settings.
std::vector<std::string> config_fingerprints(const sweep_point& p);

/// What an earlier invocation recorded for p: status ("done", "failed", "interrupted") and exit code; status
/// "pending" when there is no record or it was made for other settings (the sweep file changed). The
/// numbers are not read here (read_run).
point_result recorded(const sweep_point& p);

/// Writes out_dir/results.csv and out_dir/results.jsonl, each through a temporary file renamed over the
/// old one: id, every swept key, seed, status, exit code, final val loss and perplexity, tokens, wall
/// seconds, bytes sent, utilization, parameters, steps, log. Returns what failed, a line per file.
std::vector<std::string> write_results(const sweep_spec& s, const std::vector<point_result>& results);

/// Moves p's folder to out_dir/<under>/<id> (<id>.2, ... when taken): a run of other settings, kept.
/// Returns where it went, "" when it could not be moved. A folder under a subfolder of superseded/ is never
/// taken back (unclaimed_runs reads superseded/ one level deep): --fresh's discarded runs go there.
std::string set_aside(const sweep_spec& s, const sweep_point& p, const std::string& under = "superseded");

/// The runs in out_dir that no point of s names (points/<another id>, superseded/*), by the config hash of
/// their point.json (a finished one first): a point whose id changed (repeats raised, a key added at its
/// base value) or whose settings came back takes its run from there.
std::map<std::string, std::string> unclaimed_runs(const sweep_spec& s);

using runtime::write_atomically;

}  // namespace longwave::cli::sweep
