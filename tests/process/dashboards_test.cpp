// The Grafana dashboards and the metric catalogue in dashboards/: the dashboard JSON is importable
// (variables, panel ids, datasources, grid positions), every query names catalogued metrics, the scrape
// config matches examples/cluster_4nodes.toml, and, against Debian's real Prometheus server scraping a real
// two-node cluster
// (`longwave launch --observe`), every dashboard query returns at least one series.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/cluster_config.hpp"
#include "tests/support/json.hpp"
#include "tests/support/process.hpp"

using namespace longwave;
using namespace longwave::test;
namespace fs = std::filesystem;

namespace {

std::string source_dir() {
  if (const char* d = std::getenv("LW_SOURCE_DIR"); d && *d) return d;
#ifdef LW_SOURCE_DIR
  return LW_SOURCE_DIR;
#else
  throw std::runtime_error("LW_SOURCE_DIR is not set (run the tests through ctest)");
#endif
}

std::string dashboards_dir() {
  return source_dir() + "/dashboards";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

std::string tail(const std::string& text, size_t n = 6000) {
  return text.substr(text.size() > n ? text.size() - n : 0);
}

// ---- the catalogue table in dashboards/README.md

struct catalogue_row {
  std::string name, type, role, meaning, worry;
  std::vector<std::string> labels;
};

const char* const catalogue_header = "| metric | type | labels | role | meaning | when to worry |";

/// Rows of the catalogue table (the one under catalogue_header). Throws naming the line if a row does not
/// have exactly six cells or its name is not in backticks.
std::vector<catalogue_row> read_catalogue(const std::string& readme_text) {
  std::vector<catalogue_row> rows;
  std::istringstream in(readme_text);
  std::string line;
  int state = 0;  // 0 before the header, 1 at the separator, 2 in the rows
  while (std::getline(in, line)) {
    line = trim(line);
    if (state == 0) {
      if (line == catalogue_header) state = 1;
      continue;
    }
    if (state == 1) {
      if (line.rfind("|---", 0) != 0)
        throw std::runtime_error("catalogue: no separator row after the header");
      state = 2;
      continue;
    }
    if (line.empty() || line[0] != '|') break;
    std::vector<std::string> cells;
    size_t pos = 1;
    while (pos < line.size()) {
      const size_t bar = line.find('|', pos);
      if (bar == std::string::npos) throw std::runtime_error("catalogue: row does not end with '|': " + line);
      cells.push_back(trim(line.substr(pos, bar - pos)));
      pos = bar + 1;
    }
    if (cells.size() != 6) throw std::runtime_error("catalogue: row without exactly 6 cells: " + line);
    const auto& n = cells[0];
    if (n.size() < 3 || n.front() != '`' || n.back() != '`')
      throw std::runtime_error("catalogue: metric name not in backticks: " + line);
    catalogue_row r;
    r.name = n.substr(1, n.size() - 2);
    r.type = cells[1];
    std::istringstream ls(cells[2]);
    for (std::string l; std::getline(ls, l, ',');) r.labels.push_back(trim(l));
    r.role = cells[3];
    r.meaning = cells[4];
    r.worry = cells[5];
    rows.push_back(std::move(r));
  }
  if (state != 2) throw std::runtime_error(std::string("catalogue: no table headed ") + catalogue_header);
  return rows;
}

std::map<std::string, catalogue_row> catalogue() {
  std::map<std::string, catalogue_row> by_name;
  for (auto& r : read_catalogue(read_text(dashboards_dir() + "/README.md"))) by_name[r.name] = r;
  return by_name;
}

/// Whether a series name belongs to a catalogued metric: the name itself, or a histogram's _bucket, _sum or
/// _count series.
bool catalogued(const std::map<std::string, catalogue_row>& cat, const std::string& series) {
  if (cat.count(series)) return true;
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string s = suffix;
    if (series.size() > s.size() && series.compare(series.size() - s.size(), s.size(), s) == 0) {
      auto it = cat.find(series.substr(0, series.size() - s.size()));
      if (it != cat.end() && it->second.type == "histogram") return true;
    }
  }
  return false;
}

// ---- PromQL

bool ident_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':';
}
bool ident_char(char c) {
  return ident_start(c) || std::isdigit(static_cast<unsigned char>(c));
}

/// Metric names an expression selects: every identifier that is not a function (followed by '('), an
/// aggregation or keyword, a label name ({...} matchers; by/without/on/ignoring/group_left/group_right
/// lists), a duration ([...], offset 5m), a number, a string or a dashboard variable ($x, ${x}).
std::set<std::string> promql_metric_names(const std::string& expr) {
  static const std::set<std::string> aggregations = {
      "sum",   "min",          "max",     "avg",  "group",    "stddev", "stdvar",
      "count", "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"};
  static const std::set<std::string> label_list_keywords = {"by",       "without",    "on",
                                                            "ignoring", "group_left", "group_right"};
  static const std::set<std::string> keywords = {"and",    "or",    "unless", "bool",
                                                 "offset", "atan2", "inf",    "nan"};
  std::set<std::string> out;
  const size_t n = expr.size();
  size_t i = 0;
  auto skip_string = [&] {
    const char q = expr[i++];
    while (i < n && expr[i] != q) i += expr[i] == '\\' && q != '`' ? 2 : 1;
    ++i;
  };
  auto skip_until = [&](char close) {  // from an opening bracket to after `close`, strings skipped
    ++i;
    while (i < n && expr[i] != close) {
      if (expr[i] == '"' || expr[i] == '\'' || expr[i] == '`') {
        skip_string();
      } else {
        ++i;
      }
    }
    ++i;
  };
  auto next_non_space = [&](size_t k) {
    while (k < n && std::isspace(static_cast<unsigned char>(expr[k]))) ++k;
    return k;
  };
  while (i < n) {
    const char c = expr[i];
    if (c == '"' || c == '\'' || c == '`') {
      skip_string();
    } else if (c == '{') {
      skip_until('}');
    } else if (c == '[') {
      skip_until(']');
    } else if (c == '#') {
      while (i < n && expr[i] != '\n') ++i;
    } else if (c == '$') {
      ++i;
      if (i < n && expr[i] == '{') {
        skip_until('}');
      } else {
        while (i < n && ident_char(expr[i])) ++i;
      }
    } else if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      while (i < n && (ident_char(expr[i]) || expr[i] == '.')) ++i;  // 0.99, 1e6, 0x1F, 5m
    } else if (ident_start(c)) {
      const size_t start = i;
      while (i < n && ident_char(expr[i])) ++i;
      const std::string word = expr.substr(start, i - start);
      std::string lower = word;
      for (auto& ch : lower) ch = char(std::tolower(static_cast<unsigned char>(ch)));
      const size_t next = next_non_space(i);
      if (label_list_keywords.count(lower)) {
        if (next < n && expr[next] == '(') {
          i = next;
          skip_until(')');
        }
      } else if (aggregations.count(lower) || keywords.count(lower)) {
        // not a metric
      } else if (next < n && expr[next] == '(') {
        // a function call
      } else {
        out.insert(word);
      }
    } else {
      ++i;
    }
  }
  return out;
}

/// Grafana's variables replaced by what "All" and a typical time range give: $node and $worker by their
/// allValue ".*", the interval variables by durations that hold several samples at a 1 s scrape interval.
std::string substitute_variables(const std::string& expr) {
  static const std::map<std::string, std::string> values = {
      {"node", ".*"},    {"worker", ".*"},    {"__rate_interval", "30s"}, {"__interval", "5s"},
      {"__range", "1m"}, {"__range_s", "60"}, {"__interval_ms", "5000"}};
  std::string out;
  size_t i = 0;
  while (i < expr.size()) {
    if (expr[i] != '$') {
      out += expr[i++];
      continue;
    }
    size_t j = i + 1;
    std::string name;
    if (j < expr.size() && expr[j] == '{') {
      const size_t close = expr.find('}', j);
      if (close == std::string::npos) break;
      name = expr.substr(j + 1, close - j - 1);
      j = close + 1;
    } else {
      while (j < expr.size() && ident_char(expr[j])) name += expr[j++];
    }
    auto it = values.find(name);
    if (it == values.end()) {
      out += expr.substr(i, j - i);  // unknown: left for Prometheus to reject, so the test names it
    } else {
      out += it->second;
    }
    i = j;
  }
  return out;
}

// ---- dashboards

struct dashboard {
  std::string file;  // file name only
  rapidjson::Document doc;
};

std::vector<dashboard> dashboards() {
  std::vector<dashboard> out;
  for (const auto& e : fs::directory_iterator(dashboards_dir()))
    if (e.path().extension() == ".json") out.push_back({e.path().filename().string(), rapidjson::Document()});
  std::sort(out.begin(), out.end(), [](const dashboard& a, const dashboard& b) { return a.file < b.file; });
  for (auto& d : out) {
    try {
      d.doc = parse_json(read_text(dashboards_dir() + "/" + d.file));
    } catch (const std::exception& e) {
      throw std::runtime_error(d.file + ": " + e.what());
    }
  }
  return out;
}

/// Every panel, the panels inside rows included.
void collect_panels(const json& panels, std::vector<const json*>& out) {
  if (!panels.IsArray()) return;
  for (const auto& p : panels.GetArray()) {
    out.push_back(&p);
    if (has(p, "panels")) collect_panels(at(p, "panels"), out);
  }
}

std::vector<const json*> all_panels(const json& doc) {
  std::vector<const json*> out;
  if (has(doc, "panels")) collect_panels(at(doc, "panels"), out);
  return out;
}

struct dashboard_query {
  std::string where;  // "file / panel title / refId"
  std::string expr;
};

std::vector<dashboard_query> queries_of(const dashboard& d) {
  std::vector<dashboard_query> out;
  for (const json* p : all_panels(d.doc)) {
    if (!has(*p, "targets")) continue;
    const std::string title = has(*p, "title") ? str(at(*p, "title")) : "?";
    for (const auto& t : at(*p, "targets").GetArray())
      if (has(t, "expr"))
        out.push_back({d.file + " / " + title + " / " + (has(t, "refId") ? str(at(t, "refId")) : "?"),
                       str(at(t, "expr"))});
  }
  return out;
}

const json* variable(const json& doc, const std::string& name) {
  if (!has(doc, "templating") || !has(at(doc, "templating"), "list")) return nullptr;
  for (const auto& v : at(at(doc, "templating"), "list").GetArray())
    if (has(v, "name") && str(at(v, "name")) == name) return &v;
  return nullptr;
}

/// A query variable's query text (Grafana 10 stores {query: ...}; older dashboards a plain string).
std::string variable_query(const json& v) {
  if (!has(v, "query")) return "";
  const json& q = at(v, "query");
  if (q.IsString()) return str(q);
  return has(q, "query") ? str(at(q, "query")) : "";
}

bool is_prometheus_datasource_ref(const json& ds) {
  return has(ds, "type") && str(at(ds, "type")) == "prometheus" && has(ds, "uid") &&
         str(at(ds, "uid")) == "${datasource}";
}

// ---- a real Prometheus server

/// GET /api/v1/<path> with query parameters; the parsed answer (error answers carry JSON too).
rapidjson::Document prom_api(int port, const std::string& path, const httplib::Params& params) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(5);
  cli.set_read_timeout(30);
  auto res = cli.Get("/api/v1/" + path, params, httplib::Headers{});
  if (!res) throw std::runtime_error("GET /api/v1/" + path + " failed: " + httplib::to_string(res.error()));
  try {
    return parse_json(res->body);
  } catch (const std::exception& e) {
    throw std::runtime_error("GET /api/v1/" + path + ": HTTP " + std::to_string(res->status) +
                             ", not JSON: " + res->body.substr(0, 200));
  }
}

/// The value of the first series an instant query returns, or nullopt (no series, or the server is not up).
std::optional<double> prom_scalar(int port, const std::string& expr) {
  try {
    const auto a = prom_api(port, "query", {{"query", expr}});
    if (!has(a, "status") || str(at(a, "status")) != "success") return std::nullopt;
    const json& result = at(at(a, "data"), "result");
    if (!result.IsArray() || result.Empty()) return std::nullopt;
    const json& value = at(result[0], "value");
    if (!value.IsArray() || value.Size() < 2) return std::nullopt;
    return std::strtod(str(value[1]).c_str(), nullptr);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

bool prom_ready(int port) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(1);
  cli.set_read_timeout(2);
  auto res = cli.Get("/-/ready");
  return res && res->status == 200;
}

/// Stops the launched cluster if a failed check left it running: SIGINT (launch forwards it to every role and
/// to Prometheus), then SIGKILL to its process group.
struct stop_on_exit {
  pid_t pid;
  bool reaped = false;
  ~stop_on_exit() {
    if (reaped || pid <= 0) return;
    kill(pid, SIGINT);
    for (int i = 0; i < 600; ++i) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) return;
      usleep(100 * 1000);
    }
    kill(-pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
};

}  // namespace

// ======================================================================== structure (fast)

CATCH_TEST_CASE("the PromQL scan finds metric names and skips functions, labels, durations and variables",
                "[process][dashboards]") {
  using names = std::set<std::string>;
  CATCH_CHECK(promql_metric_names(R"(longwave_val_loss{node=~"$node"})") == names{"longwave_val_loss"});
  CATCH_CHECK(
      promql_metric_names(
          R"(histogram_quantile(0.99, sum by (le, node) (rate(a_bucket{node=~"$node"}[$__rate_interval]))))") ==
      names{"a_bucket"});
  CATCH_CHECK(promql_metric_names("rate(x_total[5m]) * 8 / 1e6") == names{"x_total"});
  CATCH_CHECK(promql_metric_names("sum(a) by (worker) / on(node) group_left b offset 5m") == names{"a", "b"});
  CATCH_CHECK(promql_metric_names("time() - (ts_seconds > 0)") == names{"ts_seconds"});
  CATCH_CHECK(promql_metric_names(R"(count(up{job="x"} == 1) and bool ${var} unless c)") == names{"up", "c"});
  CATCH_CHECK(substitute_variables(R"(rate(m{node=~"$node", worker=~"${worker}"}[$__rate_interval]))") ==
              R"(rate(m{node=~".*", worker=~".*"}[30s]))");
  CATCH_CHECK(substitute_variables("increase(m[$__range]) $unknown") == "increase(m[1m]) $unknown");
}

CATCH_TEST_CASE("the JSON reader reads dashboard-like documents and rejects broken ones",
                "[process][dashboards]") {
  const auto j = parse_json(R"({"a": [1, -2.5e3, true, null, "x\"\u00e9\n"], "b": {}})");
  CATCH_REQUIRE(j.IsObject());
  const json& a = at(j, "a");
  CATCH_REQUIRE(a.Size() == 5);
  CATCH_CHECK(a[1].GetDouble() == -2500.0);
  CATCH_CHECK(a[2].GetBool());
  CATCH_CHECK(a[3].IsNull());
  CATCH_CHECK(str(a[4]) == "x\"\xc3\xa9\n");
  CATCH_CHECK(at(j, "b").IsObject());
  CATCH_CHECK_THROWS_WITH(at(j, "c"), "json: no member \"c\"");
  CATCH_CHECK_THROWS_WITH(parse_json("{\n  \"a\": 1,\n}"),
                          "json: Missing a name for object member at line 3, column 1");
  CATCH_CHECK_THROWS(parse_json(R"({"a": 1,})"));
  CATCH_CHECK_THROWS(parse_json(R"({"a": 1} x)"));
  CATCH_CHECK_THROWS(parse_json(R"({"a": 1, "a": 2})"));
  CATCH_CHECK_THROWS(parse_json(R"(["unterminated])"));
  CATCH_CHECK_THROWS(parse_json("[01]"));
}

CATCH_TEST_CASE("the metric catalogue in dashboards/README.md is one well-formed table",
                "[process][dashboards]") {
  const auto rows = read_catalogue(read_text(dashboards_dir() + "/README.md"));
  CATCH_CHECK(rows.size() >= 30);
  const std::set<std::string> bounded = {"node", "worker", "peer", "reason"};
  std::set<std::string> seen;
  for (const auto& r : rows) {
    CATCH_INFO("metric " << r.name);
    CATCH_CHECK(seen.insert(r.name).second);
    CATCH_CHECK(std::regex_match(r.name, std::regex("longwave_[a-z0-9_]+")));
    CATCH_CHECK((r.type == "counter" || r.type == "gauge" || r.type == "histogram"));
    // Counters end in _total and nothing else does (STYLE.md).
    const bool total = r.name.size() > 6 && r.name.compare(r.name.size() - 6, 6, "_total") == 0;
    CATCH_CHECK(total == (r.type == "counter"));
    CATCH_CHECK((r.role == "node" || r.role == "coordinator" || r.role == "both"));
    CATCH_REQUIRE(!r.labels.empty());
    CATCH_CHECK(r.labels.front() == "node");
    for (const auto& l : r.labels) {
      CATCH_INFO("label " << l);
      if (r.name == "longwave_build_info") {
        CATCH_CHECK(std::regex_match(l, std::regex("[a-z_]+")));
      } else {
        CATCH_CHECK(bounded.count(l) == 1);
      }
    }
    CATCH_CHECK(!r.meaning.empty());
    CATCH_CHECK(!r.worry.empty());
  }
}

CATCH_TEST_CASE("every dashboard parses and has the datasource, node and worker variables",
                "[process][dashboards]") {
  const auto boards = dashboards();
  CATCH_REQUIRE(boards.size() >= 4);
  std::set<std::string> uids;
  for (const auto& d : boards) {
    CATCH_INFO("dashboard " << d.file);
    const json& doc = d.doc;
    CATCH_REQUIRE(doc.IsObject());
    CATCH_CHECK(has(doc, "title"));
    CATCH_REQUIRE(has(doc, "uid"));
    CATCH_CHECK(uids.insert(str(at(doc, "uid"))).second);
    CATCH_REQUIRE(has(doc, "schemaVersion"));
    CATCH_CHECK(at(doc, "schemaVersion").GetDouble() >= 36);
    // An exported dashboard carries "id": null; a fixed id would clash on import.
    CATCH_CHECK((!has(doc, "id") || at(doc, "id").IsNull()));

    const json* ds = variable(doc, "datasource");
    CATCH_REQUIRE(ds != nullptr);
    CATCH_CHECK(str(at(*ds, "type")) == "datasource");
    CATCH_CHECK(str(at(*ds, "query")) == "prometheus");

    const json* node = variable(doc, "node");
    CATCH_REQUIRE(node != nullptr);
    CATCH_CHECK(str(at(*node, "type")) == "query");
    CATCH_CHECK(variable_query(*node) == "label_values(longwave_build_info, node)");
    CATCH_CHECK(is_prometheus_datasource_ref(at(*node, "datasource")));
    CATCH_CHECK(at(*node, "multi").GetBool());
    CATCH_CHECK(at(*node, "includeAll").GetBool());
    CATCH_CHECK(str(at(*node, "allValue")) == ".*");

    const json* worker = variable(doc, "worker");
    CATCH_REQUIRE(worker != nullptr);
    CATCH_CHECK(str(at(*worker, "type")) == "query");
    CATCH_CHECK(variable_query(*worker) ==
                R"(label_values(longwave_worker_train_loss{node=~"$node"}, worker))");
    CATCH_CHECK(is_prometheus_datasource_ref(at(*worker, "datasource")));
    CATCH_CHECK(at(*worker, "multi").GetBool());
    CATCH_CHECK(at(*worker, "includeAll").GetBool());
    CATCH_CHECK(str(at(*worker, "allValue")) == ".*");
  }
}

CATCH_TEST_CASE("every dashboard panel has a unique id, the datasource variable and a gridPos",
                "[process][dashboards]") {
  for (const auto& d : dashboards()) {
    const auto panels = all_panels(d.doc);
    CATCH_INFO("dashboard " << d.file);
    CATCH_REQUIRE(!panels.empty());
    std::set<double> ids;
    size_t n_queries = 0;
    for (const json* p : panels) {
      const std::string title = has(*p, "title") ? str(at(*p, "title")) : "(untitled)";
      CATCH_INFO("panel " << title);
      CATCH_REQUIRE(has(*p, "id"));
      CATCH_REQUIRE(at(*p, "id").IsNumber());
      CATCH_CHECK(ids.insert(at(*p, "id").GetDouble()).second);
      CATCH_REQUIRE(has(*p, "datasource"));
      CATCH_CHECK(is_prometheus_datasource_ref(at(*p, "datasource")));
      CATCH_REQUIRE(has(*p, "gridPos"));
      const json& g = at(*p, "gridPos");
      for (const char* k : {"h", "w", "x", "y"}) {
        CATCH_INFO("gridPos." << k);
        CATCH_REQUIRE(has(g, k));
        CATCH_CHECK(at(g, k).IsNumber());
      }
      CATCH_CHECK(at(g, "w").GetDouble() >= 1);
      CATCH_CHECK(at(g, "h").GetDouble() >= 1);
      CATCH_CHECK(at(g, "x").GetDouble() >= 0);
      CATCH_CHECK(at(g, "x").GetDouble() + at(g, "w").GetDouble() <= 24);
      if (str(at(*p, "type")) == "row") continue;
      CATCH_REQUIRE(has(*p, "targets"));
      CATCH_CHECK(!at(*p, "targets").Empty());
      std::set<std::string> refs;
      for (const auto& t : at(*p, "targets").GetArray()) {
        CATCH_CHECK(has(t, "expr"));
        CATCH_CHECK(refs.insert(str(at(t, "refId"))).second);
        if (has(t, "datasource")) CATCH_CHECK(is_prometheus_datasource_ref(at(t, "datasource")));
        ++n_queries;
      }
    }
    CATCH_CHECK(n_queries >= 4);
  }
}

CATCH_TEST_CASE(
    "every metric a dashboard query names is in the catalogue, and every catalogued metric is shown",
    "[process][dashboards]") {
  const auto cat = catalogue();
  CATCH_REQUIRE(!cat.empty());
  std::set<std::string> shown;
  std::vector<std::string> unknown;
  for (const auto& d : dashboards()) {
    for (const auto& q : queries_of(d)) {
      const auto names = promql_metric_names(q.expr);
      if (names.empty()) unknown.push_back(q.where + ": no metric at all in: " + q.expr);
      for (const auto& m : names) {
        if (catalogued(cat, m)) {
          shown.insert(m);
          for (const char* suffix :
               {"_bucket", "_sum", "_count"})  // a histogram's series shows the histogram
            if (m.size() > strlen(suffix) &&
                m.compare(m.size() - strlen(suffix), strlen(suffix), suffix) == 0)
              shown.insert(m.substr(0, m.size() - strlen(suffix)));
        } else {
          unknown.push_back(q.where + ": " + m + " is not in dashboards/README.md");
        }
      }
    }
    // The variables' label_values(...) queries name metrics too.
    for (const char* var : {"node", "worker"}) {
      const json* v = variable(d.doc, var);
      if (v == nullptr) continue;
      std::smatch m;
      const std::string q = variable_query(*v);
      if (std::regex_match(q, m,
                           std::regex(R"(label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)[^,]*,\s*\w+\s*\))"))) {
        if (!catalogued(cat, m[1].str())) unknown.push_back(d.file + " / $" + var + ": " + m[1].str());
      } else {
        unknown.push_back(d.file + " / $" + var + ": not a label_values(metric, label) query: " + q);
      }
    }
  }
  {
    std::string report;
    for (const auto& u : unknown) report += "  " + u + "\n";
    CATCH_INFO("queries naming metrics outside the catalogue:\n" << report);
    CATCH_CHECK(unknown.empty());
  }
  std::string missing;
  for (const auto& [name, row] : cat)
    if (!shown.count(name)) missing += "  " + name + "\n";
  CATCH_INFO("catalogued metrics no dashboard shows:\n" << missing);
  CATCH_CHECK(missing.empty());
}

CATCH_TEST_CASE("dashboards/prometheus.yml scrapes the coordinator and every node of cluster_4nodes.toml",
                "[process][dashboards]") {
  const auto text = read_text(dashboards_dir() + "/prometheus.yml");
  CATCH_REQUIRE(!text.empty());
  // (port, node label) pairs in file order: each "- targets: [...]" line followed by its "labels:" line.
  std::vector<std::pair<int, std::string>> targets;
  const std::regex target_re(R"re(targets:\s*\[\s*"127\.0\.0\.1:(\d+)"\s*\])re");
  const std::regex label_re(R"re(labels:\s*\{\s*node:\s*"?([A-Za-z0-9_-]+)"?\s*\})re");
  std::istringstream in(text);
  std::string line;
  int pending_port = -1;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, target_re)) pending_port = std::stoi(m[1].str());
    if (std::regex_search(line, m, label_re) && pending_port > 0) {
      targets.emplace_back(pending_port, m[1].str());
      pending_port = -1;
    }
  }
  CATCH_CHECK(contains(text, "honor_labels: true"));

  const auto spec = config::load_cluster_file(source_dir() + "/examples/cluster_4nodes.toml", {});
  std::vector<std::pair<int, std::string>> expected;
  expected.emplace_back(static_cast<int>(config::coordinator_metrics_port(spec)), "coordinator");
  for (size_t i = 0; i < spec.nodes.size(); ++i)
    expected.emplace_back(static_cast<int>(config::node_config(spec, i).metrics.port), spec.nodes[i].name);
  CATCH_CHECK(targets == expected);

  if (!fs::exists("/usr/bin/promtool")) {
    CATCH_FAIL("/usr/bin/promtool is missing (Debian's prometheus package; scripts/setup installs it)");
  } else {
    const auto dir = scratch_dir("promtool");
    const auto [code, out] = run(
        {"/usr/bin/promtool", "check", "config", dashboards_dir() + "/prometheus.yml"}, dir + "/out.log", 60);
    CATCH_INFO(out);
    CATCH_CHECK(code == 0);
    fs::remove_all(dir);
  }
}

// ======================================================================== real Prometheus (integration)

CATCH_TEST_CASE("every dashboard query returns data from a real Prometheus scraping a real cluster",
                "[process][dashboards][prometheus]") {
  const std::string prometheus = "/usr/bin/prometheus";
  if (!fs::exists(prometheus))
    CATCH_FAIL(prometheus << " is missing: install Debian's prometheus package (scripts/setup does: "
                             "apt-get install --no-install-recommends prometheus)");

  const auto dir = scratch_dir("dashboards");
  const int coord_port = free_port();
  const int coord_metrics = free_port();
  const int observe_port = free_port();
  std::vector<int> ring, metrics;
  std::string text =
      "[cluster]\nid = \"dashboards-test\"\ncoordinator = \"tcp://127.0.0.1:" + std::to_string(coord_port) +
      "\"\njoin_timeout_s = 60\n";
  for (int i = 0; i < 2; ++i) {
    ring.push_back(free_port());
    metrics.push_back(free_port());
    text += "\n[[nodes]]\nname = \"n" + std::to_string(i) +
            "\"\nendpoint = \"tcp://127.0.0.1:" + std::to_string(ring.back()) +
            "\"\nworkers = 1\nmetrics_port = " + std::to_string(metrics.back()) + "\n";
  }
  // The tiny model, one worker per node, with no end: the test stops the cluster (Ctrl-C) once every query
  // has run. Eval and a checkpoint every round fill every panel.
  text += "\n[run]\nout_dir = \"" + dir + "/run\"\nseed = 7\n" +
          "[model]\npreset = \"tiny\"\nseq_len = 64\n"
          "[train]\ninner_steps = 5\nrounds = 1000000\nbatch_size = 4\nwarmup_steps = 3\nthreads = 1\n"
          "[eval]\nevery_rounds = 1\nbatches = 2\n"
          "[checkpoint]\nevery_rounds = 1\n"
          "[metrics]\nport = " +
          std::to_string(coord_metrics) + "\n" + curve_keys(dir);
  const auto cluster = dir + "/cluster.toml";
  write_text(cluster, text);
  // Refused before any role starts: a role's metrics port, and a port another process holds (Prometheus
  // died after its banner named the port, and the cluster trained on unobserved).
  {
    const held_port held;
    for (const auto& [port, says] : std::vector<std::pair<int, std::string>>{
             {metrics[1], "--observe-port " + std::to_string(metrics[1]) + " is the metrics port of n1"},
             // A ring port binds after Prometheus: node n1 failed, "is node n1 already running here?"
             {ring[1], "--observe-port " + std::to_string(ring[1]) + " is node n1's ring port"},
             {held.port,
              "127.0.0.1:" + std::to_string(held.port) + " cannot be bound: Address already in use"}}) {
      auto [code, out] =
          run({binary(), "launch", cluster, "--observe", "--observe-port", std::to_string(port)},
              dir + "/refused.log", 60);
      CATCH_INFO(out);
      CATCH_CHECK(code == 2);
      CATCH_CHECK(out.find(says) != std::string::npos);
      CATCH_CHECK(out.find("[coordinator]") == std::string::npos);
    }
    // Its folder, taken by a file: named (it said "cannot write …/prometheus.yml").
    fs::create_directories(dir + "/run");
    write_text(dir + "/run/prometheus", "");
    CATCH_REQUIRE(fs::is_regular_file(dir + "/run/prometheus"));
    auto [code, out] =
        run({binary(), "launch", cluster, "--observe", "--observe-port", std::to_string(observe_port)},
            dir + "/refused.log", 60);
    CATCH_CHECK(code == 2);
    CATCH_CHECK(out.find(dir + "/run/prometheus: a file, not a directory") != std::string::npos);
    fs::remove(dir + "/run/prometheus");
  }

  auto launch = spawn({binary(), "launch", cluster, "--observe", "--observe-port",
                       std::to_string(observe_port), "--scrape-interval", "1s"},
                      dir + "/launch.log", /*own_group=*/true);
  CATCH_REQUIRE(launch.pid > 0);
  stop_on_exit guard{launch.pid};
  auto still_running = [&] {
    if (guard.reaped) return false;
    if (waitpid(launch.pid, nullptr, WNOHANG) != launch.pid) return true;
    guard.reaped = true;
    return false;
  };
  auto launch_log = [&] { return "launch log (tail):\n" + tail(read_text(dir + "/launch.log")); };

  // Prometheus answers, has scraped all three targets at least twice, and training has done two rounds (so
  // an all-reduce, an evaluation and a checkpoint happened on every node and were scraped).
  const int n_targets = 3;
  bool ready = wait_until([&] { return !still_running() || prom_ready(observe_port); }, 60);
  {
    CATCH_INFO("Prometheus did not answer on 127.0.0.1:" << observe_port << "\n" << launch_log());
    CATCH_REQUIRE(still_running());
    CATCH_REQUIRE(ready);
  }
  ready = wait_until(
      [&] {
        if (!still_running()) return true;
        const auto up = prom_scalar(observe_port, "count(up == 1)");
        const auto scrapes = prom_scalar(observe_port, "min(count_over_time(up[1m]))");
        const auto round = prom_scalar(observe_port, "min(longwave_outer_round)");
        return up && *up == n_targets && scrapes && *scrapes >= 2 && round && *round >= 2;
      },
      90);
  {
    CATCH_INFO("no two scrapes of every target and two rounds within 90 s: up "
               << prom_scalar(observe_port, "count(up == 1)").value_or(-1) << " of " << n_targets
               << " targets, min(longwave_outer_round) "
               << prom_scalar(observe_port, "min(longwave_outer_round)").value_or(-1) << "\n"
               << launch_log());
    CATCH_REQUIRE(still_running());
    CATCH_REQUIRE(ready);
  }
  // One more scrape after the condition, so what it saw is in every series.
  const auto scrapes_before = prom_scalar(observe_port, "min(count_over_time(up[1m]))").value_or(0);
  wait_until(
      [&] { return prom_scalar(observe_port, "min(count_over_time(up[1m]))").value_or(0) > scrapes_before; },
      10);

  CATCH_CHECK(contains(read_text(dir + "/launch.log"),
                       "observe: Prometheus at http://127.0.0.1:" + std::to_string(observe_port)));
  CATCH_CHECK(fs::exists(dir + "/run/prometheus/prometheus.yml"));
  CATCH_CHECK(fs::is_directory(dir + "/run/prometheus/data"));

  // The variables list every process and the worker.
  {
    const auto nodes = prom_api(observe_port, "label/node/values", {{"match[]", "longwave_build_info"}});
    std::set<std::string> got;
    for (const auto& v : at(nodes, "data").GetArray()) got.insert(str(v));
    CATCH_CHECK(got == std::set<std::string>{"coordinator", "n0", "n1"});
    const auto workers = prom_api(observe_port, "label/worker/values",
                                  {{"match[]", R"(longwave_worker_train_loss{node=~".*"})"}});
    got.clear();
    for (const auto& v : at(workers, "data").GetArray()) got.insert(str(v));
    CATCH_CHECK(got == std::set<std::string>{"0"});
  }

  // Every query of every panel, variables substituted, returns at least one series.
  size_t n_queries = 0;
  std::vector<std::string> failures;
  for (const auto& d : dashboards()) {
    for (const auto& q : queries_of(d)) {
      ++n_queries;
      const std::string expr = substitute_variables(q.expr);
      std::string problem;
      try {
        const auto a = prom_api(observe_port, "query", {{"query", expr}});
        if (str(at(a, "status")) != "success") {
          problem = "status " + str(at(a, "status")) + (has(a, "error") ? ": " + str(at(a, "error")) : "");
        } else if (at(at(a, "data"), "result").Empty()) {
          problem = "no series";
        }
      } catch (const std::exception& e) {
        problem = e.what();
      }
      if (!problem.empty()) failures.push_back(q.where + ": " + problem + "\n      " + expr);
    }
  }
  std::string report;
  for (const auto& f : failures) report += "  " + f + "\n";
  CATCH_INFO(failures.size() << " of " << n_queries << " dashboard queries failed:\n" << report);
  CATCH_CHECK(n_queries >= 40);
  CATCH_CHECK(failures.empty());

  // Ctrl-C stops the cluster and Prometheus with it: nothing listens on the metrics or observe ports.
  CATCH_REQUIRE(still_running());
  kill(launch.pid, SIGINT);
  const int code = wait_exit(launch, 90);
  guard.reaped = true;
  if (code == -1) kill(-launch.pid, SIGKILL);  // the roles and Prometheus, if launch left them behind
  CATCH_INFO(launch_log());
  CATCH_CHECK(code == 130);
  CATCH_CHECK(wait_until([&] { return port_free(observe_port); }, 60));
  CATCH_CHECK(port_free(coord_metrics));
  for (int p : metrics) CATCH_CHECK(port_free(p));
  if (failures.empty() && code == 130) fs::remove_all(dir);
}
