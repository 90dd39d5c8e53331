#pragma once
// `longwave coordinator CLUSTER.toml` (the master) and the one-shot requests to a running master. None of it
// links LibTorch or CAF: the `longwave` front binary runs them (cli/main.cpp).
#include <string>

#include "config/cluster_config.hpp"

namespace longwave::cluster {

/// Admits the cluster's nodes, gives them their ring positions, and watches them until they finish. bind:
/// which of [cluster] coordinator's addresses to listen on (empty: the first); another is refused (exit 2).
/// Exit codes: 0 every node finished (one that was declared lost and came back included), 1 a node failed,
/// went silent for good or never joined, 130 Ctrl-C.
int run_master_role(const config::cluster_spec& spec, const std::string& bind = "");

/// `longwave stop CLUSTER.toml`: asks the coordinator to stop the whole cluster (every node finishes its
/// current round, saves its checkpoint and exits 0; then the coordinator exits 0). With CURVE it connects
/// with the cluster's own key pair (keys/cluster.secret, the coordinator's machine). Returns once the
/// coordinator answered: 0 it stops, 1 no answer or a refusal, 2 a refused key or bad key files. With
/// `wait`, returns once the coordinator says how the run ended: 0 when every node that remained stopped or
/// finished with its checkpoint, 1 otherwise, or when the coordinator went silent first.
int request_cluster_stop(const config::cluster_spec& spec, bool wait = false);

/// `longwave node CLUSTER --node NAME --leave`: asks the master to make NAME leave at its next round
/// boundary. 0 when it will, 2 when it cannot (not training, unknown), 1 when the master cannot be reached.
int request_leave(const config::cluster_spec& spec, const std::string& name);

}  // namespace longwave::cluster
