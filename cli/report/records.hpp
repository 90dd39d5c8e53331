#pragma once
// The records of one metrics.jsonl for `longwave report`: each line read with runtime/json/json_reader into a
// flat record, sorted by kind; records that a resumed run redid are dropped.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace longwave::cli::report {

/// One metrics.jsonl line: the top-level members of its object (a later duplicate wins). Kept compact, 16
/// bytes a number (a long run's worker and all-reduce records are many): keys are ids into one table shared
/// by every record (key_id), texts sit beside the fields.
struct record {
  static constexpr uint32_t no_text = UINT32_MAX;
  struct field {
    uint32_t key = 0;                                       ///< key_id of its name
    uint32_t text = no_text;                                ///< a string: its index in texts
    double num = std::numeric_limits<double>::quiet_NaN();  ///< true = 1, false = 0; NaN: null, [..], {..}
  };
  std::vector<field> fields;
  std::vector<std::string> texts;

  /// The member `key`, or nullptr.
  const field* find(std::string_view key) const;
  /// Sets the member `key` (replacing one of that name).
  void set(std::string_view key, double num);
  void set(std::string_view key, std::string text);
};

/// A number field, NaN when it is missing or not a number.
/// (true = 1, false = 0.)
double num(const record& o, std::string_view key);

/// A string field, "" when it is missing or not a string.
std::string text(const record& o, std::string_view key);

/// A step record, kept as the two numbers the report uses: the bulk of a long run's file (one line per
/// inner step) costs 16 bytes a step in memory instead of a record's fields.
struct step_point {
  double step = std::numeric_limits<double>::quiet_NaN();
  double loss = std::numeric_limits<double>::quiet_NaN();
};

/// One node's records, by kind, in file order. Records a resumed run redid are dropped (steps are global).
struct node_metrics {
  std::string name;  // the start line's "node", else the folder name
  std::string path;
  std::vector<step_point> steps;
  std::vector<record> starts, workers, allreduces, evals, checkpoints, ends;
  std::vector<record> memberships;  // each cluster membership (epoch) the node entered
  std::vector<record> recoveries;   // how it got the state when it joined a running cluster
  /// diloco.outer = "async": each local phase (contribution), each version applied, each drop of its own.
  std::vector<record> contributions, versions, drops;
  std::vector<std::pair<double, double>> sessions;  // (first ts, last ts) of each start..next start
  double bytes_sent = 0;                            // every all-reduce, redone rounds included
  /// Round records that say where the round's time went (round 2 on): their seconds waiting for an
  /// all-reduce (reducing_s) and in the outer step, summed.
  size_t timed_rounds = 0;
  double reducing_s = 0, outer_step_s = 0;
  bool ended = false;  // an end record follows the last start in the file (its order: a clock may go back)
  /// Runs before this one in the file, left out: each began again from step 0 (--fresh, or a run stopped
  /// before its first checkpoint), and this one is the newest.
  size_t earlier_runs = 0;
  size_t n_records = 0, n_skipped = 0;
};

/// Reads one metrics.jsonl, a line at a time (the file is never held whole). Malformed lines are skipped with
/// a warning on stderr; a truncated last line is ignored with a note. Returns the error when the file cannot
/// be read or holds no valid record.
std::string read_metrics_file(const std::filesystem::path& path, node_metrics& m);

}  // namespace longwave::cli::report
