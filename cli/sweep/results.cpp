// A sweep point's numbers from its run's files, its point.json, and the sweep's results.csv / results.jsonl.
#include "cli/sweep/results.hpp"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string_view>

#include "cli/report/records.hpp"
#include "cli/report/summary.hpp"
#include "config/cluster_config.hpp"
#include "config/config_loader.hpp"
#include "runtime/json/json_reader.hpp"

namespace longwave::cli::sweep {

namespace {

namespace fs = std::filesystem;
using json_writer = rapidjson::Writer<rapidjson::StringBuffer>;

std::string slurp(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return "";  // a FIFO would block the sweep (a probe)
  std::ifstream in(p, std::ios::binary);
  return in ? std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()) : "";
}

/// A run's result.json (its final figures) into doc; false when it is missing or not a JSON object.
bool read_result(const std::string& run_dir, rapidjson::Document& doc) {
  const std::string result = slurp(fs::path(run_dir) / "result.json");
  return !result.empty() && !runtime::parse_json(result, doc) && doc.IsObject();
}

/// A number member of a JSON object, NaN when missing or null.
double json_number(const rapidjson::Value& o, std::string_view key) {
  const auto* v = runtime::find_member(o, key);
  return v && v->IsNumber() ? v->GetDouble() : std::numeric_limits<double>::quiet_NaN();
}

/// A number: an integer when it is one (exit codes, seeds, tokens), null when not finite.
void put(json_writer& w, std::string_view key, double v) {
  w.Key(key.data(), static_cast<rapidjson::SizeType>(key.size()));
  if (!std::isfinite(v))
    w.Null();
  else if (v == std::floor(v) && std::abs(v) < 9e15)
    w.Int64(static_cast<int64_t>(v));
  else
    w.Double(v);
}

void put(json_writer& w, std::string_view key, std::string_view v) {
  w.Key(key.data(), static_cast<rapidjson::SizeType>(key.size()));
  w.String(v.data(), static_cast<rapidjson::SizeType>(v.size()));
}

/// A swept value: a JSON number when it reads as one, else a string.
void put_value(json_writer& w, std::string_view key, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (!text.empty() && *end == '\0' && std::isfinite(v))
    put(w, key, v);
  else
    put(w, key, std::string_view(text));
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (const char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string csv_number(double v) {
  return std::isfinite(v) ? fmt::format("{:.10g}", v) : "";
}

/// The sweep's key for a point: every override but the ones the sweep adds for the run's own sake.
std::vector<std::string> identity(const sweep_point& p) {
  std::vector<std::string> out;
  for (const auto& o : p.overrides)
    if (o.rfind("metrics.port=", 0) != 0) out.push_back(o);
  return out;
}

}  // namespace

std::string read_run(const std::string& run_dir, point_result& r) {
  report::node_metrics m;
  const fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  std::error_code ec;
  std::string why;
  if (!fs::exists(metrics, ec))
    why = metrics.string() + " is missing";
  else
    why = report::read_metrics_file(metrics, m);
  if (!why.empty()) {
    // The final figures of result.json, which the run writes beside it, without the curves.
    rapidjson::Document doc;
    if (!read_result(run_dir, doc)) return why;
    r.val_loss = json_number(doc, "val_loss");
    r.val_ppl = json_number(doc, "val_ppl");
    r.tokens = json_number(doc, "tokens");
    r.steps = json_number(doc, "inner_steps_per_worker");
    r.wall_s = json_number(doc, "train_seconds");
    return why + ": its final figures are result.json's, without curves";
  }
  const auto sum = report::summarize(m);
  r.val_loss = sum.final_val_loss;
  r.val_ppl = sum.final_val_ppl;
  r.utilization = sum.utilization;
  r.wall_s = sum.active_s;
  r.steps = sum.last_step;
  r.bytes_sent = m.bytes_sent;
  double per_step = std::numeric_limits<double>::quiet_NaN();
  if (!m.starts.empty()) {
    const auto& st = m.starts.front();
    r.params = report::num(st, "params");
    // Client sampling: only clients_per_round of the workers train each round.
    const double clients = report::num(st, "clients_per_round");
    const double training = std::isfinite(clients) && clients > 0 ? clients : report::num(st, "workers");
    per_step = training * report::num(st, "batch_size") * report::num(st, "seq_len");
  }
  // Steps are counted across sessions, so this holds after a resume too; without a start record,
  // result.json's ratio.
  if (!std::isfinite(per_step)) {
    rapidjson::Document doc;
    if (read_result(run_dir, doc))
      per_step = json_number(doc, "tokens") / json_number(doc, "inner_steps_per_worker");
  }
  r.tokens = r.steps * per_step;
  for (const auto& e : m.evals)
    r.val_curve.emplace_back(report::num(e, "step") * per_step, report::num(e, "val_loss"));
  for (const auto& st : m.steps) r.train_curve.emplace_back(st.step * per_step, st.loss);
  return "";
}

namespace {
std::string hash_of(const std::string& text) {
  return fmt::format("{:016x}", config::cluster_id_of(text));  // FNV-1a
}
}  // namespace

std::string config_fingerprint(const sweep_point& p) {
  return hash_of(training_identity(p.cfg, p.settings));
}

std::vector<std::string> config_fingerprints(const sweep_point& p) {
  // Earlier records hashed the whole config, the point's directories as written included, then the config
  // but for its names and directories (named_identity).
  return {config_fingerprint(p), hash_of(named_identity(p.cfg)), hash_of(config::to_toml(p.cfg))};
}

void write_point_record(const sweep_point& p, const point_result& r) {
  rapidjson::StringBuffer buf;
  json_writer w(buf);
  w.StartObject();
  put(w, "id", std::string_view(p.id));
  put(w, "status", std::string_view(r.status));
  put(w, "config", std::string_view(config_fingerprint(p)));
  put(w, "exit_code", static_cast<double>(r.exit_code));
  w.Key("overrides");
  w.StartArray();
  for (const auto& o : identity(p)) w.String(o.c_str(), static_cast<rapidjson::SizeType>(o.size()));
  w.EndArray();
  w.EndObject();
  (void)write_atomically((fs::path(p.out_dir) / "point.json").string(), std::string(buf.GetString()) + "\n");
}

namespace {

/// A folder's point.json: its status ("" when there is no readable record), config hash and exit code.
struct point_record {
  std::string status, config;
  double exit_code = std::numeric_limits<double>::quiet_NaN();
};

point_record read_record(const fs::path& folder) {
  point_record out;
  const std::string text = slurp(folder / "point.json");
  rapidjson::Document doc;
  if (text.empty() || runtime::parse_json(text, doc) || !doc.IsObject()) return out;
  const auto* status = runtime::find_member(doc, "status");
  if (!status || !status->IsString()) return out;
  out.status.assign(status->GetString(), status->GetStringLength());
  if (const auto* fp = runtime::find_member(doc, "config"); fp && fp->IsString())
    out.config = fp->GetString();
  out.exit_code = json_number(doc, "exit_code");
  return out;
}

}  // namespace

point_result recorded(const sweep_point& p) {
  point_result r;
  r.log = (fs::path(p.out_dir) / "log.txt").string();
  const auto rec = read_record(p.out_dir);
  if (rec.status.empty()) return r;
  // The resolved config is the point's identity: settings written otherwise (1e-3 for 0.001, a [sweep] set
  // of a value the base holds) make the same run; "overrides" stays in point.json for a person to read.
  const auto known = config_fingerprints(p);
  if (std::find(known.begin(), known.end(), rec.config) == known.end()) {
    r.status = "stale";  // run with other settings (or another base config) in this folder
    return r;
  }
  r.status = rec.status;
  r.exit_code = std::isfinite(rec.exit_code) ? static_cast<int>(rec.exit_code) : -1;
  return r;
}

std::vector<std::string> write_results(const sweep_spec& s, const std::vector<point_result>& results) {
  std::string csv = "id";
  for (const auto& k : s.keys) csv += "," + csv_field(k);
  csv += ",seed,status,exit_code,val_loss,val_ppl,tokens,wall_s,bytes_sent,utilization,params,steps,log\n";
  std::string jsonl;
  for (size_t i = 0; i < s.points.size() && i < results.size(); ++i) {
    const auto& p = s.points[i];
    const auto& r = results[i];
    // No exit code known (not run, or its record has none: a sweep killed while it ran): left empty, not -1.
    const double code =
        r.status == "pending" || r.status == "in use" || r.status == "stale" || r.exit_code < 0
            ? std::numeric_limits<double>::quiet_NaN()
            : r.exit_code;
    csv += csv_field(p.id);
    for (const auto& k : s.keys) csv += "," + csv_field(p.value_of(k));
    csv += fmt::format(",{},{},{}", p.seed, r.status, csv_number(code));
    for (const double v :
         {r.val_loss, r.val_ppl, r.tokens, r.wall_s, r.bytes_sent, r.utilization, r.params, r.steps})
      csv += "," + csv_number(v);
    csv += "," + csv_field(r.log) + "\n";

    rapidjson::StringBuffer buf;
    json_writer w(buf);
    w.StartObject();
    put(w, "id", std::string_view(p.id));
    for (const auto& k : s.keys) put_value(w, k, p.value_of(k));
    put(w, "seed", static_cast<double>(p.seed));
    put(w, "status", std::string_view(r.status));
    put(w, "exit_code", code);
    put(w, "val_loss", r.val_loss);
    put(w, "val_ppl", r.val_ppl);
    put(w, "tokens", r.tokens);
    put(w, "wall_s", r.wall_s);
    put(w, "bytes_sent", r.bytes_sent);
    put(w, "utilization", r.utilization);
    put(w, "params", r.params);
    put(w, "steps", r.steps);
    put(w, "log", std::string_view(r.log));
    w.EndObject();
    jsonl += std::string(buf.GetString()) + "\n";
  }
  const fs::path dir(s.out_dir);
  std::vector<std::string> failed;  // each file is written whatever became of the other
  for (const auto& [name, text] : {std::pair{"results.csv", &csv}, std::pair{"results.jsonl", &jsonl}})
    if (auto e = write_atomically((dir / name).string(), *text); !e.empty()) failed.push_back(std::move(e));
  return failed;
}

std::string set_aside(const sweep_spec& s, const sweep_point& p, const std::string& under) {
  const fs::path folder = fs::path(s.out_dir) / under;
  std::error_code ec;
  fs::create_directories(folder, ec);
  fs::path to = folder / p.id;
  for (int k = 2; !ec && fs::exists(to, ec); ++k) to = folder / (p.id + "." + std::to_string(k));
  if (!ec) fs::rename(p.out_dir, to, ec);
  return ec ? "" : to.string();
}

std::map<std::string, std::string> unclaimed_runs(const sweep_spec& s) {
  std::set<std::string> claimed;
  for (const auto& p : s.points) claimed.insert(p.id);
  std::map<std::string, std::pair<std::string, bool>> found;  // hash -> (folder, done)
  for (const std::string sub : {"points", "superseded"}) {
    std::error_code ec;
    for (fs::directory_iterator it(fs::path(s.out_dir) / sub, ec), end; !ec && it != end; it.increment(ec)) {
      if (!it->is_directory(ec) || (sub == "points" && claimed.count(it->path().filename().string())))
        continue;
      const auto rec = read_record(it->path());
      if (rec.status.empty() || rec.config.empty()) continue;
      const bool done = rec.status == "done";
      auto [at, fresh] = found.emplace(rec.config, std::pair{it->path().string(), done});
      if (!fresh && done && !at->second.second) at->second = {it->path().string(), done};
    }
  }
  std::map<std::string, std::string> out;
  for (auto& [hash, where] : found) out.emplace(hash, std::move(where.first));
  return out;
}

}  // namespace longwave::cli::sweep
