#pragma once
// Longwave's metric catalogue: every metric any role registers, with its type, labels and meaning.
// dashboards/README.md documents the same table; a unit test keeps the two identical.
#include <string>
#include <string_view>
#include <vector>

namespace longwave::runtime {

enum class metric_type { counter, gauge, histogram };
/// Which process registers a metric: training nodes (`run`, `node`), the cluster coordinator, or both.
enum class metric_role { node, coordinator, both };

/// One catalogue entry. `labels` lists the label names beyond the constant `node` label, comma-separated.
struct metric_def {
  const char* name;
  metric_type type;
  const char* labels;
  metric_role role;
  const char* help;
};

/// The whole catalogue, in documentation order.
const std::vector<metric_def>& metric_catalogue();
/// The entry called name, or nullptr.
const metric_def* find_metric(std::string_view name);
/// Whether a process of role `r` registers m.
bool registered_by(const metric_def& m, metric_role r);

const char* to_string(metric_type t);
const char* to_string(metric_role r);

/// Label values of `reason` for longwave_errors_total, pre-created at 0.
const std::vector<std::string>& error_reasons();
/// Label values of `reason` for longwave_comm_rejected_frames_total (comm::reject_reason names).
const std::vector<std::string>& rejection_reasons();
/// Label values of `reason` for longwave_cluster_refused_handshakes_total (comm::handshake_refusal).
const std::vector<std::string>& handshake_refusal_reasons();

/// Build facts for longwave_build_info.
std::string build_version();
std::string build_git_hash();
std::string build_torch_version();

}  // namespace longwave::runtime
