// The metric catalogue: dashboards/README.md and runtime/metric_catalogue.cpp list the same metrics, and a
// registry of each role exposes exactly its part of the catalogue, every series labelled with the node.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "comm/frame.hpp"
#include "runtime/metric_catalogue.hpp"
#include "runtime/metrics_registry.hpp"
#include "runtime/metrics_server.hpp"
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

CATCH_TEST_CASE("Metric names follow longwave_<subsystem>_<what>_<unit> and counters end in _total",
                "[metrics]") {
  const std::set<std::string> bounded = {"worker", "peer", "reason", "version, git_hash, torch_version"};
  for (const auto& d : metric_catalogue()) {
    CATCH_INFO("metric " << d.name);
    const std::string name = d.name;
    CATCH_CHECK(name.rfind("longwave_", 0) == 0);
    const bool total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
    CATCH_CHECK(total == (d.type == metric_type::counter));
    if (!std::string(d.labels).empty()) CATCH_CHECK(bounded.count(d.labels) == 1);
  }
}

CATCH_TEST_CASE("The catalogue's rejection reasons are the wire's reject_reason names", "[metrics]") {
  std::vector<std::string> wire;
  for (int r = 0; r <= static_cast<int>(comm::reject_reason::bad_payload); ++r)
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
