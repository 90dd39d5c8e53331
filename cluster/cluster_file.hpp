#pragma once
// What both roles of a cluster file derive from it: the training fingerprint the master checks, CURVE key
// files, and the line a cluster without security gets.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "comm/curve.hpp"
#include "config/cluster_config.hpp"

namespace longwave::cluster {

std::chrono::milliseconds to_ms(double seconds);

/// The training fingerprint a node's hello carries and the master checks: the training settings and how the
/// data is split (which windows each global rank reads).
uint64_t cluster_fingerprint(const config::cluster_spec& spec, const config::train_config& cfg);

/// [security] mode = "none": said once at the start of each role.
void warn_if_unsecured(const config::cluster_spec& spec, const std::string& role);

/// CURVE: node `name`'s keys (nullopt without CURVE). Throws lw_error (invalid_config) naming a missing or
/// bad key file.
std::optional<comm::cluster_keys> node_keys(const config::cluster_spec& spec, const std::string& name);

/// CURVE: what the node's control connection needs: its keys and the master's public key.
std::optional<comm::curve_peer> control_curve(const std::optional<comm::cluster_keys>& keys);

}  // namespace longwave::cluster
