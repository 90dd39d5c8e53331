// Cluster files: [cluster] and [[nodes]] read here, the rest by the training-config loader.
#include "config/cluster_config.hpp"

#include <arpa/inet.h>

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "config/config_loader.hpp"
#include "config/inert_settings.hpp"
#include "config/toml_types.hpp"

namespace longwave::config {

namespace {

const std::vector<std::string> k_foreign = {"cluster", "nodes", "security"};
constexpr size_t max_nodes = 64;

/// The source name of a --set override's value: where() says so instead of its line 1.
constexpr std::string_view from_set = "--set";

/// Where a value was set, as the training config's errors say it: " (at FILE:LINE:COL)" or " (from --set)".
std::string where(const toml::node& n) {
  const auto& src = n.source();
  if (src.path && *src.path == from_set) return " (from --set)";
  if (src.begin.line == 0) return {};
  if (!src.path || src.path->empty())
    return fmt::format(" (at line {}:{})", src.begin.line, src.begin.column);
  return fmt::format(" (at {}:{}:{})", *src.path, src.begin.line, src.begin.column);
}

std::string type_of(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    default: return "a date or time";
  }
}

std::string get_string(const toml::node& n, const std::string& key) {
  if (auto v = n.value_exact<std::string>()) return *v;
  throw config_error(key, fmt::format("{}: expected a string, got {}{}", key, type_of(n), where(n)));
}

int64_t get_int(const toml::node& n, const std::string& key, int64_t lo, int64_t hi) {
  auto v = n.value_exact<int64_t>();
  if (!v)
    throw config_error(
        key, fmt::format("{}: expected an integer, got {}{}{}", key, type_of(n), integer_hint(n), where(n)));
  if (*v < lo || *v > hi)
    throw config_error(key,
                       fmt::format("{} = {}: must be an integer in [{}, {}]{}", key, *v, lo, hi, where(n)));
  return *v;
}

/// A number (integers are accepted too); `what` names it in the error ("a number of seconds").
double get_number(const toml::node& n, const std::string& key, const char* what) {
  auto v = n.value<double>();
  if (!v || n.is_boolean() || n.is_string())
    throw config_error(key, fmt::format("{}: expected {}, got {}{}", key, what, type_of(n), where(n)));
  return *v;
}

/// [cluster] heartbeat_timeout_s's least value: one and a half of the nodes' 2 s heartbeat period.
constexpr double min_heartbeat_timeout_s = 3;

double get_seconds(const toml::node& n, const std::string& key) {
  const auto v = get_number(n, key, "a number of seconds");
  if (!(std::isfinite(v) && v > 0 && v <= 1e7))
    throw config_error(key,
                       fmt::format("{} = {}: must be a number of seconds in (0, 1e7]{}", key, v, where(n)));
  return v;
}

/// A number in (0, 1000]: a node's speed.
double get_speed(const toml::node& n, const std::string& key) {
  const auto v = get_number(n, key, "a number");
  if (!(std::isfinite(v) && v > 0 && v <= 1000))
    throw config_error(key, fmt::format("{} = {}: must be a number in (0, 1000] (its inner steps take "
                                        "train.pace_step_s / speed seconds){}",
                                        key, v, where(n)));
  return v;
}

void set_cluster_field(cluster_spec& spec, const std::string& name, const toml::node& value) {
  const std::string key = "cluster." + name;
  if (name == "id") {
    spec.id = get_string(value, key);
    if (spec.id.empty() || spec.id.size() > 128)
      throw config_error(key, fmt::format("cluster.id = \"{}\": must be 1..128 characters", spec.id));
  } else if (name == "coordinator") {
    // One address, or a list of the addresses a coordinator may be started at.
    spec.coordinators.clear();
    if (const auto* list = value.as_array()) {
      if (list->empty() || list->size() > 8)
        throw config_error(key, fmt::format("cluster.coordinator: a list of 1 to 8 addresses, got {}{}",
                                            list->size(), where(value)));
      for (size_t i = 0; i < list->size(); ++i)
        spec.coordinators.push_back(get_string(*list->get(i), fmt::format("{}[{}]", key, i)));
    } else {
      spec.coordinators.push_back(get_string(value, key));
    }
    for (const auto& c : spec.coordinators) {
      if (auto p = endpoint_problem(c); !p.empty())
        throw config_error(key, fmt::format("cluster.coordinator = \"{}\": {}{}", c, p, where(value)));
      if (std::count(spec.coordinators.begin(), spec.coordinators.end(), c) > 1)
        throw config_error(key, fmt::format("cluster.coordinator lists \"{}\" twice{}", c, where(value)));
    }
    spec.coordinator = spec.coordinators.front();
  } else if (name == "join_timeout_s") {
    spec.join_timeout_s = get_seconds(value, key);
  } else if (name == "heartbeat_timeout_s") {
    spec.heartbeat_timeout_s = get_seconds(value, key);
    if (spec.heartbeat_timeout_s < min_heartbeat_timeout_s)
      throw config_error(key,
                         fmt::format("{} = {}: must be at least {} s: nodes send a heartbeat every 2 s, so a "
                                     "shorter timeout takes a live node for lost between two{}",
                                     key, spec.heartbeat_timeout_s, min_heartbeat_timeout_s, where(value)));
  } else if (name == "metrics_port") {
    spec.metrics_port = get_int(value, key, 0, 65535);
  } else if (name == "min_nodes") {
    spec.min_nodes = get_int(value, key, 1, 4096);
  } else if (name == "quorum_timeout_s") {
    spec.quorum_timeout_s = get_seconds(value, key);
  } else if (name == "open") {
    if (auto v = value.value_exact<bool>())
      spec.open = *v;
    else
      throw config_error(
          key, fmt::format("{}: expected true or false, got {}{}", key, type_of(value), where(value)));
  } else if (name == "open_workers") {
    spec.open_workers = get_int(value, key, 0, 4096);
  } else {
    throw config_error(key,
                       fmt::format("unknown key '{}'{}: [cluster] has id, coordinator, join_timeout_s, "
                                   "heartbeat_timeout_s, min_nodes, quorum_timeout_s, open, open_workers and "
                                   "metrics_port",
                                   key, where(value)));
  }
}

void set_security_field(security_spec& sec, const std::string& name, const toml::node& value) {
  const std::string key = "security." + name;
  if (name == "mode") {
    const auto m = get_string(value, key);
    if (m == "curve")
      sec.mode = security_mode::curve;
    else if (m == "none")
      sec.mode = security_mode::none;
    else
      throw config_error(
          key, fmt::format("security.mode = \"{}\": must be \"curve\" or \"none\"{}", m, where(value)));
  } else if (name == "keys") {
    sec.keys = get_string(value, key);
  } else if (name == "revoked") {
    sec.revoked.clear();
    const auto* list = value.as_array();
    if (!list)
      throw config_error(key, fmt::format("security.revoked: expected a list of node names or public keys, "
                                          "got {}{}",
                                          type_of(value), where(value)));
    for (size_t i = 0; i < list->size(); ++i)
      sec.revoked.push_back(get_string(*list->get(i), fmt::format("{}[{}]", key, i)));
  } else {
    throw config_error(
        key, fmt::format("unknown key '{}'{}: [security] has mode, keys and revoked", key, where(value)));
  }
}

/// A --set override's value as a TOML node ("v = RAW", or RAW as a bare string).
toml::table override_value(const std::string& ov, size_t prefix) {
  const auto eq = ov.find('=');
  if (eq == std::string::npos || eq <= prefix)
    throw config_error(ov, fmt::format("override '{}' has no '=': write --set section.key=value", ov));
  const std::string raw = ov.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = parse_toml("v = " + raw, from_set);
  } catch (const toml::parse_error&) {
    parsed.insert("v", raw);  // a bare string
  }
  return parsed;
}

std::string override_name(const std::string& ov, size_t prefix) {
  return ov.substr(prefix, ov.find('=') - prefix);
}

constexpr const char* reserved_because =
    "a name launch uses in run.out_dir (logs/, prometheus/, logs/coordinator.log)";

cluster_node read_node(const toml::node& entry, size_t i) {
  const std::string base = fmt::format("nodes[{}]", i);
  const toml::table* t = entry.as_table();
  if (!t)
    throw config_error(
        base, fmt::format("{}: expected a [[nodes]] table, got {}{}", base, type_of(entry), where(entry)));
  cluster_node n;
  bool has_name = false, has_endpoint = false;
  for (const auto& [k, v] : *t) {
    const std::string name(k.str());
    const std::string key = base + "." + name;
    if (name == "name") {
      n.name = get_string(v, key);
      has_name = true;
    } else if (name == "endpoint") {
      n.endpoint = get_string(v, key);
      has_endpoint = true;
    } else if (name == "workers") {
      n.workers = get_int(v, key, 1, 256);
    } else if (name == "metrics_port") {
      n.metrics_port = get_int(v, key, 0, 65535);
    } else if (name == "device") {
      n.device = get_string(v, key);
      if (const auto problem = device_problem(n.device); !problem.empty())
        throw config_error(key, fmt::format("{} = \"{}\": {}", key, n.device, problem));
    } else if (name == "speed") {
      n.speed = get_speed(v, key);
    } else {
      throw config_error(key,
                         fmt::format("unknown key '{}'{}: a [[nodes]] entry has name, endpoint, workers, "
                                     "metrics_port, device and speed",
                                     key, where(v)));
    }
  }
  if (!has_name) throw config_error(base + ".name", fmt::format("{}.name is missing{}", base, where(entry)));
  if (!valid_node_name(n.name))
    throw config_error(base + ".name",
                       fmt::format("{}.name = \"{}\": use 1..32 letters, digits, '_' or '-'", base, n.name));
  if (reserved_node_name(n.name))
    throw config_error(base + ".name",
                       fmt::format("{}.name = \"{}\": {}; pick another", base, n.name, reserved_because));
  if (!has_endpoint)
    throw config_error(
        base + ".endpoint",
        fmt::format("{}.endpoint is missing (node \"{}\"): write e.g. endpoint = \"tcp://127.0.0.1:5601\"",
                    base, n.name));
  if (auto p = endpoint_problem(n.endpoint); !p.empty())
    throw config_error(base + ".endpoint", fmt::format("{}.endpoint = \"{}\": {}", base, n.endpoint, p));
  return n;
}

}  // namespace

uint64_t cluster_id_of(std::string_view id) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h == 0 ? 1 : h;
}

namespace {

/// The lines of to_toml(cfg) that the fingerprint covers: (section.key, "key = value").
std::vector<std::pair<std::string, std::string>> fingerprinted_lines(const train_config& cfg) {
  static const std::set<std::string> skipped_sections{"eval", "checkpoint", "metrics", "runtime"};
  static const std::set<std::string> skipped_keys{"run.out_dir",         "run.name",
                                                  "data.path",           "data.cache_dir",
                                                  "train.workers",       "train.threads",
                                                  "train.device",        "comm.timeout_s",
                                                  "comm.link_timeout_s", "train.micro_batches",
                                                  "train.deterministic", "train.pace_step_s",
                                                  "train.speed"};
  std::istringstream in(to_toml(cfg));
  std::string section;
  std::vector<std::pair<std::string, std::string>> out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.find(']') - 1);
      continue;
    }
    const std::string key = section + "." + line.substr(0, line.find(' '));
    if (skipped_sections.count(section) || skipped_keys.count(key)) continue;
    out.emplace_back(key, line);
  }
  return out;
}

/// "section.key = value" lines -> key -> value.
std::map<std::string, std::string> settings_map(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find(" = ");
    if (eq != std::string::npos) out.emplace(line.substr(0, eq), line.substr(eq + 3));
  }
  return out;
}

}  // namespace

uint64_t training_fingerprint(const train_config& cfg) {
  std::string kept;
  for (const auto& [key, line] : fingerprinted_lines(cfg)) kept += line + "\n";
  return cluster_id_of(kept);
}

std::string training_settings(const train_config& cfg) {
  std::string out;
  for (const auto& [key, line] : fingerprinted_lines(cfg)) {
    const auto eq = line.find(" = ");
    out += key + " = " + (eq == std::string::npos ? std::string() : line.substr(eq + 3)) + "\n";
  }
  return out;
}

std::vector<std::string> settings_differences(const std::string& a, const std::string& b, size_t most) {
  const auto x = settings_map(a), y = settings_map(b);
  std::set<std::string> keys;
  for (const auto& [k, v] : x) keys.insert(k);
  for (const auto& [k, v] : y) keys.insert(k);
  std::vector<std::string> out;
  for (const auto& k : keys) {
    const auto i = x.find(k), j = y.find(k);
    const std::string va = i == x.end() ? "(unset)" : i->second, vb = j == y.end() ? "(unset)" : j->second;
    if (va != vb && out.size() < most) out.push_back(k + " = " + va + " (" + vb + ")");
  }
  return out;
}

bool reserved_node_name(std::string_view name) {
  return name == "coordinator" || name == "logs" || name == "prometheus";
}

bool valid_node_name(std::string_view name) {
  if (name.empty() || name.size() > 32) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

std::string endpoint_problem(std::string_view ep) {
  constexpr std::string_view scheme = "tcp://";
  if (ep.substr(0, scheme.size()) != scheme) return "must be tcp://HOST:PORT";
  const auto rest = ep.substr(scheme.size());
  const auto colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return "must be tcp://HOST:PORT";
  const auto host = rest.substr(0, colon);
  if (host == "*") return "HOST must be an address the other nodes can reach, not '*'";
  // Every endpoint is bound by some role, and ZeroMQ binds an address, not a name ("No such device" after
  // --dry-run passed); its sockets here speak IPv4 only.
  in_addr numeric{};
  if (::inet_pton(AF_INET, std::string(host).c_str(), &numeric) != 1)
    return fmt::format(
        "HOST '{}' must be an IPv4 address such as 10.0.0.5 (a role binds it, and sockets bind "
        "addresses, not host names{})",
        host, host.front() == '[' ? "; IPv6 is not supported" : "");
  const auto port = rest.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return "PORT must be a number in 1..65535";
  const long p = std::stol(std::string(port));
  if (p < 1 || p > 65535) return "PORT must be a number in 1..65535";
  return {};
}

std::pair<std::string, int64_t> host_port(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  return {endpoint.substr(6, colon - 6), std::stoll(endpoint.substr(colon + 1))};
}

namespace {

/// Every port one host listens on is another: a node's metrics port on another role's ring or control port
/// passed --dry-run, and the ring, the coordinator or /metrics then failed to bind (exit 1 or 2 after the
/// cluster formed). Hosts compare as written; /metrics binds metrics.address, which meets a ring or control
/// port only when it is that host's address or 0.0.0.0.
void check_ports_per_host(const cluster_spec& spec) {
  const auto metrics_on = [&](const std::string& host) {
    const auto& address = spec.train.metrics.address;
    return spec.train.metrics.enabled && (address == "0.0.0.0" || address == host);
  };
  std::map<std::pair<std::string, int64_t>, std::string> taken;
  const auto take = [&](const std::string& key, const std::string& host, int64_t port,
                        const std::string& what) {
    const auto [at, fresh] = taken.emplace(std::make_pair(host, port), what);
    if (!fresh)
      throw config_error(key, fmt::format("{}: port {} on {} is also {}; every port one host listens on must "
                                          "differ",
                                          what, port, host, at->second));
  };
  std::set<std::string> coordinator_hosts;  // a standby on the same host serves /metrics only once it leads
  for (const auto& c : spec.coordinators) {
    const auto [host, port] = host_port(c);
    take("cluster.coordinator", host, port, fmt::format("the coordinator's endpoint {}", c));
    if (metrics_on(host) && coordinator_metrics_port(spec) != 0 && coordinator_hosts.insert(host).second)
      take("cluster.metrics_port", host, coordinator_metrics_port(spec),
           fmt::format("the coordinator's metrics port (at {})", c));
  }
  for (size_t i = 0; i < spec.nodes.size(); ++i) {
    const auto [host, port] = host_port(spec.nodes[i].endpoint);
    take(fmt::format("nodes[{}].endpoint", i), host, port,
         fmt::format("nodes[{}].endpoint {}", i, spec.nodes[i].endpoint));
  }
  for (size_t i = 0; i < spec.nodes.size(); ++i) {
    const int64_t port = node_config(spec, i).metrics.port;
    const auto host = host_port(spec.nodes[i].endpoint).first;
    if (metrics_on(host) && port != 0)
      take(fmt::format("nodes[{}].metrics_port", i), host, port, fmt::format("nodes[{}].metrics_port", i));
  }
}

/// An explicit checkpoint.dir is every node's (nodes have no checkpoint.dir of their own): two nodes on one
/// host would meet on its lock, and the second would end with exit 4 after the cluster formed.
void check_checkpoint_dir_per_host(const cluster_spec& spec) {
  if (spec.train.checkpoint.dir.empty()) return;
  std::map<std::string, size_t> first_on;  // host -> index of its first node
  for (size_t i = 0; i < spec.nodes.size(); ++i) {
    const auto host = host_port(spec.nodes[i].endpoint).first;
    const auto [at, fresh] = first_on.emplace(host, i);
    if (!fresh)
      throw config_error(
          "checkpoint.dir",
          fmt::format(
              "checkpoint.dir = \"{}\": nodes '{}' and '{}' both run on {} and would share it, but each "
              "node keeps checkpoints of its own. Leave checkpoint.dir unset (each node then writes to "
              "run.out_dir/<node>/checkpoints), or give these nodes hosts of their own",
              spec.train.checkpoint.dir, spec.nodes[at->second].name, spec.nodes[i].name, host));
  }
}

}  // namespace

cluster_spec parse_cluster(std::string_view text, const std::vector<std::string>& overrides,
                           std::string_view source_name) {
  cluster_spec spec;
  std::vector<std::string> train_overrides, cluster_overrides, security_overrides;
  for (const auto& ov : overrides)
    (ov.rfind("cluster.", 0) == 0    ? cluster_overrides
     : ov.rfind("security.", 0) == 0 ? security_overrides
                                     : train_overrides)
        .push_back(ov);
  const auto not_diloco = [](run_mode mode) {
    return config_error(
        "run.mode",
        fmt::format("run.mode = \"{}\": a cluster trains with run.mode = \"diloco\"", to_string(mode)));
  };
  // The training sections first: syntax errors are reported there with positions.
  try {
    spec.train = parse_config(text, train_overrides, source_name, k_foreign);
  } catch (const config_error& e) {
    // Single mode asks for train.workers = 1, which a cluster's nodes set: the mode is what is wrong.
    if (e.key() != "train.workers") throw;
    std::optional<run_mode> mode;
    try {
      auto one = train_overrides;
      one.push_back("train.workers=1");
      mode = parse_config(text, one, source_name, k_foreign).run.mode;
    } catch (const config_error&) {
    }
    if (mode && *mode != run_mode::diloco) throw not_diloco(*mode);
    throw;
  }
  toml::table root = parse_toml(text, source_name);

  if (const toml::node* c = root.get("cluster")) {
    const toml::table* t = c->as_table();
    if (!t)
      throw config_error(
          "cluster", fmt::format("cluster: expected a table [cluster], got {}{}", type_of(*c), where(*c)));
    for (const auto& [k, v] : *t) set_cluster_field(spec, std::string(k.str()), v);
  }
  for (const auto& ov : cluster_overrides)
    set_cluster_field(spec, override_name(ov, 8), *override_value(ov, 8).get("v"));
  if (const toml::node* s = root.get("security")) {
    const toml::table* t = s->as_table();
    if (!t)
      throw config_error(
          "security", fmt::format("security: expected a table [security], got {}{}", type_of(*s), where(*s)));
    for (const auto& [k, v] : *t) set_security_field(spec.security, std::string(k.str()), v);
  }
  for (const auto& ov : security_overrides)
    set_security_field(spec.security, override_name(ov, 9), *override_value(ov, 9).get("v"));
  spec.cluster_id = cluster_id_of(spec.id);

  const toml::node* nodes = root.get("nodes");
  if (!nodes)
    throw config_error(
        "nodes",
        "nodes: the cluster file has no [[nodes]] entries; add one per node with name, endpoint "
        "and workers");
  const toml::array* arr = nodes->as_array();
  if (!arr)
    throw config_error(
        "nodes", fmt::format("nodes: expected [[nodes]] tables, got {}{}", type_of(*nodes), where(*nodes)));
  if (arr->empty() || arr->size() > max_nodes)
    throw config_error("nodes",
                       fmt::format("nodes: {} entries; a cluster has 1..{} nodes", arr->size(), max_nodes));
  std::set<std::string> names, endpoints;
  std::set<int64_t> ports;
  int64_t total = 0;
  for (size_t i = 0; i < arr->size(); ++i) {
    auto n = read_node(*arr->get(i), i);
    if (!names.insert(n.name).second)
      throw config_error(fmt::format("nodes[{}].name", i),
                         fmt::format("nodes[{}].name = \"{}\": another node has this name", i, n.name));
    if (!endpoints.insert(n.endpoint).second)
      throw config_error(
          fmt::format("nodes[{}].endpoint", i),
          fmt::format("nodes[{}].endpoint = \"{}\": another node uses this endpoint", i, n.endpoint));
    if (std::count(spec.coordinators.begin(), spec.coordinators.end(), n.endpoint) > 0)
      throw config_error(
          fmt::format("nodes[{}].endpoint", i),
          fmt::format("nodes[{}].endpoint = \"{}\": this is the coordinator's endpoint", i, n.endpoint));
    total += n.workers;
    spec.nodes.push_back(std::move(n));
  }
  if (spec.train.run.mode != run_mode::diloco) throw not_diloco(spec.train.run.mode);
  spec.train.train.workers = total;
  // One process's check, over the listed nodes' workers (an open cluster's joiners may add clients).
  if (!spec.open) check_one_process(spec.train);
  // Here, not when a node sets up: a coordinator and a node's --dry-run refuse it too.
  if (spec.open && spec.train.federated.clients_per_round > 0)
    throw config_error(
        "federated.clients_per_round",
        fmt::format("federated.clients_per_round = {}: client sampling draws from the cluster "
                    "file's workers, and [cluster] open = true adds data parts for nodes not in "
                    "the file; set open = false",
                    spec.train.federated.clients_per_round));
  // Delayed Nesterov's period is one number on every node: 0 resolves here, from the nodes the file lists (a
  // node's own ring when it starts differs between nodes that start while the ring is smaller or larger).
  if (spec.train.diloco.outer == outer_policy_kind::async && spec.train.async.dn_period == 0)
    spec.train.async.dn_period = 2 * static_cast<int64_t>(spec.nodes.size());
  if (spec.open && spec.open_workers == 0) spec.open_workers = 4;
  if (!spec.open && spec.open_workers > 0)
    throw config_error(
        "cluster.open_workers",
        fmt::format("cluster.open_workers = {}: only with cluster.open = true", spec.open_workers));
  // An async quorum above the listed nodes was capped to the live members without a word; an open cluster's
  // joiners may make it up.
  if (spec.train.diloco.outer == outer_policy_kind::async && !spec.open &&
      spec.train.async.quorum > static_cast<int64_t>(spec.nodes.size()))
    throw config_error("async.quorum",
                       fmt::format("async.quorum = {}: the cluster file lists only {} node(s), and a merge's "
                                   "quorum counts nodes",
                                   spec.train.async.quorum, spec.nodes.size()));
  if (spec.min_nodes > static_cast<int64_t>(spec.nodes.size()))
    throw config_error("cluster.min_nodes",
                       fmt::format("cluster.min_nodes = {}: the cluster file lists only {} node(s)",
                                   spec.min_nodes, spec.nodes.size()));
  if (spec.train.metrics.enabled && coordinator_metrics_port(spec) != 0)
    ports.insert(coordinator_metrics_port(spec));
  for (size_t i = 0; i < spec.nodes.size(); ++i) {
    const int64_t port = node_config(spec, i).metrics.port;
    if (spec.train.metrics.enabled && port != 0 && !ports.insert(port).second)
      throw config_error(
          fmt::format("nodes[{}].metrics_port", i),
          fmt::format(
              "nodes[{}].metrics_port: port {} is also another role's (a node's or the coordinator's); "
              "set metrics_port per node and [cluster] metrics_port",
              i, port));
  }
  check_ports_per_host(spec);
  check_checkpoint_dir_per_host(spec);
  if (spec.security.mode == security_mode::curve && spec.security.keys.empty())
    throw config_error(
        "security.keys",
        "security.keys: not set. A cluster's links are authenticated and encrypted by default "
        "([security] mode = \"curve\"): make keys with `longwave keys new --out keys --cluster FILE` and set "
        "[security] keys = \"keys\", or set [security] mode = \"none\" to run without (then anyone who "
        "reaches "
        "the ports can join and send frames)");
  return spec;
}

cluster_spec load_cluster_file(const std::string& path, const std::vector<std::string>& overrides,
                               std::vector<std::string>* warnings) {
  const std::string text = read_config_text(path);
  auto spec = parse_cluster(text, overrides, path);
  if (spec.train.run.name.empty()) spec.train.run.name = run_name_of_file(path);
  if (warnings)
    for (auto& line : cluster_warnings(spec, keys_set(text, overrides))) warnings->push_back(std::move(line));
  return spec;
}

std::vector<std::string> cluster_warnings(const cluster_spec& spec, const std::set<std::string>& keys_set) {
  auto out = inert_settings(spec.train, keys_set);
  if (keys_set.count("train.workers") > 0)
    out.push_back(fmt::format(
        "train.workers is set, but a cluster file's [[nodes]] entries set each node's workers (workers = N): "
        "it is ignored, and the {} listed node(s) have {} worker(s) in all",
        spec.nodes.size(), spec.train.train.workers));
  if (spec.train.diloco.outer != outer_policy_kind::async) return out;
  if (spec.nodes.size() == 1 && !spec.open)
    out.push_back(
        "diloco.outer = \"async\" on a cluster file of one node (and [cluster] open is not true): every "
        "merge is that node's phase alone, the run of outer = \"sync\" with a coordinator's grace windows "
        "added");
  // The smallest phase any listed node reports: the first merge carries at least one.
  int64_t least = 0;
  for (size_t i = 0; i < spec.nodes.size(); ++i) {
    const auto c = node_config(spec, i);
    const int64_t phase = c.train.inner_steps * c.train.batch_size * c.model.seq_len * c.train.workers;
    least = i == 0 ? phase : std::min(least, phase);
  }
  if (spec.train.async.tokens > 0 && spec.train.async.tokens <= least)
    out.push_back(fmt::format(
        "async.tokens = {}: one node's phase is already {} tokens (train.inner_steps x train.batch_size x "
        "model.seq_len x its workers), so the run ends at its first merge",
        spec.train.async.tokens, least));
  return out;
}

int64_t coordinator_metrics_port(const cluster_spec& spec) {
  return spec.metrics_port >= 0 ? spec.metrics_port : spec.train.metrics.port;
}

size_t node_index(const cluster_spec& spec, const std::string& name) {
  std::string all;
  for (size_t i = 0; i < spec.nodes.size(); ++i) {
    if (spec.nodes[i].name == name) return i;
    all += (i ? ", " : "") + spec.nodes[i].name;
  }
  throw config_error("--node",
                     fmt::format("--node {}: the cluster file has no such node (nodes: {})", name, all));
}

train_config node_config(const cluster_spec& spec, size_t index) {
  const auto& n = spec.nodes.at(index);
  train_config c = spec.train;
  c.train.workers = n.workers;
  if (!n.device.empty()) c.train.device = n.device;
  if (n.speed) c.train.speed = *n.speed;
  c.run.out_dir = (std::filesystem::path(spec.train.run.out_dir) / n.name).string();
  if (n.metrics_port >= 0)
    c.metrics.port = n.metrics_port;
  else if (c.metrics.port != 0)
    c.metrics.port = std::min<int64_t>(65535, c.metrics.port + 1 + static_cast<int64_t>(index));
  c.run.name = spec.train.run.name.empty() ? n.name : spec.train.run.name + "/" + n.name;
  validate(c);
  return c;
}

int64_t data_partitions(const cluster_spec& spec) {
  return spec.train.train.workers + (spec.open ? spec.open_workers : 0);
}

size_t add_open_node(cluster_spec& spec, const std::string& name, const std::string& endpoint,
                     int64_t workers) {
  if (!spec.open)
    throw config_error("--node",
                       fmt::format("--node {}: the cluster file has no such node, and [cluster] open is "
                                   "not true (nodes not in the file may not join)",
                                   name));
  if (!valid_node_name(name))
    throw config_error("--node", fmt::format("--node {}: a node name is 1..32 of a-z A-Z 0-9 _ -", name));
  if (reserved_node_name(name))
    throw config_error("--node", fmt::format("--node {}: {}; pick another", name, reserved_because));
  if (auto p = endpoint_problem(endpoint); !p.empty())
    throw config_error("--endpoint", fmt::format("--endpoint {}: {}", endpoint, p));
  if (workers < 1 || workers > spec.open_workers)
    throw config_error("--workers", fmt::format("--workers {}: must be in [1, {}] ([cluster] open_workers)",
                                                workers, spec.open_workers));
  for (const auto& n : spec.nodes)
    if (n.endpoint == endpoint)
      throw config_error("--endpoint", fmt::format("--endpoint {}: node {} has it", endpoint, n.name));
  if (std::count(spec.coordinators.begin(), spec.coordinators.end(), endpoint) > 0)
    throw config_error("--endpoint",
                       fmt::format("--endpoint {}: this is the coordinator's endpoint", endpoint));
  cluster_node n;
  n.name = name;
  n.endpoint = endpoint;
  n.workers = workers;
  spec.nodes.push_back(std::move(n));
  return spec.nodes.size() - 1;
}

int64_t worker_offset(const cluster_spec& spec, size_t index) {
  int64_t off = 0;
  for (size_t i = 0; i < index; ++i) off += spec.nodes[i].workers;
  return off;
}

}  // namespace longwave::config
