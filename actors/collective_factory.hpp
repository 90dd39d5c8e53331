#pragma once
// comm.backend -> the node's collective: the ZeroMQ ring, or NCCL in a build with LONGWAVE_WITH_NCCL. The one
// place that knows which backends this binary has.
#include <memory>

#include "actors/training.hpp"
#include "comm/collective.hpp"
#include "comm/ring_allreduce.hpp"
#include "config/train_config.hpp"

namespace longwave::actors {

/// True if this binary was built with the NCCL backend (LONGWAVE_WITH_NCCL found CUDA and NCCL).
bool built_with_nccl();

/// "NCCL 2.28.9" (the library this process loads), or "no NCCL in this build".
std::string nccl_summary();

/// Refuses, as a config_error on comm.backend (exit 2), a backend this binary or machine cannot run: "nccl"
/// in a build without NCCL or where no CUDA device is visible, and (for a cluster node, role set) without
/// NCCL_COMM_ID. Call it before anything starts, --dry-run included.
void check_backend(const config::train_config& cfg, const cluster_role* role);

/// The collective of a cluster node for cfg.comm.backend: the ring on role's endpoints (rejections reported
/// to on_reject), or NCCL on CUDA device 0 (choose the GPU with CUDA_VISIBLE_DEVICES). NCCL's unique id is
/// not carried by the rendezvous yet: every node must have NCCL_COMM_ID=<host>:<port> in its environment
/// (rank 0's host and a free port there; NCCL's own bootstrap then listens on it).
std::shared_ptr<comm::collective> make_collective(const config::train_config& cfg, const cluster_role& role,
                                                  comm::ring_allreduce::reject_callback on_reject);

}  // namespace longwave::actors
