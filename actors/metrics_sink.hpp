#pragma once
// The metrics sink actor: the only owner of prometheus-cpp objects in a training process. It serves /metrics
// and appends the run's event log, metrics.jsonl.
#include <caf/fwd.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "runtime/messages/interfaces.hpp"

namespace longwave::actors {

/// Where and as whom the sink exposes metrics.
struct metrics_sink_options {
  int port = -1;                      ///< < 0: no HTTP endpoint; 0: a free port
  std::string address = "127.0.0.1";  ///< IPv4 address to bind
  std::string node = "local";         ///< value of the constant `node` label
  std::vector<std::string> workers;   ///< worker label values to pre-create ("0", "1", ...)
  std::vector<std::string> peers;     ///< peer label values to pre-create (other nodes' names)
  std::string jsonl_path;             ///< metrics.jsonl to append to; "" = none
};

/// Messages (names and labels must match runtime/metrics/metric_catalogue.cpp; wrong ones are logged once and
/// dropped): (gauge, name, labels, value) sets a gauge; (count, name, labels, amount) adds to a counter;
/// (observe, name, labels, value) records a histogram observation; (record, json_line) appends one line to
/// metrics.jsonl. `labels` is "" (none), "3" (worker="3") or "key=value[,key=value]".
/// The bound port (port 0: the one chosen) is written to *bound_port. Throws lw_error(io_error) if the port
/// cannot be bound, lw_error(invalid_config) for a bad address.
/// Opens metrics.jsonl for appending; a file that ends mid-line (a full disk, a kill) gets a line break
/// first, so that the report skips only the partial record. Check the stream: a failed open is not said here.
std::ofstream open_event_log(const std::string& path);

runtime::metrics_actor spawn_metrics_sink(caf::actor_system& sys, const metrics_sink_options& opts,
                                          int* bound_port);

}  // namespace longwave::actors
