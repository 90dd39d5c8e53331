#pragma once
// Which backends this binary has, and NCCL's collective in a build with LONGWAVE_WITH_NCCL (the ZeroMQ ring
// of a cluster node is the cluster's elastic ring, cluster/node_link.cpp).
#include <functional>
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
/// in a build without NCCL or where no CUDA device is visible. Call it before anything starts, --dry-run
/// included.
void check_backend(const config::train_config& cfg);

/// A new NCCL unique id (hex), which an epoch's rank 0 makes and the cluster's control plane hands to the
/// other members; NCCL's bootstrap root then listens in this process. Throws lw_error(invalid_config) in a
/// build without NCCL.
std::string make_nccl_id();

/// comm.backend = "nccl" for rank `rank` of `world`: NCCL on CUDA device 0 (choose the GPU with
/// CUDA_VISIBLE_DEVICES), with the ring settings' dtype and timeouts, in the communicator whose unique id is
/// `unique_id` (make_nccl_id at the epoch's rank 0). Blocks until every rank has joined; with `abandon`, the
/// communicator is non-blocking and abandon is polled meanwhile (it throws to give up: a fence). Throws
/// config_error as check_backend does.
std::shared_ptr<comm::collective> make_nccl_collective(const config::train_config& cfg,
                                                       const comm::ring_options& ring, int rank, int world,
                                                       const std::string& unique_id,
                                                       std::function<void()> abandon = {});

}  // namespace longwave::actors
