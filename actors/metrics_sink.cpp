// Metrics sink: the catalogue's registry (runtime/metrics_registry), served by runtime/metrics_server, and
// the run's metrics.jsonl.
#include "actors/metrics_sink.hpp"

#include <fstream>
#include <memory>

#include "runtime/log/log.hpp"
#include "runtime/messages/interfaces.hpp"
#include "runtime/metrics/metrics_registry.hpp"
#include "runtime/metrics/metrics_server.hpp"

namespace longwave::actors {

using namespace longwave::runtime;

namespace {

struct sink_state {
  std::unique_ptr<metrics_registry> registry;
  std::unique_ptr<metrics_server> server;
  std::ofstream jsonl;
  std::string jsonl_path;
  bool jsonl_failed = false;
};

metrics_actor::behavior_type sink_fun(metrics_actor::stateful_pointer<sink_state> self,
                                      std::shared_ptr<sink_state> init) {
  self->state = std::move(*init);
  return {
      [=](gauge_atom, const std::string& name, const std::string& labels, double v) {
        self->state.registry->set(name, parse_label_arg(labels), v);
      },
      [=](count_atom, const std::string& name, const std::string& labels, double amount) {
        self->state.registry->add(name, parse_label_arg(labels), amount);
      },
      [=](observe_atom, const std::string& name, const std::string& labels, double v) {
        self->state.registry->observe(name, parse_label_arg(labels), v);
      },
      [=](record_atom, const std::string& line) {
        auto& s = self->state;
        if (!s.jsonl.is_open()) return;
        s.jsonl << line << '\n' << std::flush;
        if (!s.jsonl && !s.jsonl_failed) {
          // A full disk must not stop training: the checkpoints matter, the event log does not.
          s.jsonl_failed = true;
          spdlog::warn("metrics: cannot append to {}; the run report will miss later events", s.jsonl_path);
        }
      },
  };
}

}  // namespace

std::ofstream open_event_log(const std::string& path) {
  bool ends_mid_line = false;
  if (std::ifstream tail(path, std::ios::binary | std::ios::ate); tail && tail.tellg() > 0) {
    tail.seekg(-1, std::ios::end);
    ends_mid_line = tail.get() != '\n';
  }
  std::ofstream out(path, std::ios::app);
  if (ends_mid_line) out << '\n';
  return out;
}

metrics_actor spawn_metrics_sink(caf::actor_system& sys, const metrics_sink_options& opts, int* bound_port) {
  // Built here, on the caller's thread, so that a port in use is an lw_error for the caller.
  auto s = std::make_shared<sink_state>();
  s->registry = std::make_unique<metrics_registry>(metric_role::node, opts.node, opts.workers, opts.peers);
  if (opts.port >= 0) {
    s->server = std::make_unique<metrics_server>(s->registry->registry(), opts.port, opts.address);
    if (bound_port) *bound_port = s->server->port();
  }
  if (!opts.jsonl_path.empty()) {
    s->jsonl_path = opts.jsonl_path;
    s->jsonl = open_event_log(opts.jsonl_path);
    if (!s->jsonl) spdlog::warn("metrics: cannot open {} for appending; no run report data", opts.jsonl_path);
  }
  return sys.spawn(sink_fun, std::move(s));
}

}  // namespace longwave::actors
