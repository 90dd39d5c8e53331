// One-shot requests to a running cluster's master: `longwave node --leave` and `longwave stop`.
#include <spdlog/spdlog.h>

#include "cluster/cluster_file.hpp"
#include "cluster/control_client.hpp"
#include "cluster/master_role.hpp"
#include "config/cluster_config.hpp"
#include "config/config_loader.hpp"

namespace longwave::cluster {

/// `longwave node CLUSTER --node NAME --leave`: asks the coordinator to make NAME leave at its next round
/// boundary. 0 when it will, 2 when it cannot (not training, unknown), 1 when the coordinator cannot be
/// reached.
int request_leave(const config::cluster_spec& spec, const std::string& name) {
  try {
    // A name the file lacks has no key either: say that, not that its key file is missing.
    if (!spec.open) config::node_index(spec, name);
    control_client control(spec.coordinators, spec.cluster_id, control_curve(node_keys(spec, name)));
    const auto [code, text] = control.request_leave(name, std::chrono::seconds(10));
    if (code == errc::none) {
      spdlog::info("the coordinator says: {}", text);
      return 0;
    }
    spdlog::error("the coordinator says: {}", text);
    return 2;
  } catch (const config::config_error& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const lw_error& e) {
    spdlog::error("{}", e.what());
    return e.code() == errc::invalid_config ? 2 : 1;
  }
}

int request_cluster_stop(const config::cluster_spec& spec, bool wait) {
  try {
    std::optional<comm::curve_peer> curve;
    if (spec.security.mode == config::security_mode::curve) {
      const auto keys = comm::load_coordinator_keys(spec.security.keys, {});
      curve = comm::curve_peer{keys.own, keys.coordinator_public};
    }
    control_client control(spec.coordinators, spec.cluster_id, curve);
    const auto [code, text] = control.request_stop(std::chrono::seconds(10));
    if (code != errc::none) {
      spdlog::error("the coordinator says: {}", text);
      return code == errc::invalid_config ? 2 : 1;
    }
    spdlog::info("the coordinator says: {}", text);
    if (!wait) return 0;
    // The answers to its own stop repeated ("already stopping"): only the round, once it is decided.
    bool told_round = false;
    const auto [end, why] = control.wait_stopped(std::chrono::seconds(10), [&](const std::string& now) {
      const auto at = now.find("every node stops after round");
      if (at != std::string::npos && !told_round) {
        told_round = true;
        spdlog::info("the coordinator says: {}", now.substr(at));
      }
    });
    if (end != errc::none) {
      spdlog::error("the run ended: {}", why);
      return 1;
    }
    spdlog::info("the run ended: {}", why);
    return 0;
  } catch (const lw_error& e) {
    spdlog::error("stop: {}", e.what());
    return e.code() == errc::invalid_config ? 2 : 1;
  }
}

}  // namespace longwave::cluster
