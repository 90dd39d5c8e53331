#pragma once
// `longwave launch CLUSTER.toml`: a local multi-node simulation, one process per role.
#include <string>
#include <vector>

namespace longwave::cli {

/// Starts `exe coordinator CLUSTER` and `exe node CLUSTER --node NAME` for every node (overrides passed on as
/// --set, --fresh to the nodes), prints their output line by line prefixed with the role's name, forwards
/// the first Ctrl-C to all of them (a second one kills them), and stops the others when one fails. Returns 0
/// when every role succeeded, 130 after Ctrl-C, else the first failing role's exit code.
int launch(const std::string& exe, const std::string& cluster_path, const std::vector<std::string>& overrides,
           bool fresh);

}  // namespace longwave::cli
