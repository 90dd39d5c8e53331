#pragma once
// `longwave launch CLUSTER.toml`: a local multi-node simulation, one process per role.
#include <string>
#include <vector>

namespace longwave::cli {

/// `--observe`: a real Prometheus server (Debian's /usr/bin/prometheus) scraping every role.
struct observe_options {
  bool enabled = false;
  int port = 9090;                     ///< Prometheus listens on 127.0.0.1:port
  std::string scrape_interval = "5s";  ///< Prometheus duration, e.g. "1s", "15s"
  std::string prometheus = "/usr/bin/prometheus";
};

/// Starts `exe coordinator CLUSTER` and `exe node CLUSTER --node NAME` for every node (overrides passed on as
/// --set, --fresh to the nodes), prints their output line by line prefixed with the role's name, forwards
/// the first Ctrl-C to all of them (a second one kills them), and stops the others when one fails. Returns 0
/// when every role succeeded, 130 after Ctrl-C, 4 when another launch holds <run.out_dir>/logs, else the
/// first failing node's exit code (unless the coordinator's own says more), else the coordinator's. With
/// observe, it also writes <run.out_dir>/prometheus/prometheus.yml, starts Prometheus with its data (and log)
/// beside it, and stops it with the cluster.
int launch(const std::string& exe, const std::string& cluster_path, const std::vector<std::string>& overrides,
           bool fresh, const observe_options& observe = {});

}  // namespace longwave::cli
