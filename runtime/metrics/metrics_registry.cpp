// metrics_registry: the catalogue's families on a prometheus-cpp registry, with checked updates.
#include "runtime/metrics/metrics_registry.hpp"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include <limits>
#include <sstream>

namespace longwave::runtime {

struct metrics_registry::families {
  std::map<std::string, prometheus::Family<prometheus::Gauge>*, std::less<>> gauges;
  std::map<std::string, prometheus::Family<prometheus::Counter>*, std::less<>> counters;
  std::map<std::string, prometheus::Family<prometheus::Histogram>*, std::less<>> histograms;
};

namespace {

std::vector<std::string> split_labels(const char* labels) {
  std::vector<std::string> out;
  std::stringstream in(labels);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto b = item.find_first_not_of(' '), e = item.find_last_not_of(' ');
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

prometheus::Histogram::BucketBoundaries buckets_of(std::string_view name) {
  if (name == "longwave_worker_inner_step_seconds")
    return {0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 60};
  if (name == "longwave_outer_merge_staleness") return {0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64};
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
}

/// Every label set of metric d to pre-create (none for build_info, which is set explicitly).
std::vector<metric_labels> initial_series(const metric_def& d, const std::vector<std::string>& workers,
                                          const std::vector<std::string>& peers) {
  const auto keys = split_labels(d.labels);
  if (keys.empty()) return {metric_labels{}};
  if (keys.size() != 1) return {};
  const auto& key = keys[0];
  const std::vector<std::string>* values = nullptr;
  if (key == "worker") values = &workers;
  if (key == "peer") values = &peers;
  if (key == "reason") {
    const std::string_view name(d.name);
    values = name == "longwave_errors_total"                       ? &error_reasons()
             : name == "longwave_cluster_refused_handshakes_total" ? &handshake_refusal_reasons()
                                                                   : &rejection_reasons();
  }
  std::vector<metric_labels> out;
  if (values)
    for (const auto& v : *values) out.push_back({{key, v}});
  return out;
}

}  // namespace

metrics_registry::metrics_registry(metric_role role, std::string node,
                                   const std::vector<std::string>& workers,
                                   const std::vector<std::string>& peers)
    : node_(std::move(node)),
      role_(role),
      registry_(std::make_shared<prometheus::Registry>()),
      families_(std::make_unique<families>()) {
  const std::map<std::string, std::string> constant = {{"node", node_}};
  for (const auto& d : metric_catalogue()) {
    if (!registered_by(d, role_)) continue;
    const auto series = initial_series(d, workers, peers);
    switch (d.type) {
      case metric_type::gauge: {
        auto& f = prometheus::BuildGauge().Name(d.name).Help(d.help).Labels(constant).Register(*registry_);
        families_->gauges[d.name] = &f;
        if (std::string_view(d.name) == "longwave_build_info") break;
        // No evaluation yet: NaN (a gap on a dashboard), not a loss of 0.
        const bool unknown = std::string_view(d.name) == "longwave_val_loss" ||
                             std::string_view(d.name) == "longwave_val_perplexity";
        for (const auto& l : series) f.Add(l).Set(unknown ? std::numeric_limits<double>::quiet_NaN() : 0.0);
        break;
      }
      case metric_type::counter: {
        auto& f = prometheus::BuildCounter().Name(d.name).Help(d.help).Labels(constant).Register(*registry_);
        families_->counters[d.name] = &f;
        for (const auto& l : series) f.Add(l);
        break;
      }
      case metric_type::histogram: {
        auto& f =
            prometheus::BuildHistogram().Name(d.name).Help(d.help).Labels(constant).Register(*registry_);
        families_->histograms[d.name] = &f;
        for (const auto& l : series) f.Add(l, buckets_of(d.name));
        break;
      }
    }
  }
  set("longwave_build_info",
      {{"version", build_version()},
       {"git_hash", build_git_hash()},
       {"torch_version", build_torch_version()}},
      1.0);
}

metrics_registry::~metrics_registry() = default;

bool metrics_registry::check(const metric_def* d, std::string_view name, metric_type want,
                             const metric_labels& labels) {
  std::string problem;
  if (!d) {
    problem = "is not in the catalogue";
  } else if (!registered_by(*d, role_)) {
    problem = std::string("is not registered by the ") + to_string(role_) + " role";
  } else if (d->type != want) {
    problem = std::string("is a ") + to_string(d->type) + ", not a " + to_string(want);
  } else {
    const auto keys = split_labels(d->labels);
    bool ok = keys.size() == labels.size();
    for (const auto& k : keys) ok = ok && labels.count(k) == 1;
    if (!ok) problem = std::string("takes the labels {") + d->labels + "}";
  }
  if (problem.empty()) return true;
  std::lock_guard<std::mutex> lock(warned_mu_);
  if (warned_.insert(std::string(name)).second)
    spdlog::warn("metrics: update of '{}' dropped: the metric {}", name, problem);
  return false;
}

void metrics_registry::set(std::string_view name, const metric_labels& labels, double value) {
  const auto* d = find_metric(name);
  if (!check(d, name, metric_type::gauge, labels)) return;
  families_->gauges.find(name)->second->Add(labels).Set(value);
}

void metrics_registry::add(std::string_view name, const metric_labels& labels, double amount) {
  const auto* d = find_metric(name);
  if (!check(d, name, metric_type::counter, labels)) return;
  if (!(amount >= 0)) return;  // counters never go down (NaN is dropped too)
  families_->counters.find(name)->second->Add(labels).Increment(amount);
}

void metrics_registry::observe(std::string_view name, const metric_labels& labels, double value) {
  const auto* d = find_metric(name);
  if (!check(d, name, metric_type::histogram, labels)) return;
  families_->histograms.find(name)->second->Add(labels, buckets_of(name)).Observe(value);
}

metric_labels parse_label_arg(const std::string& arg) {
  metric_labels out;
  if (arg.empty()) return out;
  if (arg.find('=') == std::string::npos) return {{"worker", arg}};
  std::stringstream in(arg);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto eq = item.find('=');
    if (eq != std::string::npos) out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
}

}  // namespace longwave::runtime
