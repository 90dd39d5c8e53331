// comm.backend = "nccl" -> nccl_collective; a build without NCCL refuses it with one line.
#include "actors/collective_factory.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "config/config_loader.hpp"

#ifdef LONGWAVE_WITH_NCCL
#include "comm/nccl/nccl_allreduce.hpp"
#include "comm/nccl/nccl_collective.hpp"
#endif

namespace longwave::actors {

namespace {

/// NCCL_COMM_ID, or empty.
std::string nccl_comm_id() {
  const char* v = std::getenv("NCCL_COMM_ID");
  return v ? v : "";
}

}  // namespace

bool built_with_nccl() {
#ifdef LONGWAVE_WITH_NCCL
  return true;
#else
  return false;
#endif
}

std::string nccl_summary() {
#ifdef LONGWAVE_WITH_NCCL
  try {
    const int v = comm::nccl_allreduce::version();  // major * 10000 + minor * 100 + patch since 2.9
    return fmt::format("NCCL {}.{}.{}", v / 10000, v / 100 % 100, v % 100);
  } catch (const std::exception& e) {
    return std::string("NCCL (its version could not be read: ") + e.what() + ")";
  }
#else
  return "no NCCL in this build";
#endif
}

void check_backend(const config::train_config& cfg, bool cluster_node) {
  if (cfg.comm.backend != config::comm_backend::nccl) return;
  if (!built_with_nccl())
    throw config::config_error("comm.backend",
                               "comm.backend = \"nccl\": this binary was built without NCCL "
                               "(LONGWAVE_WITH_NCCL found no CUDA and NCCL); use comm.backend = \"ring\", or "
                               "rebuild on a machine with CUDA and NCCL (cmake -DLONGWAVE_WITH_NCCL=ON)");
#ifdef LONGWAVE_WITH_NCCL
  if (const auto problem = comm::nccl_collective::device_problem(); !problem.empty())
    throw config::config_error("comm.backend", "comm.backend = \"nccl\": no usable GPU on this machine (" +
                                                   problem + "); use comm.backend = \"ring\"");
#endif
  if (cluster_node && nccl_comm_id().empty())
    throw config::config_error(
        "comm.backend",
        "comm.backend = \"nccl\" needs NCCL_COMM_ID=<host>:<port> (rank 0's host and a free port) in every "
        "node's environment: the cluster rendezvous does not carry NCCL's unique id yet");
}

std::shared_ptr<comm::collective> make_nccl_collective(const config::train_config& cfg,
                                                       const ring_place& place) {
  check_backend(cfg, true);
#ifdef LONGWAVE_WITH_NCCL
  comm::nccl_collective_options o;
  o.dtype = place.ring.dtype;
  o.timeout = place.ring.timeout;
  o.stall_after = place.ring.stall_report_after;
  // With NCCL_COMM_ID set, every rank computes the same id from it, and rank 0's ncclCommInitRank starts
  // NCCL's bootstrap root there.
  return std::make_shared<comm::nccl_collective>(place.rank, static_cast<int>(place.endpoints.size()),
                                                 comm::nccl_allreduce::unique_id(), o);
#else
  (void)place;
  return nullptr;  // unreachable: check_backend refused it
#endif
}

}  // namespace longwave::actors
