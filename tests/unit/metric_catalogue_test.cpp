// The metric catalogue: dashboards/README.md and runtime/metrics/metric_catalogue.cpp list the same metrics,
// and a registry of each role exposes exactly its part of the catalogue, every series labelled with the node.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "comm/frame.hpp"
#include "runtime/metrics/metric_catalogue.hpp"
#include "runtime/metrics/metrics_registry.hpp"
#include "runtime/metrics/metrics_server.hpp"
#include "tests/support/prom_text.hpp"

using namespace longwave;
using namespace longwave::runtime;

namespace {

struct doc_row {
  std::string type, labels, role, meaning, worry;
};

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

/// The catalogue table of dashboards/README.md: rows "| `name` | type | labels | role | meaning | worry |".
std::map<std::string, doc_row> read_catalogue_doc() {
  std::ifstream in(std::string(LW_SOURCE_DIR) + "/dashboards/README.md");
  CATCH_REQUIRE(in.good());
  std::map<std::string, doc_row> rows;
  std::string line;
  const std::regex row(R"(^\|\s*`(longwave_[a-z0-9_]+)`\s*\|(.*)\|\s*$)");
  std::smatch m;
  while (std::getline(in, line)) {
    if (!std::regex_match(line, m, row)) continue;
    std::vector<std::string> cells;
    std::stringstream rest(m[2].str());
    std::string cell;
    while (std::getline(rest, cell, '|')) cells.push_back(trim(cell));
    CATCH_INFO("row: " << line);
    CATCH_REQUIRE(cells.size() == 5);
    CATCH_CHECK(rows.count(m[1].str()) == 0);  // listed once
    rows[m[1].str()] = {cells[0], cells[1], cells[2], cells[3], cells[4]};
  }
  return rows;
}

std::string doc_labels(const metric_def& d) {
  return std::string(d.labels).empty() ? "node" : std::string("node, ") + d.labels;
}

/// # TYPE lines of a scrape: name -> type.
std::map<std::string, std::string> scraped_types(const std::string& text) {
  std::map<std::string, std::string> out;
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) != 0) continue;
    std::stringstream w(line.substr(7));
    std::string name, type;
    w >> name >> type;
    out[name] = type;
  }
  return out;
}

}  // namespace

CATCH_TEST_CASE(
    "dashboards/README.md lists exactly the metrics the code registers, with their types and labels",
    "[metrics]") {
  const auto doc = read_catalogue_doc();
  std::set<std::string> code;
  for (const auto& d : metric_catalogue()) {
    code.insert(d.name);
    CATCH_INFO("metric " << d.name);
    const auto it = doc.find(d.name);
    CATCH_CHECK(it != doc.end());  // registered by code but missing from the catalogue
    if (it == doc.end()) continue;
    CATCH_CHECK(it->second.type == to_string(d.type));
    CATCH_CHECK(it->second.labels == doc_labels(d));
    CATCH_CHECK(it->second.role == to_string(d.role));
    CATCH_CHECK(!it->second.meaning.empty());
    CATCH_CHECK(!it->second.worry.empty());
  }
  for (const auto& [name, row] : doc) {
    CATCH_INFO("catalogue row " << name);
    CATCH_CHECK(code.count(name) == 1);  // documented but never registered
  }
}

namespace {

// Why a metric's name breaks the naming rules, or "" if it keeps them: longwave_<subsystem>_<what>[_<unit>]
// in snake case, base units only, and _total exactly on counters.
std::string naming_problem(const std::string& name, metric_type type) {
  // The dashboards group panels by these; a new subsystem is a deliberate change here and in
  // dashboards/README.md.
  static const std::set<std::string> subsystems = {
      "allreduce", "build",  "checkpoint", "checkpoints", "cluster", "codec", "comm",
      "compute",   "errors", "inner",      "outer",       "train",   "val",   "worker"};
  // Prometheus wants base units: seconds and bytes, ratios as 0..1, never scaled units or percentages.
  static const std::set<std::string> scaled = {
      "ms", "us", "ns",  "msec", "millis", "milliseconds", "minutes", "hours", "kb",
      "mb", "gb", "kib", "mib",  "gib",    "percent",      "pct",     "mbps",  "gbps"};
  static const std::regex snake("longwave_[a-z]+(_[a-z0-9]+)+");
  if (!std::regex_match(name, snake)) return "not longwave_ followed by snake_case words";
  std::vector<std::string> words;
  for (size_t at = 0; at <= name.size();) {
    const size_t end = std::min(name.find('_', at), name.size());
    words.push_back(name.substr(at, end - at));
    at = end + 1;
  }
  if (subsystems.count(words[1]) == 0) return "unknown subsystem " + words[1];
  for (const auto& w : words)
    if (scaled.count(w) == 1) return "scaled unit " + w + " (use seconds, bytes or a 0..1 ratio)";
  const bool total = words.back() == "total";
  if (total && type != metric_type::counter) return "_total on a metric that is not a counter";
  if (!total && type == metric_type::counter) return "a counter without _total";
  return "";
}

}  // namespace

CATCH_TEST_CASE("Metric names are longwave_<subsystem>_<what> in base units, and counters end in _total",
                "[metrics]") {
  const std::set<std::string> bounded = {"worker", "peer", "reason", "version, git_hash, torch_version"};
  for (const auto& d : metric_catalogue()) {
    CATCH_INFO("metric " << d.name);
    CATCH_CHECK(naming_problem(d.name, d.type).empty());
    if (!std::string(d.labels).empty()) CATCH_CHECK(bounded.count(d.labels) == 1);
  }
  // The rules reject what they are meant to.
  CATCH_CHECK(naming_problem("longwave_worker_step_ms", metric_type::gauge) ==
              "scaled unit ms (use seconds, "
              "bytes or a 0..1 ratio)");
  CATCH_CHECK(naming_problem("longwave_gpu_memory_bytes", metric_type::gauge) == "unknown subsystem gpu");
  CATCH_CHECK(naming_problem("longwave_worker_steps", metric_type::counter) == "a counter without _total");
  CATCH_CHECK(naming_problem("longwave_train_loss_total", metric_type::gauge) ==
              "_total on a metric that is not a counter");
  CATCH_CHECK(naming_problem("longwave_Worker_loss", metric_type::gauge) ==
              "not longwave_ followed by snake_case words");
  CATCH_CHECK(naming_problem("lw_worker_loss", metric_type::gauge) ==
              "not longwave_ followed by snake_case words");
  CATCH_CHECK(naming_problem("longwave_worker_train_loss", metric_type::gauge).empty());
}

CATCH_TEST_CASE("The catalogue's rejection reasons are the wire's reject_reason names", "[metrics]") {
  std::vector<std::string> wire;
  for (int r = 0; r <= static_cast<int>(comm::last_reject_reason); ++r)
    wire.push_back(comm::to_string(static_cast<comm::reject_reason>(r)));
  CATCH_CHECK(wire == rejection_reasons());
}

CATCH_TEST_CASE("A node's /metrics exposes its part of the catalogue, every series labelled with the node",
                "[metrics]") {
  metrics_registry reg(metric_role::node, "a", {"0", "1"}, {"b", "c"});
  metrics_server server(reg.registry(), 0);
  reg.set("longwave_worker_train_loss", {{"worker", "1"}}, 2.5);
  reg.add("longwave_worker_inner_steps_total", {{"worker", "0"}}, 3);
  reg.observe("longwave_allreduce_seconds", {}, 0.2);
  reg.observe("longwave_allreduce_seconds", {}, 7);
  // Dropped: unknown name, wrong type, a label the metric does not take, a coordinator-only metric.
  reg.set("longwave_no_such_metric", {}, 1);
  reg.set("longwave_worker_inner_steps_total", {{"worker", "0"}}, 99);
  reg.set("longwave_train_loss", {{"worker", "0"}}, 1);
  reg.set("longwave_cluster_heartbeat_age_seconds", {{"peer", "b"}}, 1);
  reg.add("longwave_worker_inner_steps_total", {{"worker", "0"}}, -5);

  const auto text = test::http_get(server.port(), "/metrics");
  const auto types = scraped_types(text);
  for (const auto& d : metric_catalogue()) {
    CATCH_INFO("metric " << d.name);
    CATCH_CHECK(types.count(d.name) == (registered_by(d, metric_role::node) ? 1u : 0u));
    if (types.count(d.name)) CATCH_CHECK(types.at(d.name) == to_string(d.type));
  }
  CATCH_CHECK(types.size() == static_cast<size_t>(std::count_if(
                                  metric_catalogue().begin(), metric_catalogue().end(),
                                  [](const metric_def& d) { return registered_by(d, metric_role::node); })));

  const auto samples = test::parse_prom_text(text);
  for (const auto& s : samples) {
    CATCH_INFO("sample " << s.name);
    CATCH_CHECK(s.labels.count("node") == 1);
    if (s.labels.count("node")) CATCH_CHECK(s.labels.at("node") == "a");
  }
  using L = std::map<std::string, std::string>;
  CATCH_CHECK(test::prom_value(samples, "longwave_worker_train_loss", L{{"node", "a"}, {"worker", "1"}}) ==
              2.5);
  CATCH_CHECK(test::prom_value(samples, "longwave_worker_inner_steps_total",
                               L{{"node", "a"}, {"worker", "0"}}) == 3.0);
  // Before the first evaluation the validation gauges say NaN, not a loss of 0.
  for (const char* name : {"longwave_val_loss", "longwave_val_perplexity"}) {
    const auto v = test::prom_value(samples, name, L{{"node", "a"}});
    CATCH_CHECK((v && std::isnan(*v)));
  }
  // Pre-created at zero: every worker, peer and reason series exists before anything happened.
  CATCH_CHECK(test::prom_value(samples, "longwave_worker_stall_seconds_total",
                               L{{"node", "a"}, {"worker", "1"}}) == 0.0);
  CATCH_CHECK(test::prom_value(samples, "longwave_comm_bytes_sent_total", L{{"node", "a"}, {"peer", "c"}}) ==
              0.0);
  CATCH_CHECK(test::prom_value(samples, "longwave_comm_rejected_frames_total",
                               L{{"node", "a"}, {"reason", "bad_checksum"}}) == 0.0);
  CATCH_CHECK(test::prom_value(samples, "longwave_errors_total", L{{"node", "a"}, {"reason", "allreduce"}}) ==
              0.0);
  CATCH_CHECK(test::prom_value(samples, "longwave_allreduce_seconds_count", L{{"node", "a"}}) == 2.0);
  CATCH_CHECK(test::prom_value(samples, "longwave_allreduce_seconds_bucket",
                               L{{"node", "a"}, {"le", "0.25"}}) == 1.0);
  CATCH_CHECK(
      test::prom_value(samples, "longwave_allreduce_seconds_bucket", L{{"node", "a"}, {"le", "10"}}) == 2.0);
  // build_info carries the build facts.
  bool build_info = false;
  for (const auto& s : samples)
    if (s.name == "longwave_build_info") {
      build_info = true;
      CATCH_CHECK(s.value == 1.0);
      CATCH_CHECK(s.labels.count("version") == 1);
      CATCH_CHECK(s.labels.count("git_hash") == 1);
      CATCH_CHECK(s.labels.count("torch_version") == 1);
    }
  CATCH_CHECK(build_info);
}

CATCH_TEST_CASE("The coordinator's /metrics exposes membership and errors, not training metrics",
                "[metrics]") {
  metrics_registry reg(metric_role::coordinator, "coordinator", {}, {"a", "b"});
  reg.set("longwave_cluster_heartbeat_age_seconds", {{"peer", "b"}}, 1.5);
  reg.set("longwave_worker_train_loss", {{"worker", "0"}}, 1);  // a node metric: dropped
  metrics_server server(reg.registry(), 0);
  const auto text = test::http_get(server.port(), "/metrics");
  const auto types = scraped_types(text);
  CATCH_CHECK(types.count("longwave_cluster_heartbeat_age_seconds") == 1);
  CATCH_CHECK(types.count("longwave_cluster_peers_alive") == 1);
  CATCH_CHECK(types.count("longwave_errors_total") == 1);
  CATCH_CHECK(types.count("longwave_worker_train_loss") == 0);
  const auto samples = test::parse_prom_text(text);
  using L = std::map<std::string, std::string>;
  CATCH_CHECK(test::prom_value(samples, "longwave_cluster_heartbeat_age_seconds",
                               L{{"node", "coordinator"}, {"peer", "b"}}) == 1.5);
}

CATCH_TEST_CASE("The label argument of metrics messages parses into label sets", "[metrics]") {
  CATCH_CHECK(parse_label_arg("").empty());
  CATCH_CHECK(parse_label_arg("3") == metric_labels{{"worker", "3"}});
  CATCH_CHECK(parse_label_arg("peer=b") == metric_labels{{"peer", "b"}});
  CATCH_CHECK(parse_label_arg("peer=b,worker=2") == metric_labels{{"peer", "b"}, {"worker", "2"}});
}
