// Metrics sink: a prometheus registry with Longwave's metric catalogue, served by runtime::metrics_server.
#include "actors/metrics_sink.hpp"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <map>
#include <set>

#include "runtime/log.hpp"
#include "runtime/metrics_server.hpp"
#include "runtime/type_ids.hpp"

namespace longwave::actors {

using namespace longwave::runtime;

namespace {

struct metric_def {
  const char* name;
  const char* help;
  bool counter;
};

// The catalogue. Keep dashboards/METRICS.md in step.
const metric_def catalogue[] = {
    {"longwave_train_loss", "Mean training loss of the last inner step", false},
    {"longwave_train_tokens_per_second", "Training tokens per second over all local workers", false},
    {"longwave_train_tokens_total", "Training tokens processed", true},
    {"longwave_inner_step_seconds", "Wall time of the last inner step (forward, backward, update)", false},
    {"longwave_inner_steps_total", "Inner steps done", true},
    {"longwave_outer_round", "Completed outer rounds", false},
    {"longwave_compute_utilization_ratio", "Inner compute time divided by wall time", false},
    {"longwave_idle_seconds", "Worker wall time not spent in inner compute, summed over local workers",
     false},
    {"longwave_val_loss", "Validation loss of theta_global", false},
    {"longwave_val_perplexity", "Validation perplexity of theta_global", false},
    {"longwave_checkpoints_total", "Checkpoints written", true},
    {"longwave_comm_rejected_frames_total", "Received frames dropped by validation, by reason", true},
    {"longwave_comm_bytes_sent_total", "Bytes of ring all-reduce frames sent to the next node (label peer)",
     true},
    {"longwave_comm_bytes_received_total", "Bytes of ring all-reduce frames received, rejected ones included",
     true},
    {"longwave_allreduce_seconds", "Wall time of the last pseudo-gradient all-reduce (local mean and ring)",
     false},
    {"longwave_allreduce_total", "Pseudo-gradient all-reduces completed", true},
    {"longwave_cluster_peers", "Nodes in the ring, this one included", false},
};

struct sink_state {
  std::shared_ptr<prometheus::Registry> registry;
  std::unique_ptr<metrics_server> server;
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> gauges;
  std::map<std::string, prometheus::Family<prometheus::Counter>*> counters;
  std::set<std::string> warned;
};

// The label argument of gauge/count messages: "" (none), "3" (worker="3") or "key=value" (e.g.
// "reason=bad_checksum", "peer=b").
prometheus::Labels labels_for(const std::string& label) {
  if (label.empty()) return {};
  const auto eq = label.find('=');
  if (eq == std::string::npos) return {{"worker", label}};
  return {{label.substr(0, eq), label.substr(eq + 1)}};
}

caf::behavior sink_fun(caf::stateful_actor<sink_state>* self, std::shared_ptr<sink_state> init) {
  self->state = std::move(*init);
  auto unknown = [=](const std::string& name) {
    if (self->state.warned.insert(name).second) spdlog::warn("metrics: unknown metric '{}' dropped", name);
  };
  return {
      [=](gauge_atom, const std::string& name, const std::string& worker, double v) {
        auto it = self->state.gauges.find(name);
        if (it == self->state.gauges.end()) return unknown(name);
        it->second->Add(labels_for(worker)).Set(v);
      },
      [=](count_atom, const std::string& name, const std::string& worker, double inc) {
        auto it = self->state.counters.find(name);
        if (it == self->state.counters.end()) return unknown(name);
        it->second->Add(labels_for(worker)).Increment(inc);
      },
  };
}

}  // namespace

caf::actor spawn_metrics_sink(caf::actor_system& sys, int port, int* bound_port) {
  // Built here, on the caller's thread, so that a port in use is an lw_error for the caller.
  auto s = std::make_shared<sink_state>();
  s->registry = std::make_shared<prometheus::Registry>();
  for (const auto& d : catalogue) {
    if (d.counter)
      s->counters[d.name] = &prometheus::BuildCounter().Name(d.name).Help(d.help).Register(*s->registry);
    else
      s->gauges[d.name] = &prometheus::BuildGauge().Name(d.name).Help(d.help).Register(*s->registry);
  }
  if (port >= 0) {
    s->server = std::make_unique<metrics_server>(s->registry, port);
    if (bound_port) *bound_port = s->server->port();
  }
  return sys.spawn(sink_fun, std::move(s));
}

}  // namespace longwave::actors
