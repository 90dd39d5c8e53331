#pragma once
// The metrics sink actor: the only owner of prometheus-cpp objects; serves /metrics on 127.0.0.1.
#include <caf/fwd.hpp>

#include <string>

namespace longwave::actors {

/// Messages: (gauge, name, worker_label, value) sets a gauge ("" = no worker label);
/// (count, name, worker_label, increment) adds to a counter. Names must be in the catalogue
/// (dashboards/METRICS.md); unknown names are logged once and dropped.
/// port < 0 disables the HTTP endpoint; port 0 picks a free one, written to *bound_port.
/// Throws lw_error(io_error) if the port cannot be bound.
caf::actor spawn_metrics_sink(caf::actor_system& sys, int port, int* bound_port);

}  // namespace longwave::actors
