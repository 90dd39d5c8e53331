#pragma once
// Which backends this binary has, and NCCL's collective in a build with LONGWAVE_WITH_NCCL (the ZeroMQ ring
// of a cluster node is the cluster's elastic ring, cluster/node_link.cpp).
#include <memory>

#include "actors/cluster_link.hpp"
#include "comm/collective.hpp"
#include "config/train_config.hpp"

namespace longwave::actors {

/// True if this binary was built with the NCCL backend (LONGWAVE_WITH_NCCL found CUDA and NCCL).
bool built_with_nccl();

/// "NCCL 2.28.9" (the library this process loads), or "no NCCL in this build".
std::string nccl_summary();

/// Refuses, as a config_error on comm.backend (exit 2), a backend this binary or machine cannot run: "nccl"
/// in a build without NCCL or where no CUDA device is visible, and (for a cluster node) without NCCL_COMM_ID.
/// Call it before anything starts, --dry-run included.
void check_backend(const config::train_config& cfg, bool cluster_node);

/// comm.backend = "nccl" for a cluster node at `place`: NCCL on CUDA device 0 (choose the GPU with
/// CUDA_VISIBLE_DEVICES), with the ring settings' dtype and timeouts. NCCL's unique id is not carried by the
/// rendezvous yet: every node must have NCCL_COMM_ID=<host>:<port> in its environment (rank 0's host and a
/// free port there; NCCL's own bootstrap then listens on it). Throws config_error as check_backend does.
std::shared_ptr<comm::collective> make_nccl_collective(const config::train_config& cfg,
                                                       const ring_place& place);

}  // namespace longwave::actors
