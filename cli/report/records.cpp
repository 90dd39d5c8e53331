// Reads metrics.jsonl lines into records and keeps one node's records by kind.
#include "cli/report/records.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "runtime/json/json_reader.hpp"

namespace longwave::cli::report {

namespace fs = std::filesystem;

namespace {

/// The table of record keys: a few dozen names, each stored once. Guarded, as a sweep may read runs from more
/// than one thread.
struct key_table {
  std::mutex mu;
  std::unordered_map<std::string, uint32_t> ids;

  std::optional<uint32_t> find(std::string_view key) {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = ids.find(std::string(key));
    return it == ids.end() ? std::nullopt : std::optional<uint32_t>(it->second);
  }
  uint32_t add(std::string_view key) {
    std::lock_guard<std::mutex> lock(mu);
    return ids.emplace(std::string(key), static_cast<uint32_t>(ids.size())).first->second;
  }
};

key_table& keys() {
  static key_table table;
  return table;
}

}  // namespace

const record::field* record::find(std::string_view key) const {
  const auto id = keys().find(key);
  if (!id) return nullptr;
  for (const auto& f : fields)
    if (f.key == *id) return &f;
  return nullptr;
}

void record::set(std::string_view key, double value) {
  const uint32_t id = keys().add(key);
  for (auto& f : fields)
    if (f.key == id) {
      f = field{id, no_text, value};
      return;
    }
  fields.push_back(field{id, no_text, value});
}

void record::set(std::string_view key, std::string value) {
  const uint32_t id = keys().add(key);
  texts.push_back(std::move(value));
  const auto at = static_cast<uint32_t>(texts.size() - 1);
  for (auto& f : fields)
    if (f.key == id) {
      f = field{id, at, std::numeric_limits<double>::quiet_NaN()};
      return;
    }
  fields.push_back(field{id, at, std::numeric_limits<double>::quiet_NaN()});
}

double num(const record& o, std::string_view key) {
  const auto* f = o.find(key);
  return f && f->text == record::no_text ? f->num : std::numeric_limits<double>::quiet_NaN();
}

std::string text(const record& o, std::string_view key) {
  const auto* f = o.find(key);
  return f && f->text != record::no_text ? o.texts[f->text] : std::string();
}

namespace {

record to_record(const rapidjson::Value& object) {
  record r;
  r.fields.reserve(object.MemberCount());
  for (const auto& m : object.GetObject()) {
    const std::string_view name(m.name.GetString(), m.name.GetStringLength());
    if (m.value.IsString())
      r.set(name, std::string(m.value.GetString(), m.value.GetStringLength()));
    else if (m.value.IsNumber())
      r.set(name, m.value.GetDouble());
    else if (m.value.IsBool())
      r.set(name, m.value.GetBool() ? 1.0 : 0.0);
    else
      r.set(name, std::numeric_limits<double>::quiet_NaN());
  }
  return r;
}

// A resumed run restarts at its checkpoint: records past it were redone and the newer ones replace them.
void roll_back(node_metrics& m, const record& start) {
  const double step = num(start, "resumed_step");
  if (!std::isfinite(step)) return;
  // The checkpoint's round; older writers give only the step, whose round this session's H told (wrong after
  // a resume under another train.inner_steps: a probe's report dropped rounds 3 and 4 of 6).
  const double h = num(start, "inner_steps");
  const double round = std::isfinite(num(start, "resumed_round")) ? num(start, "resumed_round")
                       : h > 0                                    ? std::floor(step / h)
                                                                  : HUGE_VAL;
  auto past = [](std::vector<record>& v, const char* key, double limit) {
    v.erase(std::remove_if(v.begin(), v.end(), [&](const record& o) { return num(o, key) > limit; }),
            v.end());
  };
  m.steps.erase(
      std::remove_if(m.steps.begin(), m.steps.end(), [&](const step_point& p) { return p.step > step; }),
      m.steps.end());
  past(m.evals, "step", step);
  past(m.workers, "round", round);
  past(m.allreduces, "round", round);
}

/// A start from step 0 after earlier records, not by joining a running cluster (a node killed before its
/// first checkpoint that joins again goes on in the same run): a new run in the same out_dir, the one
/// reported.
void start_over(node_metrics& m) {
  node_metrics fresh;
  fresh.name = std::move(m.name);
  fresh.path = std::move(m.path);
  fresh.n_records = m.n_records;
  fresh.n_skipped = m.n_skipped;
  fresh.earlier_runs = m.earlier_runs + 1;
  m = std::move(fresh);
}

void add_record(node_metrics& m, record obj) {
  const std::string kind = text(obj, "kind");
  const double ts = num(obj, "ts");
  if (kind == "start" && !m.starts.empty() && num(obj, "resumed_step") == 0 && num(obj, "joined") != 1)
    start_over(m);
  if (kind == "start" || m.sessions.empty()) m.sessions.emplace_back(ts, ts);
  if (std::isfinite(ts)) {
    auto& s = m.sessions.back();
    if (!std::isfinite(s.first)) s.first = ts;
    s.second = std::isfinite(s.second) ? std::max(s.second, ts) : ts;
  }
  ++m.n_records;
  if (kind == "start") {
    roll_back(m, obj);
    m.starts.push_back(std::move(obj));
    m.ended = false;
  } else if (kind == "step") {
    m.steps.push_back({num(obj, "step"), num(obj, "loss")});
  } else if (kind == "worker") {
    m.workers.push_back(std::move(obj));
  } else if (kind == "allreduce") {
    if (const double b = num(obj, "bytes_sent"); std::isfinite(b)) m.bytes_sent += b;
    m.allreduces.push_back(std::move(obj));
  } else if (kind == "eval") {
    m.evals.push_back(std::move(obj));
  } else if (kind == "checkpoint") {
    m.checkpoints.push_back(std::move(obj));
  } else if (kind == "end") {
    m.ends.push_back(std::move(obj));
    m.ended = true;
  } else if (kind == "membership") {
    m.memberships.push_back(std::move(obj));
  } else if (kind == "recovery") {
    m.recoveries.push_back(std::move(obj));
  } else if (kind == "contribution") {
    m.contributions.push_back(std::move(obj));
  } else if (kind == "version") {
    m.versions.push_back(std::move(obj));
  } else if (kind == "dropped") {
    m.drops.push_back(std::move(obj));
  } else if (kind == "round" && num(obj, "round") >= 2 && std::isfinite(num(obj, "inner_s"))) {
    const auto secs = [&](std::string_view key) {
      return std::isfinite(num(obj, key)) ? num(obj, key) : 0.0;
    };
    ++m.timed_rounds;
    m.reducing_s += secs("reducing_s");
    m.outer_step_s += secs("outer_step_s");
  }
  // Other kinds come from a newer writer: counted, not shown.
}

}  // namespace

std::string read_metrics_file(const fs::path& path, node_metrics& m) {
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec))  // a FIFO would block the reader
    return fmt::format("{}: not a regular file (a directory, a pipe or a device)", path.string());
  std::ifstream in(path, std::ios::binary);
  if (!in) return fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno));
  m.path = path.string();
  constexpr size_t max_warnings = 5;
  size_t line_no = 0, blank = 0;
  bool truncated_last = false;
  std::string buffer;
  while (std::getline(in, buffer)) {
    const bool last = in.eof();  // no newline after it: a writer may have stopped mid-line
    std::string_view line(buffer);
    ++line_no;
    if (line_no == 1 && line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) {
      ++blank;
      continue;
    }

    rapidjson::Document doc;
    const auto error = runtime::parse_json(line, doc);
    bool ok = !error;
    // A run killed mid-line leaves a partial record; the resumed run's first record can follow on that line.
    // Records begin with {"kind": (json_line), so only there, and at most a few times: a line of nested
    // objects must not cost a parse per '{'.
    constexpr std::string_view record_start = R"({"kind":)";
    constexpr int max_retries = 4;
    int retries = 0;
    for (size_t b = line.find(record_start, 1); !ok && b != std::string_view::npos && retries++ < max_retries;
         b = line.find(record_start, b + 1)) {
      if ((ok = !runtime::parse_json(line.substr(b), doc)) && m.n_skipped++ < max_warnings)
        fmt::print(stderr, "report: warning: {}:{}: skipped a partial record before column {}\n", m.path,
                   line_no, b + 1);
    }
    if (!ok && last && error->truncated) {
      truncated_last = true;
      fmt::print(stderr,
                 "report: note: {}:{}: ignored the truncated last line (the run was stopped mid-write)\n",
                 m.path, line_no);
      continue;
    }
    std::string problem;
    record rec;
    if (!ok)
      problem = error->truncated ? "the line ends inside a record (truncated)"
                                 : fmt::format("{} at column {}", error->what, error->column);
    else if (!doc.IsObject())
      problem = "not a JSON object";
    else if (rec = to_record(doc); text(rec, "kind").empty())
      problem = "no \"kind\" field";
    if (!problem.empty()) {
      if (m.n_skipped++ < max_warnings)
        fmt::print(stderr, "report: warning: {}:{}: skipped a malformed line: {}\n", m.path, line_no,
                   problem);
      continue;
    }
    add_record(m, std::move(rec));
  }
  if (m.n_skipped > max_warnings)
    fmt::print(stderr, "report: warning: {}: {} more malformed lines skipped\n", m.path,
               m.n_skipped - max_warnings);
  if (m.n_records == 0) {  // what it holds instead (a probe: "the file is empty" of a truncated line)
    std::vector<std::string> held;
    if (m.n_skipped) held.push_back(fmt::format("{} malformed", m.n_skipped));
    if (truncated_last) held.push_back("a truncated last line");
    if (blank) held.push_back(fmt::format("{} blank line{}", blank, blank == 1 ? "" : "s"));
    std::string what;
    for (const auto& h : held) what += (what.empty() ? "" : ", ") + h;
    return fmt::format("{}: no valid metrics line ({})", m.path, what.empty() ? "the file is empty" : what);
  }
  return {};
}

}  // namespace longwave::cli::report
