// What both roles derive from the cluster file (see cluster_file.hpp).
#include "cluster/cluster_file.hpp"

#include <spdlog/spdlog.h>

#include "config/config_loader.hpp"

namespace longwave::cluster {

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

uint64_t cluster_fingerprint(const config::cluster_spec& spec, const config::train_config& cfg) {
  return config::training_fingerprint(cfg) ^
         (static_cast<uint64_t>(config::data_partitions(spec)) * 0x9E3779B97F4A7C15ull);
}

void warn_if_unsecured(const config::cluster_spec& spec, const std::string& role) {
  if (spec.security.mode == config::security_mode::none)
    spdlog::warn(
        "{}: [security] mode = \"none\": this cluster's links are neither authenticated nor encrypted; "
        "anyone who reaches its ports can join and send frames (make keys with `longwave keys new`)",
        role);
}

std::optional<comm::cluster_keys> node_keys(const config::cluster_spec& spec, const std::string& name) {
  if (spec.security.mode != config::security_mode::curve) return std::nullopt;
  return comm::load_node_keys(spec.security.keys, name);
}

std::optional<comm::curve_peer> control_curve(const std::optional<comm::cluster_keys>& keys) {
  if (!keys) return std::nullopt;
  return comm::curve_peer{keys->own, keys->coordinator_public};
}

}  // namespace longwave::cluster
