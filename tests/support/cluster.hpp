#pragma once
// Test helpers for clusters on loopback: a cluster file with free ports, file edits, and theta of the
// checkpoints a node wrote.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "runtime/checkpoint/checkpoint_store.hpp"
#include "tests/support/json.hpp"
#include "tests/support/process.hpp"

namespace longwave::test {

// Short runs of the mechanics model (tests/support/process.hpp): every worker one thread, so results do not
// depend on how many share a core.
inline const std::string cluster_train_sections =
    std::string("\n[model]\nseq_len = 64\n") + mechanics_model + R"(
[train]
inner_steps = 3
rounds = 3
batch_size = 4
warmup_steps = 3
threads = 1
[eval]
every_rounds = 0
batches = 2
[checkpoint]
every_rounds = 1
)";

struct cluster_ports {
  int coordinator = 0;
  std::vector<int> ring, metrics;
};

/// Writes a cluster file with `workers[i]` workers on node i ("n0", "n1", ...) and returns its path. The
/// cluster runs with CURVE (keys made in DIR/keys) unless `extra` has a [security] section.
inline std::string cluster_file(const std::string& dir, const std::vector<int>& workers, cluster_ports& ports,
                                const std::string& extra = "", double join_timeout_s = 60) {
  ports.coordinator = free_port();
  std::string text = "[cluster]\nid = \"test-" + std::filesystem::path(dir).filename().string() +
                     "\"\ncoordinator = " + "\"tcp://127.0.0.1:" + std::to_string(ports.coordinator) +
                     "\"\njoin_timeout_s = " + std::to_string(join_timeout_s) +
                     "\nmetrics_port = " + std::to_string(free_port()) + "\n";
  for (size_t i = 0; i < workers.size(); ++i) {
    ports.ring.push_back(free_port());
    ports.metrics.push_back(free_port());
    text += "\n[[nodes]]\nname = \"n" + std::to_string(i) +
            "\"\nendpoint = \"tcp://127.0.0.1:" + std::to_string(ports.ring.back()) +
            "\"\nworkers = " + std::to_string(workers[i]) +
            "\nmetrics_port = " + std::to_string(ports.metrics.back()) + "\n";
  }
  text += "\n[run]\nout_dir = \"" + dir + "/cluster\"\nseed = 7\n" + cluster_train_sections + extra;
  if (extra.find("[security]") == std::string::npos) text += curve_keys(dir);
  const auto path = dir + "/cluster.toml";
  write_text(path, text);
  return path;
}

/// Replaces the first `from` in the file at `path` with `to`.
inline void edit_file(const std::string& path, const std::string& from, const std::string& to) {
  auto text = read_text(path);
  const auto at = text.find(from);
  CATCH_REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
  write_text(path, text);
}

inline std::vector<float> theta_of(const runtime::checkpoint& c) {
  const auto* blob = c.find("theta");
  CATCH_REQUIRE(blob != nullptr);
  std::vector<float> out(blob->size / sizeof(float));
  std::memcpy(out.data(), blob->data, blob->size);
  return out;
}

/// theta of the newest checkpoint in a directory.
inline std::vector<float> newest_theta(const std::string& ckpt_dir) {
  runtime::checkpoint_store store(ckpt_dir, 100);
  auto c = store.load_latest();
  CATCH_REQUIRE(c.has_value());
  return theta_of(*c);
}

/// theta of the oldest checkpoint in a directory.
inline std::vector<float> oldest_theta(const std::string& ckpt_dir) {
  runtime::checkpoint_store store(ckpt_dir, 100);
  const auto files = store.list();
  CATCH_REQUIRE(!files.empty());
  return theta_of(runtime::checkpoint_store::load_file(files.front()));
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  CATCH_REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

inline bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

/// The last `n` characters of a (log) text.
inline std::string tail(const std::string& text, size_t n = 6000) {
  return text.substr(text.size() > n ? text.size() - n : 0);
}

/// The coordinator's log and the nodes' tails in `dir` (coord.log, NAME.log), for a failed wait's message.
inline std::string cluster_logs(const std::string& dir, const std::vector<std::string>& names,
                                const std::string& coordinator_log = "coord.log") {
  std::string logs = "--- " + coordinator_log + "\n" + tail(read_text(dir + "/" + coordinator_log), 4000);
  for (const auto& n : names) logs += "\n--- " + n + "\n" + tail(read_text(dir + "/" + n + ".log"), 3000);
  return logs;
}

/// Waits until every node's log (dir/NAME.log) holds `text`; on a timeout the test fails with the logs.
inline void require_in_node_logs(const std::string& dir, const std::vector<std::string>& names,
                                 const std::string& text, double timeout_s = 300) {
  for (const auto& n : names)
    if (!wait_for_text(dir + "/" + n + ".log", text, timeout_s))
      CATCH_FAIL(n << " did not log '" << text << "' within " << timeout_s << " s\n"
                   << cluster_logs(dir, names));
}

/// Starts the coordinator and one node per entry of the cluster file; logs go to dir/coord.log, dir/nI.log.
/// `node_env[i]`, where given, is added to node i's environment ("NAME=VALUE" each).
inline std::pair<child, std::vector<child>> start_cluster(
    const std::string& dir, const std::string& cluster, size_t n_nodes,
    const std::vector<std::vector<std::string>>& node_env = {}) {
  auto coord = spawn({binary(), "coordinator", cluster}, dir + "/coord.log");
  std::vector<child> nodes;
  for (size_t i = 0; i < n_nodes; ++i) {
    const auto name = "n" + std::to_string(i);
    nodes.push_back(spawn({binary(), "node", cluster, "--node", name}, dir + "/" + name + ".log", false,
                          i < node_env.size() ? node_env[i] : std::vector<std::string>{}));
  }
  return {coord, nodes};
}

/// How many checkpoints node `node` of the cluster in `dir` has written.
inline size_t checkpoint_count(const std::string& dir, const std::string& node) {
  return runtime::checkpoint_store(dir + "/cluster/" + node + "/checkpoints", 100).list().size();
}

inline bool has_checkpoint(const std::string& dir, const std::string& node) {
  return checkpoint_count(dir, node) > 0;
}

/// theta_crc32c of each "round" record of a node's metrics.jsonl (in out_dir), by round. A round recorded
/// twice must carry the same CRC both times.
inline std::map<int64_t, std::string> round_crcs(const std::string& out_dir) {
  std::map<int64_t, std::string> out;
  std::istringstream in(read_text(out_dir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const auto doc = parse_json(line);
    if (std::string(doc["kind"].GetString()) != "round") continue;
    const int64_t round = doc["round"].GetInt64();
    const std::string crc = doc["theta_crc32c"].GetString();
    const auto [at, fresh] = out.emplace(round, crc);
    CATCH_INFO(out_dir << ": round " << round << " recorded twice");
    CATCH_CHECK((fresh || at->second == crc));
  }
  return out;
}

/// train.rounds of a run that the test ends itself (stop_cluster): more than any test trains, so the run
/// never ends before the test has seen what it waits for.
inline constexpr int64_t endless_rounds = 1000000;

/// The records of a JSON-lines file in order; a line being written (not yet whole) is left out.
inline std::vector<rapidjson::Document> records_in(const std::string& path) {
  std::vector<rapidjson::Document> out;
  std::istringstream in(read_text(path));
  for (std::string line; std::getline(in, line);) {
    try {
      out.push_back(parse_json(line));
    } catch (const std::runtime_error&) {
      // the last line, still being written
    }
  }
  return out;
}

/// The records of a node's metrics.jsonl (in out_dir) in order.
inline std::vector<rapidjson::Document> records_of(const std::string& out_dir) {
  return records_in(out_dir + "/metrics.jsonl");
}

/// The coordinator's event log records of `kind` (cluster/master_state.hpp's record) in order; `cluster_out`
/// is the cluster's run.out_dir.
inline std::vector<rapidjson::Document> master_records(const std::string& cluster_out,
                                                       const std::string& kind) {
  auto all = records_in(cluster_out + "/coordinator.jsonl");
  std::vector<rapidjson::Document> out;
  for (auto& r : all)
    if (kind == r["kind"].GetString()) out.push_back(std::move(r));
  return out;
}

/// The coordinator's last "end" record: how its work ended; the test fails if there is none.
inline rapidjson::Document master_end(const std::string& cluster_out) {
  auto ends = master_records(cluster_out, "end");
  CATCH_REQUIRE(ends.size() >= 1);
  return std::move(ends.back());
}

/// The coordinator's event log ends with `outcome` ("finished", "stopped") and exit code 0: the run finished
/// (or stopped) on the nodes `finished` ("n0,n1"), with `removed` ("n2:lost", "" for none) on the way.
inline void check_master_end(const std::string& cluster_out, const std::string& outcome,
                             const std::string& finished, const std::string& removed) {
  const auto end = master_end(cluster_out);
  CATCH_CHECK(str(at(end, "outcome")) == outcome);
  CATCH_CHECK(at(end, "exit_code").GetInt64() == 0);
  CATCH_CHECK(str(at(end, "finished")) == finished);
  CATCH_CHECK(str(at(end, "removed")) == removed);
}

/// Waits until the coordinator's event log holds `n` records of `kind`; false on a timeout.
inline bool wait_master_records(const std::string& cluster_out, const std::string& kind, size_t n,
                                double timeout_s) {
  return wait_until([&] { return master_records(cluster_out, kind).size() >= n; }, timeout_s);
}

/// Why the coordinator last removed `node`: its "removed" record's reason ("lost", "left", "failed",
/// "absent") and text; {"", ""} when it has none.
inline std::pair<std::string, std::string> master_removal(const std::string& cluster_out,
                                                          const std::string& node) {
  std::pair<std::string, std::string> out;
  for (const auto& r : master_records(cluster_out, "removed"))
    if (str(at(r, "node")) == node)
      out = {str(at(r, "reason")), r.HasMember("why") ? str(at(r, "why")) : std::string()};
  return out;
}

/// Waits until the coordinator has recorded an epoch `epoch` (its "epoch" record) whose reason and members
/// ("n0,n1", ring order) are the given ones; false on a timeout.
inline bool wait_master_epoch(const std::string& cluster_out, int64_t epoch, const std::string& reason,
                              const std::string& members, double timeout_s) {
  return wait_until(
      [&] {
        for (const auto& r : master_records(cluster_out, "epoch"))
          if (at(r, "epoch").GetInt64() == epoch && str(at(r, "reason")) == reason &&
              str(at(r, "members")) == members)
            return true;
        return false;
      },
      timeout_s);
}

/// Rounds a node (out_dir) recorded since it entered a membership of exactly `members` ("n0,n1", ring
/// order), from its metrics.jsonl; 0 while it is not in one.
inline int rounds_in_membership(const std::string& out_dir, const std::string& members) {
  int rounds = 0;
  bool in = false;
  for (const auto& r : records_of(out_dir)) {
    const std::string kind = r["kind"].GetString();
    if (kind == "membership") {
      in = str(at(r, "members")) == members;
      rounds = 0;
    } else if (kind == "round" && in) {
      ++rounds;
    }
  }
  return rounds;
}

/// Rounds a node (out_dir) has recorded (its metrics.jsonl).
inline int rounds_recorded(const std::string& out_dir) {
  int rounds = 0;
  for (const auto& r : records_of(out_dir)) rounds += std::string(r["kind"].GetString()) == "round";
  return rounds;
}

/// theta's CRC by round in node `out_dir`'s round records after its first `skip` records.
std::map<int64_t, std::string> round_crcs_since(const std::string& out_dir, size_t skip) {
  std::map<int64_t, std::string> out;
  const auto records = records_of(out_dir);
  for (size_t i = skip; i < records.size(); ++i)
    if (std::string(records[i]["kind"].GetString()) == "round")
      out[records[i]["round"].GetInt64()] = records[i]["theta_crc32c"].GetString();
  return out;
}

/// How many records of `kind` ("recovery", "membership", ...) a node's metrics.jsonl (in out_dir) holds.
inline int record_count(const std::string& out_dir, const std::string& kind) {
  int n = 0;
  for (const auto& r : records_of(out_dir)) n += kind == r["kind"].GetString();
  return n;
}

/// Waits until each node (out_dir) has recorded `n` more rounds than it had at the call; false on a
/// timeout.
inline bool wait_more_rounds(const std::vector<std::string>& out_dirs, int n, double timeout_s = 300) {
  std::vector<int> before;
  for (const auto& d : out_dirs) before.push_back(rounds_recorded(d));
  return wait_until(
      [&] {
        for (size_t i = 0; i < out_dirs.size(); ++i)
          if (rounds_recorded(out_dirs[i]) < before[i] + n) return false;
        return true;
      },
      timeout_s);
}

/// `longwave stop CLUSTER`: the coordinator agrees to stop the cluster at its next round boundary (every
/// node saves its checkpoint and exits 0, then the coordinator). Output in dir/stop.log. `in` runs the
/// command elsewhere (e.g. wan_hosts::in, inside a namespace host); `extra` adds options (--wait).
inline void stop_cluster(const std::string& dir, const std::string& cluster,
                         const std::function<std::vector<std::string>(std::vector<std::string>)>& in = {},
                         const std::vector<std::string>& extra = {}) {
  std::vector<std::string> cmd{binary(), "stop", cluster};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  const auto [code, out] = run(in ? in(cmd) : cmd, dir + "/stop.log", 120);
  CATCH_INFO(out);
  CATCH_REQUIRE(code == 0);
}

/// The round after which a stopped node stopped: its metrics.jsonl's "stop" record (0: none).
inline int64_t stop_round(const std::string& out_dir) {
  int64_t round = 0;
  for (const auto& r : records_of(out_dir))
    if (std::string(r["kind"].GetString()) == "stop") round = at(r, "round").GetInt64();
  return round;
}

/// Starts the cluster in `cluster` with its n_nodes nodes, trains until node `node` has written 2
/// checkpoints, stops it and requires every process to exit 0: a stopped cluster to resume. Returns the
/// round node n0 stopped after.
inline int64_t train_and_stop(const std::string& dir, const std::string& cluster, size_t n_nodes,
                              const std::string& node) {
  auto [coord, nodes] = start_cluster(dir, cluster, n_nodes);
  CATCH_REQUIRE(wait_until([&] { return checkpoint_count(dir, node) >= 2; }, 300));
  stop_cluster(dir, cluster);
  for (auto& n : nodes) CATCH_REQUIRE(wait_exit(n, 300) == 0);
  CATCH_REQUIRE(wait_exit(coord, 60) == 0);
  const int64_t round = stop_round(dir + "/cluster/n0");
  CATCH_REQUIRE(round > 0);
  return round;
}

}  // namespace longwave::test
