#pragma once
// A prometheus-cpp registry holding exactly the catalogue's metrics for one role (node or coordinator),
// every series labelled with the node's name and pre-created at zero so it exists from the first scrape.
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/metrics/metric_catalogue.hpp"

namespace prometheus {
class Registry;
}

namespace longwave::runtime {

/// Label values beyond `node`, e.g. {{"worker", "0"}}; keys must be the catalogue's labels of the metric.
using metric_labels = std::map<std::string, std::string>;

/// Thread-safe: updates may come from any thread while the HTTP server collects.
class metrics_registry {
 public:
  /// Registers every catalogue metric of `role`, with the constant label node=`node`. Series with a worker
  /// label are pre-created for `workers`, with a peer label for `peers`, with a reason label for every known
  /// reason; longwave_build_info is set to 1.
  metrics_registry(metric_role role, std::string node, const std::vector<std::string>& workers = {},
                   const std::vector<std::string>& peers = {});
  ~metrics_registry();
  metrics_registry(const metrics_registry&) = delete;
  metrics_registry& operator=(const metrics_registry&) = delete;

  /// Sets a gauge. An unknown name, a wrong type or wrong label keys are logged once and dropped.
  void set(std::string_view name, const metric_labels& labels, double value);
  /// Adds a non-negative amount to a counter.
  void add(std::string_view name, const metric_labels& labels, double amount);
  /// Records one observation of a histogram.
  void observe(std::string_view name, const metric_labels& labels, double value);

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  const std::string& node() const { return node_; }

 private:
  struct families;
  bool check(const metric_def* d, std::string_view name, metric_type want, const metric_labels& labels);

  std::string node_;
  metric_role role_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<families> families_;
  std::mutex warned_mu_;
  std::set<std::string> warned_;
};

/// Parses the label argument of the metrics sink's messages: "" (none), "3" (worker="3"), or
/// "key=value[,key=value...]".
metric_labels parse_label_arg(const std::string& arg);

}  // namespace longwave::runtime
