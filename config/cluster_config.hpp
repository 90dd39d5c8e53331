#pragma once
// A cluster file: one TOML describing the whole cluster. [cluster] names it and the coordinator, each
// [[nodes]] entry is one node process (ring endpoint, local workers, metrics port), and every other section
// is the shared training config (config/train_config.hpp). Example: examples/cluster_4nodes.toml.
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/train_config.hpp"

namespace longwave::config {

/// One [[nodes]] entry.
struct cluster_node {
  std::string name;  ///< [A-Za-z0-9_-], 1..32 characters, unique
  std::string
      endpoint;  ///< where the node's ring socket binds and its previous rank connects, tcp://host:port
  int64_t workers = 1;        ///< local workers (replicas) of this node
  int64_t metrics_port = -1;  ///< /metrics port; -1: [metrics] port + 1 + index (0 there: pick a free one)
  std::string device;         ///< train.device of this node ("": the file's [train] device)
  /// train.speed of this node (unset: the file's [train] speed): its inner steps take pace_step_s / speed.
  std::optional<double> speed;
};

/// How the cluster's links are secured ([security]).
enum class security_mode {
  curve,  ///< ZeroMQ CURVE: nodes authenticated by key, every link encrypted (the default)
  none,   ///< plain TCP: anyone who reaches a port can join and send frames (must be chosen explicitly)
};

/// [security]: mode, the key directory of `longwave keys new`, and revoked keys.
struct security_spec {
  security_mode mode = security_mode::curve;
  std::string keys;                  ///< key directory (relative: to the working directory)
  std::vector<std::string> revoked;  ///< node names or Z85 public keys the coordinator refuses
};

/// The whole cluster.
struct cluster_spec {
  std::string id = "longwave";  ///< cluster name; nodes of another cluster are turned away
  uint64_t cluster_id = 0;      ///< cluster_id_of(id), carried in every frame
  std::string coordinator = "tcp://127.0.0.1:5600";  ///< the coordinator's control endpoint (the first)
  /// Every address a coordinator may run at (`coordinator = ["tcp://a:5600", "tcp://b:5600"]`): nodes
  /// connect to all of them and talk to the one that runs; `longwave coordinator --bind` picks which.
  std::vector<std::string> coordinators = {"tcp://127.0.0.1:5600"};
  double join_timeout_s = 60;       ///< coordinator: wait this long for every node; node: for the welcome
  double heartbeat_timeout_s = 6;   ///< coordinator: a node silent this long leaves the membership
  int64_t min_nodes = 1;            ///< fewer live nodes: wait quorum_timeout_s for joiners, then stop
  double quorum_timeout_s = 60;     ///< how long the members wait below min_nodes
  int64_t metrics_port = -1;        ///< the coordinator's /metrics port; -1: [metrics] port
  bool open = false;                ///< nodes not in the file may join (`longwave node --endpoint --workers`)
  int64_t open_workers = 0;         ///< data regions kept for their workers (default 4 when open)
  std::vector<cluster_node> nodes;  ///< ring order: rank i is nodes[i]
  security_spec security;
  train_config train;  ///< shared config; train.workers is the sum over nodes
};

/// 64-bit FNV-1a of the cluster id text (never 0).
uint64_t cluster_id_of(std::string_view id);

/// FNV-1a of the resolved settings every node must share to compute the same averages (the resolved TOML
/// without what may differ per machine: run.out_dir and name, data paths, train.workers and threads,
/// comm.timeout_s, [eval], [checkpoint], [metrics], [runtime]). The coordinator turns away a node whose
/// fingerprint differs from its own.
uint64_t training_fingerprint(const train_config& cfg);

/// The settings training_fingerprint covers, one "section.key = value" line each in schema order: a node's
/// hello carries them, so that a coordinator that turns it away can name the keys that differ.
std::string training_settings(const train_config& cfg);

/// The keys whose values differ between two training_settings texts (or that one of them lacks), each as
/// "key = A (B)" with a's value first; at most `most` of them.
std::vector<std::string> settings_differences(const std::string& a, const std::string& b, size_t most = 3);

/// Parses a cluster file's text. Overrides "cluster.<key>" and "security.<key>" set [cluster] and
/// [security] fields; all others go to the training config. Throws config_error naming the key
/// ("nodes[2].endpoint", "cluster.coordinator", ...).
cluster_spec parse_cluster(std::string_view toml_text, const std::vector<std::string>& overrides,
                           std::string_view source_name);

/// Reads the file, then parse_cluster. An empty run.name defaults to the file's stem. If `warnings` is given,
/// one line is appended for each thing that is valid but likely a mistake (cluster_warnings).
cluster_spec load_cluster_file(const std::string& path, const std::vector<std::string>& overrides,
                               std::vector<std::string>* warnings = nullptr);

/// What a valid cluster file sets that is likely a mistake, one line each: the train keys of `keys_set` that
/// the other settings leave inert (inert_settings.hpp), async outer steps on a closed cluster of one node,
/// and an async.tokens that the first merge reaches.
std::vector<std::string> cluster_warnings(const cluster_spec& spec, const std::set<std::string>& keys_set);

/// The coordinator's /metrics port ([cluster] metrics_port, else [metrics] port; 0: pick a free one).
int64_t coordinator_metrics_port(const cluster_spec& spec);

/// Index of the node called name; config_error listing the names if there is none.
size_t node_index(const cluster_spec& spec, const std::string& name);

/// The training config of one node: its local workers, out_dir <run.out_dir>/<name>, its metrics port.
train_config node_config(const cluster_spec& spec, size_t index);

/// Global rank of the node's first worker (the workers of nodes before it).
int64_t worker_offset(const cluster_spec& spec, size_t index);

/// How many parts the training data is split into, one per global worker rank: the listed nodes' workers
/// plus [cluster] open_workers.
int64_t data_partitions(const cluster_spec& spec);

/// A node not in the file ([cluster] open): spec with it appended (its metrics port as for a listed node at
/// that position); returns its index. Throws config_error naming what is wrong (not open, a bad name or
/// endpoint, workers out of range, a name or endpoint the file has).
size_t add_open_node(cluster_spec& spec, const std::string& name, const std::string& endpoint,
                     int64_t workers);

/// HOST and PORT of an endpoint tcp://HOST:PORT that endpoint_problem passed.
std::pair<std::string, int64_t> host_port(const std::string& endpoint);

/// Checks "tcp://HOST:PORT" (HOST non-empty and not "*", PORT 1..65535); returns "" or what is wrong.
std::string endpoint_problem(std::string_view endpoint);

/// A node name: 1..32 of the ASCII letters, digits, '_' and '-' (it names key files and log files).
bool valid_node_name(std::string_view name);

/// A name launch uses in run.out_dir beside the nodes' directories (logs/, prometheus/,
/// logs/coordinator.log): no node may have it.
bool reserved_node_name(std::string_view name);

}  // namespace longwave::config
