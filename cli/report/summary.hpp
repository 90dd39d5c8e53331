#pragma once
// What the report says about each node and about the whole run: final validation, utilization, stalls,
// sessions, bytes and status, from the nodes' records.
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cli/report/records.hpp"

namespace longwave::cli::report {

/// The records of every node of a run, and the run's time span.
struct report_data {
  std::string run_dir;
  std::vector<node_metrics> nodes;
  /// Several runs that each trained alone (no start line names more workers than its own), found in one
  /// folder: not one cluster's nodes.
  bool separate_runs = false;
  /// A cluster's RUN_DIR/coordinator.jsonl (its membership records, read as a node's), when it has one: its
  /// end record says how the run ended and which nodes it removed on the way.
  std::optional<node_metrics> coordinator;
  double t0 = std::numeric_limits<double>::quiet_NaN();      ///< first start, unix seconds
  double t_last = std::numeric_limits<double>::quiet_NaN();  ///< last record, unix seconds
};

/// Sets r.t0 (the first start line, else the first record) and r.t_last (the last record).
void find_time_span(report_data& r);

/// A per-node view of what the page shows.
struct node_summary {
  double final_val_loss = std::numeric_limits<double>::quiet_NaN();
  double final_val_ppl = std::numeric_limits<double>::quiet_NaN();
  double utilization = std::numeric_limits<double>::quiet_NaN();
  double stall_s = 0;
  double last_step = std::numeric_limits<double>::quiet_NaN();
  double allreduce_mean_s = std::numeric_limits<double>::quiet_NaN();
  /// Share of its all-reduce time the node held chunks the next node would not take, and that node's name
  /// (allreduce records' send_wait_seconds and next; NaN without).
  double send_wait_share = std::numeric_limits<double>::quiet_NaN();
  std::string next_node;
  double active_s = 0;
  std::string status;
  /// diloco.outer = "async" (NaN or 0 without): local phases, their mean step rate, the tokens they trained
  /// and how many of those a merge took, its contributions' staleness (mean, max) and the drops.
  double async_phases = 0;
  double async_steps_per_s = std::numeric_limits<double>::quiet_NaN();
  double async_trained_tokens = 0, async_merged_tokens = 0;
  double async_mean_staleness = std::numeric_limits<double>::quiet_NaN();
  double async_max_staleness = std::numeric_limits<double>::quiet_NaN();
  double async_dropped = 0;
};

node_summary summarize(const node_metrics& m);

/// The whole run: each node's summary and the sums and maxima over the nodes.
struct run_summary {
  std::vector<node_summary> nodes;  ///< in report_data::nodes order
  /// The first node's summary, with the final validation of the first node that has one (cluster nodes
  /// evaluate the same global parameters).
  node_summary overall;
  double bytes = 0;     ///< sent by all nodes
  double workers = 0;   ///< of all nodes, from their first start lines
  double active_s = 0;  ///< the longest node's sum of sessions
  double stall_s = 0;   ///< of all workers
  double utilization = std::numeric_limits<double>::quiet_NaN();  ///< compute / wall time of all workers
  size_t sessions = 0;                                            ///< the most of any node
  size_t min_sessions = 0;  ///< the fewest: below `sessions` when a node alone restarted (and rejoined)
  size_t n_checkpoints = 0;
  /// Workers on GPUs (their "worker" records carry gpu_busy_s): device seconds over their wall seconds, the
  /// highest peak of GPU memory, and the mean model FLOP/s utilization of their last rounds; NaN without.
  double gpu_utilization = std::numeric_limits<double>::quiet_NaN();
  double gpu_peak_bytes = std::numeric_limits<double>::quiet_NaN();
  double mfu = std::numeric_limits<double>::quiet_NaN();
  /// The ring's slowest link, when one node waited to send for at least a quarter of its all-reduce time:
  /// "n0 -> n1 (48 % of n0's all-reduce time waiting to send)"; empty otherwise.
  std::string slowest_link;
  /// "completed", or the last node's status that is not; a cluster's coordinator's end record, when there is
  /// one: "completed; removed on the way: c (lost)", "stopped (longwave stop)", ...
  std::string status;
};

run_summary summarize_run(const report_data& r);

}  // namespace longwave::cli::report
