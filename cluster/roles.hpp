#pragma once
// The node role of a cluster file: `longwave node CLUSTER.toml --node NAME`. (The master and the one-shot
// requests: cluster/master_role.hpp; `longwave launch` starts both roles as local processes: cli/launch.cpp.)
#include <string>

#include "actors/training.hpp"
#include "cluster/master_role.hpp"
#include "config/cluster_config.hpp"

namespace longwave::cluster {

/// Joins the cluster as node `name` and trains. Exit codes as run_training; 2 also when the coordinator turns
/// the node away (other cluster id or protocol version, unknown name, a name another process has joined
/// with). While it trains, the node logs the coordinator's verdicts (and hands a lost verdict to its ring), a
/// dropped connection to the coordinator, and a stalled ring's wait.
int run_node_role(const config::cluster_spec& spec, const std::string& name, const actors::run_options& opts);

}  // namespace longwave::cluster
