// comm.backend = "nccl" -> nccl_collective; a build without NCCL refuses it with one line.
#include "actors/collective_factory.hpp"

#include <fmt/format.h>

#include <string>

#include "config/config_loader.hpp"
#include "runtime/errors/errors.hpp"

#ifdef LONGWAVE_WITH_NCCL
#include "comm/nccl/nccl_allreduce.hpp"
#include "comm/nccl/nccl_collective.hpp"
#endif

namespace longwave::actors {

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

void check_backend(const config::train_config& cfg) {
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
}

std::string make_nccl_id() {
#ifdef LONGWAVE_WITH_NCCL
  return comm::nccl_allreduce::unique_id();
#else
  throw lw_error(errc::invalid_config, "an NCCL unique id: this binary was built without NCCL");
#endif
}

std::shared_ptr<comm::collective> make_nccl_collective(const config::train_config& cfg,
                                                       const comm::ring_options& ring, int rank, int world,
                                                       const std::string& unique_id,
                                                       std::function<void()> abandon) {
  check_backend(cfg);
#ifdef LONGWAVE_WITH_NCCL
  comm::nccl_collective_options o;
  o.dtype = ring.dtype;
  o.timeout = ring.timeout;
  o.stall_after = ring.stall_report_after;
  o.init_poll = std::move(abandon);
  return std::make_shared<comm::nccl_collective>(rank, world, unique_id, o);
#else
  (void)ring, (void)rank, (void)world, (void)abandon;
  (void)unique_id;
  return nullptr;  // unreachable: check_backend refused it
#endif
}

}  // namespace longwave::actors
