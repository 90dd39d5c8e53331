// diloco.outer = "async" across real processes on loopback: nodes of different paced speeds, the master's
// merges, and one theta per version on every node. Assertions are on records (which node a merge took, the
// CRC each node wrote per version), never on durations.
#include <catch2/catch.hpp>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/support/cluster.hpp"
#include "tests/support/process.hpp"

using namespace longwave;
using namespace longwave::test;
namespace fs = std::filesystem;

namespace {

/// Four one-worker nodes; n3 paces its steps 20x slower than the others (1 s against 0.05 s): one phase of
/// n3 spans many of theirs whatever the machine's speed, since pacing is a lower bound on a step's time.
std::string slow_node_cluster(const std::string& dir, cluster_ports& ports, int64_t n_versions,
                              const std::string& extra) {
  const auto cluster = cluster_file(dir, {1, 1, 1, 1}, ports,
                                    "[metrics]\nenabled = false\n[diloco]\nouter = \"async\"\n"
                                    "[async]\nquorum = 1\ngrace_min_s = 0\ngrace_max_s = 0.5\n"
                                    "max_staleness = 1000\n" +
                                        extra);
  edit_file(cluster, "rounds = 3", "rounds = " + std::to_string(n_versions));
  edit_file(cluster, "threads = 1", "threads = 1\npace_step_s = 0.05");
  edit_file(cluster, "name = \"n3\"", "name = \"n3\"\nspeed = 0.05");
  return cluster;
}

/// Three equal one-worker nodes for `n_versions` versions, paced at 0.05 s a step unless `paced` is false:
/// 60 take at least 60 / 3 phases of 0.15 s, so a test that acts at version 3 to 6 acts mid-run on any
/// machine.
constexpr int64_t versions = 60;
std::string equal_nodes_cluster(const std::string& dir, int64_t n_versions = versions, bool paced = true) {
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1, 1}, ports,
                                    "[metrics]\nenabled = false\n[diloco]\nouter = \"async\"\n"
                                    "[async]\nquorum = 1\ngrace_max_s = 0.5\nmax_staleness = 1000\n");
  edit_file(cluster, "rounds = 3", "rounds = " + std::to_string(n_versions));
  if (paced) edit_file(cluster, "threads = 1", "threads = 1\npace_step_s = 0.05");
  return cluster;
}

/// Worker 0's data position in a checkpoint file (replica0/counters: its steps, data position, step of the
/// round).
int64_t data_position(const std::string& path) {
  const auto c = runtime::checkpoint_store::load_file(path);
  const auto* b = c.find("replica0/counters");
  CATCH_REQUIRE(b != nullptr);
  CATCH_REQUIRE(b->size == 3 * sizeof(int64_t));
  int64_t v[3];
  std::memcpy(v, b->data, sizeof v);
  return v[1];
}

/// The version of theta a checkpoint holds (its meta line, runtime/checkpoint/snapshot_codec.cpp).
int64_t version_of(const runtime::checkpoint& c) {
  const auto at_v = c.meta.find("\nversion=");
  CATCH_REQUIRE(at_v != std::string::npos);
  return std::stoll(c.meta.substr(at_v + 9));
}

/// The run ended with one model: every node's newest checkpoint holds the same theta.
void check_one_final_theta(const std::string& cluster_out, const std::vector<std::string>& nodes) {
  const auto a = newest_theta(cluster_out + "/" + nodes[0] + "/checkpoints");
  for (size_t i = 1; i < nodes.size(); ++i) {
    CATCH_INFO("node " << nodes[i]);
    CATCH_CHECK(max_abs_diff(a, newest_theta(cluster_out + "/" + nodes[i] + "/checkpoints")) == 0.0);
  }
}

/// Every version's theta CRC as the nodes recorded it: version -> the distinct CRCs seen. after_resume: only
/// the records from each node's resumed version on (versions past the newest checkpoint that were applied
/// before a kill are merged again after it, from other arrivals).
std::map<int64_t, std::set<std::string>> version_crcs(const std::string& cluster_out,
                                                      const std::vector<std::string>& nodes,
                                                      bool after_resume = false) {
  std::map<int64_t, std::set<std::string>> crcs;
  for (const auto& node : nodes) {
    bool taking = !after_resume;
    for (const auto& r : records_of(cluster_out + "/" + node)) {
      if (std::string(r["kind"].GetString()) != "version") continue;
      taking = taking || r.HasMember("resumed");
      if (taking) crcs[at(r, "version").GetInt64()].insert(str(at(r, "theta_crc32c")));
    }
  }
  return crcs;
}

/// Every node that applied a version wrote the same theta CRC for it.
void check_one_crc_per_version(const std::map<int64_t, std::set<std::string>>& crcs) {
  for (const auto& [v, set] : crcs) {
    CATCH_INFO("version " << v);
    CATCH_CHECK(set.size() == 1);
  }
}

}  // namespace

CATCH_TEST_CASE("async: merges go on without a slow node, and every node holds one theta per version",
                "[process][cluster][async]") {
  // fp32, and the lossy codecs whose error feedback a relaying node must leave as it is.
  const std::vector<std::pair<std::string, std::string>> codecs{
      {"fp32", ""},
      {"int8", "[comm]\ndtype = \"int8\"\nerror_feedback = true\n"},
      {"sparse", "[comm]\ndtype = \"sparse\"\n"}};
  for (const auto& [codec, comm] : codecs) {
    CATCH_INFO("comm: " << codec);
    const auto dir = scratch_dir("async_slow_" + codec);
    cluster_ports ports;
    const int64_t few = 6;
    const auto cluster = slow_node_cluster(dir, ports, few, comm);
    auto [code, log] = run({binary(), "launch", cluster}, dir + "/launch.log", 600);
    CATCH_INFO(log);
    CATCH_REQUIRE(code == 0);
    check_master_end(dir + "/cluster", "finished", "n0,n1,n2,n3", "");
    // Progress lines count each node's own phases and the version it holds, not rounds of the run's total
    // (a fast node printed "round 80/80 | step 410/400").
    CATCH_CHECK(contains(log, " | version "));
    CATCH_CHECK_FALSE(std::regex_search(log, std::regex("round +[0-9]+/[0-9]+ \\| step")));

    // The master's merges: consecutive versions from 1, the first made before n3's first phase could end.
    const auto merges = master_records(dir + "/cluster", "merge");
    CATCH_REQUIRE(merges.size() >= static_cast<size_t>(few));
    for (size_t i = 0; i < merges.size(); ++i)
      CATCH_CHECK(at(merges[i], "version").GetInt64() == int64_t(i + 1));
    CATCH_CHECK(str(at(merges[0], "nodes")).find("n3") == std::string::npos);
    // Version 1 came while n3's first phase ran (its 10 paced steps take 10 s): n3 took it in mid-phase
    // (async.rebase_steps = 1), and that phase counts from it.
    std::vector<rapidjson::Document> n3_phases;
    for (auto& r : records_of(dir + "/cluster/n3"))
      if (std::string(r["kind"].GetString()) == "contribution") n3_phases.push_back(std::move(r));
    CATCH_REQUIRE(!n3_phases.empty());
    // Nothing waited for n3 (A2's measured order: async's goodput above sync's, whose rounds would be n3's
    // phases): more versions were merged than n3 ran phases.
    CATCH_CHECK(n3_phases.size() < merges.size());
    CATCH_CHECK(at(n3_phases[0], "rebases").GetInt64() >= 1);
    CATCH_CHECK(at(n3_phases[0], "v_start").GetInt64() >= 1);

    // Every node applied versions 1..6 and wrote theta's CRC for each: the same on all four.
    for (const std::string node : {"n0", "n1", "n2", "n3"}) {
      const auto own = version_crcs(dir + "/cluster", {node});
      CATCH_INFO("node " << node);
      CATCH_CHECK(own.size() == static_cast<size_t>(few));
      CATCH_CHECK((!own.empty() && own.begin()->first == 1 && own.rbegin()->first == few));
    }
    const auto crcs = version_crcs(dir + "/cluster", {"n0", "n1", "n2", "n3"});
    check_one_crc_per_version(crcs);
    // Versions differ from each other (the merges moved theta), and the run ends with one model everywhere.
    CATCH_CHECK(*crcs.at(1).begin() != *crcs.at(few).begin());
    check_one_final_theta(dir + "/cluster", {"n0", "n1", "n2", "n3"});
    CATCH_CHECK(contains(log, "async: version 6 is the last"));
    // The report's table of merges: a row per node, n3's phases fewer than n0's.
    auto [rcode, rlog] = run({binary(), "report", dir + "/cluster"}, dir + "/report.log", 60);
    CATCH_CHECK(rcode == 0);
    const auto html = read_text(dir + "/cluster/report.html");
    CATCH_CHECK(contains(html, "<h2>Asynchronous merges</h2>"));
    CATCH_CHECK(contains(html, "<th>goodput (merged / trained)</th>"));
    const auto table = html.substr(std::min(html.size(), html.find("<h2>Asynchronous merges</h2>")), 3000);
    CATCH_INFO(table);
    for (const std::string node : {"n0", "n3"}) CATCH_CHECK(contains(table, node + "</th><td>"));
    // eval names what it read as async runs do: the node's phase and theta's version (it said "round").
    if (codec == "fp32") {
      auto [ecode, elog] = run({binary(), "eval", dir + "/cluster/n0/checkpoints"}, dir + "/eval.log", 300);
      CATCH_INFO(elog);
      CATCH_CHECK(ecode == 0);
      CATCH_CHECK(std::regex_search(elog, std::regex("checkpoint phase [0-9]+, theta version " +
                                                     std::to_string(few) + ", inner step [0-9]+: val loss")));
    }
    fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
  }
}

CATCH_TEST_CASE(
    "async: a node SIGKILLed while the others merge is removed, and the survivors finish on one theta",
    "[process][cluster][async][elastic]") {
  const auto dir = scratch_dir("async_kill");
  const auto cluster = equal_nodes_cluster(dir);
  auto [coord, nodes] = start_cluster(dir, cluster, 3);
  const auto out = dir + "/cluster";
  CATCH_REQUIRE(wait_master_records(out, "merge", 3, 300));
  kill(nodes[2].pid, SIGKILL);
  CATCH_CHECK(wait_exit(nodes[2], 30) == 128 + SIGKILL);
  const int code0 = wait_exit(nodes[0], 300), code1 = wait_exit(nodes[1], 300);
  const int coord_code = wait_exit(coord, 60);
  CATCH_INFO("--- n0\n"
             << tail(read_text(dir + "/n0.log")) << "\n--- coordinator\n"
             << read_text(dir + "/coord.log"));
  CATCH_REQUIRE(code0 == 0);
  CATCH_REQUIRE(code1 == 0);
  CATCH_CHECK(coord_code == 0);
  check_master_end(out, "finished", "n0,n1", "n2:lost");
  // No merge after n2's removal takes it; both survivors applied every version, with one CRC each.
  bool removed = false;
  for (const auto& r : records_in(out + "/coordinator.jsonl")) {
    const std::string kind = r["kind"].GetString();
    if (kind == "removed" && str(at(r, "node")) == "n2") removed = true;
    if (kind == "merge" && removed) CATCH_CHECK(str(at(r, "nodes")).find("n2") == std::string::npos);
  }
  CATCH_CHECK(removed);
  const auto crcs = version_crcs(out, {"n0", "n1"});
  CATCH_CHECK(crcs.size() == static_cast<size_t>(versions));
  check_one_crc_per_version(crcs);
  check_one_final_theta(out, {"n0", "n1"});
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE(
    "async: a SIGKILLed node started again with the same command joins the running cluster at the members' "
    "version",
    "[process][cluster][async][elastic]") {
  const auto dir = scratch_dir("async_rejoin");
  // Ended by longwave stop once n2 is back in, so it can never end before n2 rejoins.
  const auto cluster = equal_nodes_cluster(dir, 100000);
  const auto out = dir + "/cluster";
  auto [coord, nodes] = start_cluster(dir, cluster, 3);
  CATCH_REQUIRE(wait_master_records(out, "merge", 3, 300));
  kill(nodes[2].pid, SIGKILL);
  CATCH_CHECK(wait_exit(nodes[2], 30) == 128 + SIGKILL);
  // Where n2's own data stream stood at its newest checkpoint: it reads on from there after the join.
  const auto own = runtime::checkpoint_store(out + "/n2/checkpoints", 100).list();
  CATCH_REQUIRE_FALSE(own.empty());
  const int64_t own_position = data_position(own.back());
  const auto own_checkpoint = runtime::checkpoint_store::load_file(own.back());
  const auto own_round = static_cast<int64_t>(own_checkpoint.round);
  const auto own_step = static_cast<int64_t>(own_checkpoint.step);
  CATCH_REQUIRE(wait_until([&] { return master_removal(out, "n2").first == "lost"; }, 300));
  auto again = spawn({binary(), "node", cluster, "--node", "n2"}, dir + "/n2-again.log");
  // Admitted, then a merge that takes its contribution.
  const auto merged_after_admission = [&] {
    bool admitted = false;
    for (const auto& r : records_in(out + "/coordinator.jsonl")) {
      const std::string kind = r["kind"].GetString();
      admitted = admitted || (kind == "admitted" && str(at(r, "node")) == "n2");
      if (admitted && kind == "merge" && contains(str(at(r, "nodes")), "n2")) return true;
    }
    return false;
  };
  const bool merged = wait_until(merged_after_admission, 300);
  CATCH_INFO("--- n2 again\n"
             << tail(read_text(dir + "/n2-again.log")) << "\n--- coordinator\n"
             << tail(read_text(dir + "/coord.log")));
  CATCH_REQUIRE(merged);
  stop_cluster(dir, cluster);
  for (auto* n : {&nodes[0], &nodes[1], &again}) CATCH_CHECK(wait_exit(*n, 300) == 0);
  CATCH_CHECK(wait_exit(coord, 60) == 0);
  const auto end = master_end(out);
  CATCH_CHECK(str(at(end, "outcome")) == "stopped");
  CATCH_CHECK(str(at(end, "finished")) == "n0,n1,n2");

  // n2 was admitted with the members' version V; its first record after the restart is V, joined, and every
  // version has one CRC across the three nodes (n2's from V on: a version it applied just before the kill may
  // have been redone without it).
  const auto admitted = master_records(out, "admitted");
  CATCH_REQUIRE(admitted.size() == 1);
  const int64_t v = at(admitted[0], "round").GetInt64();
  CATCH_CHECK(v >= 3);
  const auto log = read_text(dir + "/n2-again.log");
  CATCH_CHECK(contains(log, "async: joined the running cluster at version " + std::to_string(v)));
  const std::string joined_as =
      "the fetched state of version " + std::to_string(v) + " is this node's checkpoint ";
  CATCH_REQUIRE(contains(log, joined_as));
  // Its workers read on from n2's own data position, not its donor's.
  CATCH_CHECK(contains(log, "read their own data on from position " + std::to_string(own_position) +
                                " (its newest checkpoint's)"));
  bool first = true;
  for (const auto& r : records_of(out + "/n2")) {
    if (std::string(r["kind"].GetString()) != "version" || !r.HasMember("joined")) continue;
    CATCH_CHECK(first);
    first = false;
    CATCH_CHECK(at(r, "version").GetInt64() == v);
  }
  CATCH_CHECK_FALSE(first);
  // Its phases count on from its own (the join is one boundary after its newest checkpoint), not from the
  // version it joined at or its donor's phases.
  bool joined = false;
  std::optional<int64_t> first_phase;
  for (const auto& r : records_of(out + "/n2")) {
    const std::string kind = r["kind"].GetString();
    joined = joined || (kind == "version" && r.HasMember("joined"));
    if (joined && kind == "contribution" && !first_phase) first_phase = at(r, "round").GetInt64();
  }
  CATCH_REQUIRE(first_phase.has_value());
  CATCH_CHECK(*first_phase == own_round + 2);
  // Its inner steps count on from its own too (its donor's Adam count stays with the donor's moments): the
  // steps after the join go on from its checkpoint's, the loss trace runs 1, 2, ... without a gap or a
  // repeat, and the end record counts them.
  joined = false;
  std::vector<int64_t> steps_after;
  std::optional<int64_t> end_steps;
  for (const auto& r : records_of(out + "/n2")) {
    const std::string kind = r["kind"].GetString();
    joined = joined || (kind == "version" && r.HasMember("joined"));
    if (joined && kind == "step") steps_after.push_back(at(r, "step").GetInt64());
    if (joined && kind == "end") end_steps = at(r, "steps").GetInt64();
  }
  CATCH_REQUIRE_FALSE(steps_after.empty());
  CATCH_CHECK(steps_after.front() == own_step + 1);
  CATCH_CHECK(end_steps == steps_after.back());
  const auto trace = read_trace(out + "/n2/loss_trace.tsv");
  CATCH_REQUIRE_FALSE(trace.empty());
  for (size_t i = 0; i < trace.size(); ++i) CATCH_CHECK(trace[i].first == static_cast<long>(i) + 1);
  CATCH_CHECK(trace.back().first == steps_after.back());
  // The checkpoint of its stop is named by its own step, so a resume goes on from there.
  const auto stopped_at = runtime::checkpoint_store(out + "/n2/checkpoints", 100).list();
  CATCH_REQUIRE_FALSE(stopped_at.empty());
  CATCH_CHECK(static_cast<int64_t>(runtime::checkpoint_store::load_file(stopped_at.back()).step) ==
              steps_after.back());
  auto crcs = version_crcs(out, {"n0", "n1"});
  for (const auto& [version, set] : version_crcs(out, {"n2"}, /*after_resume=*/true))
    crcs[version].insert(set.begin(), set.end());
  CATCH_CHECK(crcs.count(v) == 1);
  CATCH_CHECK(crcs.rbegin()->first > v);
  check_one_crc_per_version(crcs);
  check_one_final_theta(out, {"n0", "n1", "n2"});
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE(
    "async: after a SIGKILL of every process the cluster resumes at its newest version bit for bit, and a "
    "coordinator taking over right after merges on from it",
    "[process][cluster][async][resume]") {
  const auto dir = scratch_dir("async_resume");
  const auto cluster = equal_nodes_cluster(dir);
  // The takeover below freezes the coordinator through the nodes' start-up. A node that starts more than
  // comm.link_timeout_s after its ring neighbour (a loaded machine) would fail the ring with no coordinator
  // to mend it (a live one fences a new epoch and the adoption is redone); without the timeout the ring
  // waits for it.
  std::ofstream(cluster, std::ios::app) << "\n[comm]\nlink_timeout_s = 0\n";
  const auto out = dir + "/cluster";
  const std::vector<std::string> names{"n0", "n1", "n2"};
  {
    auto [coord, nodes] = start_cluster(dir, cluster, 3);
    CATCH_REQUIRE(wait_master_records(out, "merge", 6, 300));
    CATCH_REQUIRE(wait_until(
        [&] {
          for (const auto& n : names)
            if (checkpoint_count(dir, n) < 2) return false;
          return true;
        },
        300));
    for (auto* c : {&nodes[0], &nodes[1], &nodes[2], &coord}) kill(c->pid, SIGKILL);
    for (auto* c : {&nodes[0], &nodes[1], &nodes[2], &coord}) CATCH_CHECK(wait_exit(*c, 30) == 128 + SIGKILL);
  }
  const auto before = version_crcs(out, names);
  // Each node's newest checkpoint holds some version; the cluster resumes at the newest of them.
  int64_t newest = 0;
  for (const auto& n : names) {
    const auto c = runtime::checkpoint_store(out + "/" + n + "/checkpoints", 100).load_latest();
    CATCH_REQUIRE(c.has_value());
    newest = std::max<int64_t>(newest, version_of(*c));
  }
  CATCH_REQUIRE(newest >= 1);

  auto [first, nodes] = start_cluster(dir, cluster, 3);
  // A takeover right after the resume: the coordinator is frozen once every node has its welcome (before any
  // merge), the nodes adopt the newest version between themselves, and a new coordinator takes the cluster
  // over. It must merge on from that version: the nodes re-announce it, not the state transfer's ring label.
  // The nodes' logs, not the coordinator's: its "nodes joined" line can be written before its socket thread
  // has sent the welcomes, and a SIGSTOP then keeps them from every node.
  require_in_node_logs(dir, names, "joined as rank");
  kill(first.pid, SIGSTOP);
  require_in_node_logs(dir, names, "async: resuming at version");
  kill(first.pid, SIGKILL);
  CATCH_CHECK(wait_exit(first, 30) == 128 + SIGKILL);
  auto coord = spawn({binary(), "coordinator", cluster}, dir + "/coord2.log");
  for (auto& n : nodes) CATCH_CHECK(wait_exit(n, 300) == 0);
  CATCH_CHECK(wait_exit(coord, 60) == 0);
  CATCH_INFO("--- n0\n"
             << tail(read_text(dir + "/n0.log")) << "\n--- coordinator\n"
             << read_text(dir + "/coord2.log"));
  CATCH_CHECK(contains(read_text(dir + "/coord2.log"), "last applied round " + std::to_string(newest) +
                                                           "): taking the running cluster over"));
  // Every node's first record after the restart is the newest version, resumed, with the CRC that version
  // had before the kill.
  for (const auto& n : names) {
    CATCH_INFO("node " << n);
    bool found = false;
    for (const auto& r : records_of(out + "/" + n)) {
      if (std::string(r["kind"].GetString()) != "version" || !r.HasMember("resumed")) continue;
      found = true;
      CATCH_CHECK(at(r, "version").GetInt64() == newest);
      CATCH_REQUIRE(before.count(newest) == 1);
      CATCH_CHECK(before.at(newest).count(str(at(r, "theta_crc32c"))) == 1);
    }
    CATCH_CHECK(found);
  }
  // The resumed run merged on to the last version, one CRC per version across the nodes.
  const auto after = version_crcs(out, names, /*after_resume=*/true);
  CATCH_CHECK(after.begin()->first == newest);
  CATCH_CHECK(after.rbegin()->first == versions);
  check_one_crc_per_version(after);
  check_one_final_theta(out, names);
  // The same checkpoints under another policy: refused, naming both.
  edit_file(cluster, "outer = \"async\"", "outer = \"sync\"");
  auto [code, log] = run({binary(), "launch", cluster}, dir + "/sync.log", 300);
  CATCH_CHECK(code != 0);
  CATCH_CHECK(contains(log, "diloco.outer = \"async\", this run is \"sync\""));
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE(
    "async: a coordinator that takes the cluster over while a merge's all-reduce runs announces that merge "
    "again, and the nodes merge on to the last version on one theta",
    "[process][cluster][async][elastic]") {
  const auto dir = scratch_dir("async_takeover_merge");
  const auto cluster = equal_nodes_cluster(dir);
  // n1's frames of version 4's all-reduce wait for the gate file, so that merge is in flight on every node
  // while its coordinator is killed and another takes over. Without a link timeout the ring waits for them.
  std::ofstream(cluster, std::ios::app) << "\n[comm]\nlink_timeout_s = 0\n";
  const auto gate = dir + "/gate";
  const std::vector<std::string> names{"n0", "n1", "n2"};
  auto [coord, nodes] = start_cluster(dir, cluster, 3, {{}, {"LONGWAVE_FAULT_ALLREDUCE_GATE=4:" + gate}});
  const auto out = dir + "/cluster";
  CATCH_REQUIRE(wait_for_text(dir + "/n1.log", "round 4's frames wait for", 300));
  kill(coord.pid, SIGKILL);
  CATCH_CHECK(wait_exit(coord, 30) == 128 + SIGKILL);
  auto coord2 = spawn({binary(), "coordinator", cluster}, dir + "/coord2.log");
  // The nodes re-announce themselves with version 3 applied and 4 in flight: 4 is announced again, and no
  // merge of the new coordinator's gets its number.
  CATCH_REQUIRE(wait_for_text(dir + "/coord2.log", "merges of versions 4 to 4, not yet applied", 300));
  std::ofstream(gate).put('\n');
  // Then each node's contribution held back since merge 4 is reported again on its welcome (merge 4 told
  // again does not answer it), and merges go on to the last version.
  for (auto& n : nodes) CATCH_CHECK(wait_exit(n, 300) == 0);
  CATCH_CHECK(wait_exit(coord2, 60) == 0);
  CATCH_INFO(cluster_logs(dir, names, "coord2.log"));
  // Every version to the last, each applied by every node with one CRC, and one final theta.
  const auto crcs = version_crcs(out, names);
  CATCH_CHECK(crcs.size() == static_cast<size_t>(versions));
  CATCH_CHECK(crcs.rbegin()->first == versions);
  check_one_crc_per_version(crcs);
  for (const auto& n : names) {
    CATCH_INFO("node " << n);
    std::set<int64_t> applied;
    for (const auto& r : records_of(out + "/" + n))
      if (std::string(r["kind"].GetString()) == "version") applied.insert(at(r, "version").GetInt64());
    CATCH_CHECK(applied.size() == static_cast<size_t>(versions));
    CATCH_CHECK_FALSE(contains(read_text(dir + "/" + n + ".log"), "dropped this node's contribution"));
  }
  check_one_final_theta(out, names);
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE("async: longwave stop ends every node at its own phase's end, and the same command resumes",
                "[process][cluster][async][resume]") {
  const auto dir = scratch_dir("async_stop");
  const auto cluster = equal_nodes_cluster(dir);
  const auto out = dir + "/cluster";
  const std::vector<std::string> names{"n0", "n1", "n2"};
  {
    auto [coord, nodes] = start_cluster(dir, cluster, 3);
    CATCH_REQUIRE(wait_master_records(out, "merge", 4, 300));
    stop_cluster(dir, cluster);
    for (auto& n : nodes) CATCH_CHECK(wait_exit(n, 300) == 0);
    CATCH_CHECK(wait_exit(coord, 60) == 0);
    CATCH_INFO("--- n0\n"
               << tail(read_text(dir + "/n0.log")) << "\n--- coordinator\n"
               << read_text(dir + "/coord.log"));
    check_master_end(out, "stopped", "n0,n1,n2", "");
  }
  // Each node stopped after a phase of its own (a "stop" record), short of the last version, on the versions
  // every node agrees on.
  const auto before = version_crcs(out, names);
  CATCH_REQUIRE(!before.empty());
  CATCH_CHECK(before.rbegin()->first < versions);
  check_one_crc_per_version(before);
  for (const auto& n : names) {
    CATCH_INFO("node " << n);
    CATCH_CHECK(stop_round(out + "/" + n) >= 1);
  }
  // The same command goes on from the newest version a node checkpointed and merges on to the last.
  auto [coord, nodes] = start_cluster(dir, cluster, 3);
  for (auto& n : nodes) CATCH_CHECK(wait_exit(n, 300) == 0);
  CATCH_CHECK(wait_exit(coord, 60) == 0);
  CATCH_INFO("--- n0 after the restart\n" << tail(read_text(dir + "/n0.log")));
  const auto after = version_crcs(out, names, /*after_resume=*/true);
  CATCH_REQUIRE(!after.empty());
  CATCH_CHECK(before.count(after.begin()->first) == 1);  // resumed at a version made before the stop
  CATCH_CHECK(after.rbegin()->first == versions);
  check_one_crc_per_version(after);
  check_one_final_theta(out, names);
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE("async: nodes of different speeds stopped and started again go on from one theta",
                "[process][cluster][async][resume]") {
  // n3 runs 20x slower: at the stop its checkpoints hold far fewer phases (its rounds) than the others'.
  // Each node resumes its own newest checkpoint (none fetches because its phase count is lower), and all
  // step theta by one Delayed Nesterov period.
  const auto dir = scratch_dir("async_uneven_resume");
  cluster_ports ports;
  const auto cluster = slow_node_cluster(dir, ports, 40, "");
  const auto out = dir + "/cluster";
  const std::vector<std::string> names{"n0", "n1", "n2", "n3"};
  {
    auto [coord, nodes] = start_cluster(dir, cluster, 4);
    CATCH_REQUIRE(wait_master_records(out, "merge", 4, 300));
    stop_cluster(dir, cluster);
    for (auto& n : nodes) CATCH_CHECK(wait_exit(n, 300) == 0);
    CATCH_CHECK(wait_exit(coord, 60) == 0);
  }
  const auto before = version_crcs(out, names);
  CATCH_REQUIRE(!before.empty());
  auto [coord, nodes] = start_cluster(dir, cluster, 4);
  for (auto& n : nodes) CATCH_CHECK(wait_exit(n, 600) == 0);
  CATCH_CHECK(wait_exit(coord, 60) == 0);
  const auto clog = read_text(dir + "/coord.log");
  CATCH_INFO("--- coordinator\n" << clog << "\n--- n3\n" << tail(read_text(dir + "/n3.log")));
  CATCH_CHECK_FALSE(contains(clog, "it fetches"));
  CATCH_CHECK_FALSE(contains(clog, "differs between nodes"));
  for (const auto& n : names) {
    CATCH_INFO("node " << n);
    CATCH_CHECK(contains(read_text(dir + "/" + n + ".log"), "moves theta by 1/8 of itself"));
  }
  const auto after = version_crcs(out, names, /*after_resume=*/true);
  CATCH_REQUIRE(!after.empty());
  CATCH_CHECK(after.rbegin()->first == 40);
  check_one_crc_per_version(after);
  check_one_final_theta(out, names);
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE(
    "async: nodes end, keeping their checkpoints, when the coordinator calls the run off or is gone",
    "[process][cluster][async]") {
  // No ring call of an async node is due to fail on it (only merges call the ring, and none comes): without
  // this, they trained on past the run's end, for ever.
  for (const int sig : {SIGINT, SIGKILL}) {
    CATCH_DYNAMIC_SECTION("the coordinator " << (sig == SIGINT ? "stopped with Ctrl-C" : "SIGKILLed")) {
      const auto dir = scratch_dir(sig == SIGINT ? "async_called_off" : "async_orphaned");
      const auto cluster = equal_nodes_cluster(dir);
      edit_file(cluster, "join_timeout_s = ", "quorum_timeout_s = 2\njoin_timeout_s = ");
      auto [coord, nodes] = start_cluster(dir, cluster, 3);
      CATCH_REQUIRE(wait_master_records(dir + "/cluster", "merge", 3, 300));
      CATCH_REQUIRE(kill(coord.pid, sig) == 0);
      CATCH_CHECK(wait_exit(coord, 60) == (sig == SIGINT ? 130 : 128 + SIGKILL));
      for (size_t i = 0; i < nodes.size(); ++i) {
        CATCH_CHECK(wait_exit(nodes[i], 300) == 1);
        const auto log = read_text(dir + "/n" + std::to_string(i) + ".log");
        CATCH_INFO(tail(log));
        CATCH_CHECK(contains(log, sig == SIGINT ? "the cluster was called off" : "no coordinator for "));
        CATCH_CHECK(contains(log, "training failed in phase"));
        CATCH_CHECK(checkpoint_count(dir, "n" + std::to_string(i)) > 0);
      }
      fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
    }
  }
}

CATCH_TEST_CASE(
    "async: after a crash at the run's end, a node whose checkpoint holds the last version hands it to the "
    "others, and every node ends on it",
    "[process][cluster][async][resume]") {
  const auto dir = scratch_dir("async_end_crash");
  const auto cluster = equal_nodes_cluster(dir, 6, /*paced=*/false);
  const auto out = dir + "/cluster";
  const std::vector<std::string> names{"n0", "n1", "n2"};
  {
    auto [coord, nodes] = start_cluster(dir, cluster, 3);
    for (auto& n : nodes) CATCH_REQUIRE(wait_exit(n, 300) == 0);
    CATCH_REQUIRE(wait_exit(coord, 60) == 0);
  }
  // As if n1 and n2 died before they wrote the last version: their checkpoints of it are gone, n0's stays.
  const auto last = newest_theta(out + "/n0/checkpoints");
  for (const auto& n : {"n1", "n2"}) {
    runtime::checkpoint_store store(out + "/" + n + "/checkpoints", 100);
    for (const auto& f : store.list())
      if (version_of(runtime::checkpoint_store::load_file(f)) >= 6) fs::remove(f);
    CATCH_REQUIRE(!store.list().empty());
  }
  auto [coord, nodes] = start_cluster(dir, cluster, 3);
  for (size_t i = 0; i < nodes.size(); ++i) {
    CATCH_INFO(cluster_logs(dir, names));
    CATCH_CHECK(wait_exit(nodes[i], 300) == 0);
  }
  CATCH_CHECK(wait_exit(coord, 60) == 0);
  CATCH_INFO(cluster_logs(dir, names));
  CATCH_CHECK(contains(read_text(dir + "/n0.log"), "holds version 6, the run's last: it hands it to"));
  for (const auto& n : names) {
    CATCH_INFO("node " << n);
    const auto log = read_text(dir + "/" + n + ".log");
    CATCH_CHECK(contains(log, "async: resuming at version 6"));
    CATCH_CHECK(contains(log, "this node ends now"));
    CATCH_CHECK(max_abs_diff(last, newest_theta(out + "/" + n + "/checkpoints")) == 0.0);
  }
  // Once more, every node holding the last version: each ends at once, on it, trains nothing, and keeps the
  // result.json of the session that trained.
  std::map<std::string, std::string> results;
  for (const auto& n : names) {
    fs::rename(dir + "/" + n + ".log", dir + "/" + n + ".2.log");
    results[n] = read_text(out + "/" + n + "/result.json");
    CATCH_CHECK(contains(results[n], "val_loss"));
  }
  auto [coord3, nodes3] = start_cluster(dir, cluster, 3);
  for (auto& n : nodes3) CATCH_CHECK(wait_exit(n, 300) == 0);
  CATCH_CHECK(wait_exit(coord3, 60) == 0);
  for (const auto& n : names) {
    CATCH_INFO("node " << n);
    const auto log = read_text(dir + "/" + n + ".log");
    CATCH_CHECK(contains(log, "this node ends now"));
    CATCH_CHECK(!contains(log, "| step "));  // no progress line: no inner step ran
    CATCH_CHECK(read_text(out + "/" + n + "/result.json") == results[n]);
    CATCH_CHECK(max_abs_diff(last, newest_theta(out + "/" + n + "/checkpoints")) == 0.0);
  }
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}
