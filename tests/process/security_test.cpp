// Secure clusters (issue 23, part 1): keyed nodes train together over CURVE; a node with no key, a key the
// coordinator does not hold, a revoked key or another cluster's keys is refused with one line on both sides
// (exit 2) while the run goes on; raw sockets that send well-formed frames without the handshake reach no
// validation at all; bad key files stop a role at start with exit 2 naming the file.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <thread>
#include <zmq.hpp>

#include "cluster/envelope.hpp"
#include "config/cluster_config.hpp"
#include "tests/support/cluster.hpp"
#include "tests/support/process.hpp"
#include "tests/support/prom_text.hpp"
#include "tests/support/raw_frames.hpp"

using namespace longwave;
using namespace longwave::test;
namespace fs = std::filesystem;

namespace {

/// One value of a counter at a /metrics port, summed over series whose labels include `label` (or all).
double counter(int port, const std::string& name, const std::pair<std::string, std::string>& label = {}) {
  double v = 0;
  for (const auto& s : parse_prom_text(http_get(port, "/metrics")))
    if (s.name == name && (label.first.empty() || s.labels.at(label.first) == label.second)) v += s.value;
  return v;
}

}  // namespace

CATCH_TEST_CASE(
    "keyed nodes train over CURVE, strangers, revoked and foreign keys are refused with one line each, raw "
    "sockets never reach validation, and the run goes on",
    "[process][cluster][security]") {
  const auto dir = scratch_dir("security_keyed");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1}, ports, "[comm]\ndtype = \"int8\"\n");
  // Endless: the test stops the cluster once the refusals are counted and it trained on.
  edit_file(cluster, "rounds = 3", "rounds = " + std::to_string(endless_rounds));
  edit_file(cluster, "inner_steps = 3", "inner_steps = 10");
  edit_file(cluster, "keys = \"" + dir + "/keys\"", "keys = \"" + dir + "/keys\"\nrevoked = [\"n9\"]");
  edit_file(cluster, "[cluster]\n", "[cluster]\nopen = true\n");
  const auto spec = config::load_cluster_file(cluster, {});
  CATCH_REQUIRE(spec.security.mode == config::security_mode::curve);
  auto [coord, nodes] = start_cluster(dir, cluster, 2);
  CATCH_REQUIRE(wait_until([&] { return has_checkpoint(dir, "n0") && has_checkpoint(dir, "n1"); }, 120));

  // Keys of another cluster: its own cluster.public, and node keys the coordinator never saw.
  const auto other = dir + "/other-keys";
  CATCH_REQUIRE(
      run({binary(), "keys", "new", "--out", other, "--nodes", "n3,n4"}, dir + "/other.log").first == 0);
  // n3's key made for this cluster's coordinator? No: a key pair of its own beside this cluster.public.
  const auto stranger = dir + "/stranger-keys";
  fs::create_directories(stranger + "/nodes");
  fs::copy_file(dir + "/keys/cluster.public", stranger + "/cluster.public");
  for (const char* ext : {".secret", ".public"})
    fs::copy_file(other + "/nodes/n3" + ext, stranger + "/nodes/n3" + ext);
  // The four joiners at once, each its own name (one name's out_dir lock would turn a second away with exit
  // 4); each must be refused within seconds.
  std::vector<child> joiners;
  std::vector<std::string> logs;
  const auto joiner = [&](const std::string& name, const std::string& set) {
    std::vector<std::string> args = {binary(),
                                     "node",
                                     cluster,
                                     "--node",
                                     name,
                                     "--endpoint",
                                     "tcp://127.0.0.1:" + std::to_string(free_port()),
                                     "--workers",
                                     "1"};
    if (!set.empty()) args.insert(args.end(), {"--set", set});
    logs.push_back(dir + "/joiner" + std::to_string(logs.size()) + ".log");
    joiners.push_back(spawn(args, logs.back()));
  };
  joiner("n5", "security.mode=none");
  joiner("n3", "security.keys=" + stranger);
  joiner("n4", "security.keys=" + other);
  joiner("n9", "");
  std::vector<int> codes;
  for (auto& j : joiners) codes.push_back(wait_exit(j, 60));
  const int no_key_code = codes[0], stranger_code = codes[1], foreign_code = codes[2],
            revoked_code = codes[3];
  const auto no_key = read_text(logs[0]), stranger_log = read_text(logs[1]), foreign = read_text(logs[2]),
             revoked = read_text(logs[3]);
  CATCH_INFO(no_key << "\n---\n" << stranger_log << "\n---\n" << foreign << "\n---\n" << revoked);
  CATCH_CHECK(no_key_code == 2);
  CATCH_CHECK(contains(
      no_key, "it runs with CURVE ([security] mode = \"curve\") and this process with mode = \"none\""));
  CATCH_CHECK(stranger_code == 2);
  CATCH_CHECK(contains(stranger_log, "refused this node's CURVE key"));
  CATCH_CHECK(foreign_code == 2);
  CATCH_CHECK(contains(
      foreign, "the coordinator's key is not the cluster.public in this node's [security] keys directory"));
  CATCH_CHECK(revoked_code == 2);
  CATCH_CHECK(contains(revoked, "refused this node's CURVE key"));

  // Raw sockets without the handshake: well-formed chunks to every ring port, a hello to the coordinator.
  // The nodes above were refused already: what the raw sockets bring is counted on top of that.
  const int coord_metrics = static_cast<int>(config::coordinator_metrics_port(spec));
  auto refused = [&](const std::string& reason) {
    return counter(coord_metrics, "longwave_cluster_refused_handshakes_total", {"reason", reason});
  };
  double handshakes_before = 0;
  try {
    handshakes_before = refused("handshake");
  } catch (const std::exception&) {
  }
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0};
  std::thread raw([&] {
    raw_peer peer(ports.ring, spec.coordinator);
    auto& ring = peer.ring;
    auto& control = peer.control;
    cluster::envelope hello;
    hello.cluster_id = spec.cluster_id;
    hello.sender = 0xffffffffu;
    cluster::hello_msg h;
    h.node_name = "n0";
    hello.body = h;
    const auto hello_bytes = cluster::build_envelope(hello);
    while (!stop) {
      for (size_t r = 0; r < ring.size(); ++r) {
        comm::chunk_header c;
        c.cluster_id = spec.cluster_id;
        c.round = 2;
        c.sender = static_cast<uint32_t>((r + 1) % ring.size());
        c.world_size = static_cast<uint32_t>(ring.size());
        c.dtype = comm::wire_dtype::int8;
        c.total_elements = 1000;
        c.element_count = 10;
        c.byte_count = 14;
        c.weight = 1;
        send_frames(ring[r], {comm::build_chunk_header(c), std::vector<std::byte>(14)});
        ++sent;
      }
      (void)control.send(zmq::buffer(hello_bytes.data(), hello_bytes.size()), zmq::send_flags::dontwait);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  // The coordinator counts refused handshakes by reason while the cluster trains; the raw sockets' own
  // refusals come on top of the nodes' (waiting only for counts that were already there let the check run
  // before the raw thread had sent anything, on a loaded machine).
  const bool counted = wait_until(
      [&] {
        try {
          return sent > 0 && refused("handshake") > handshakes_before && refused("revoked") > 0 &&
                 refused("unknown_key") > 0;
        } catch (const std::exception&) {
          return false;
        }
      },
      60);
  double node_rejections = -1;
  try {
    node_rejections = counter(ports.metrics[0], "longwave_comm_rejected_frames_total") +
                      counter(ports.metrics[1], "longwave_comm_rejected_frames_total");
  } catch (const std::exception&) {
  }
  stop = true;
  raw.join();
  const bool trained = wait_more_rounds({dir + "/cluster/n0", dir + "/cluster/n1"}, 2);
  stop_cluster(dir, cluster);
  const int c0 = wait_exit(nodes[0], 300), c1 = wait_exit(nodes[1], 300);
  const int cc = wait_exit(coord, 60);
  const auto clog = read_text(dir + "/coord.log"), n0 = read_text(dir + "/n0.log");
  CATCH_INFO(tail(clog, 8000) << "\n---\n" << tail(n0, 8000));
  CATCH_CHECK(counted);
  CATCH_CHECK(trained);
  CATCH_CHECK(sent > 0);
  // Not one raw frame got as far as validation: the handshake stopped them.
  CATCH_CHECK(node_rejections == 0);
  CATCH_CHECK_FALSE(contains(n0, "comm: dropped a frame"));
  CATCH_CHECK_FALSE(contains(clog, "dropped a control frame"));
  CATCH_CHECK(contains(clog, "is revoked"));
  CATCH_CHECK(contains(clog, "is not one of this cluster's node keys"));
  CATCH_CHECK(contains(clog, "its CURVE handshake failed"));
  CATCH_CHECK(c0 == 0);
  CATCH_CHECK(c1 == 0);
  CATCH_CHECK(cc == 0);
  CATCH_CHECK(max_abs_diff(newest_theta(dir + "/cluster/n0/checkpoints"),
                           newest_theta(dir + "/cluster/n1/checkpoints")) == 0.0);
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}

CATCH_TEST_CASE(
    "key files that are missing or readable by others stop a role at start with exit 2 naming them",
    "[process][cluster][security]") {
  const auto dir = scratch_dir("security_files");
  cluster_ports ports;
  const auto cluster = cluster_file(dir, {1, 1}, ports);
  ::chmod((dir + "/keys/nodes/n0.secret").c_str(), 0644);
  const auto [open_code, open] = run({binary(), "node", cluster, "--node", "n0"}, dir + "/open.log", 30);
  CATCH_INFO(open);
  CATCH_CHECK(open_code == 2);
  CATCH_CHECK(contains(open, dir + "/keys/nodes/n0.secret: permissions 0644"));
  // --dry-run checks the keys too (it passed them, and the real start then failed).
  const auto [dry_code, dry] =
      run({binary(), "node", cluster, "--node", "n0", "--dry-run"}, dir + "/dry.log", 60);
  CATCH_INFO(dry);
  CATCH_CHECK(dry_code == 2);
  CATCH_CHECK(contains(dry, dir + "/keys/nodes/n0.secret: permissions 0644"));
  fs::remove(dir + "/keys/cluster.secret");
  const auto [gone_code, gone] = run({binary(), "coordinator", cluster}, dir + "/gone.log", 30);
  CATCH_INFO(gone);
  CATCH_CHECK(gone_code == 2);
  CATCH_CHECK(contains(gone, dir + "/keys/cluster.secret"));
  // Without [security] keys the cluster file itself is refused, saying how to make keys or opt out.
  edit_file(cluster, "keys = \"" + dir + "/keys\"", "");
  const auto [none_code, none] =
      run({binary(), "node", cluster, "--node", "n1", "--dry-run"}, dir + "/none.log", 30);
  CATCH_INFO(none);
  CATCH_CHECK(none_code == 2);
  CATCH_CHECK(contains(none, "security.keys: not set"));
  // mode = "none" must be said, and is warned about.
  const auto [plain_code, plain] =
      run({binary(), "node", cluster, "--node", "n1", "--dry-run", "--set", "security.mode=none"},
          dir + "/plain.log", 60);
  CATCH_INFO(plain);
  CATCH_CHECK(plain_code == 0);
  CATCH_CHECK(contains(plain, "neither authenticated nor encrypted"));
  // --workers is for a node the file does not list: for a listed one it would be ignored, so it is refused.
  const auto [workers_code, workers] = run({binary(), "node", cluster, "--node", "n1", "--dry-run", "--set",
                                            "security.mode=none", "--workers", "3"},
                                           dir + "/workers.log", 60);
  CATCH_INFO(workers);
  CATCH_CHECK(workers_code == 2);
  CATCH_CHECK(contains(workers, "--workers: node n1 is in the cluster file, which gives its workers"));
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "running nodes whose coordinator comes back with other keys say so, and reconnect once it has the "
    "cluster's keys again",
    "[process][cluster][security][elastic]") {
  const auto dir = scratch_dir("security_rekeyed");
  cluster_ports ports;
  const auto file = cluster_file(dir, {1, 1}, ports, "[metrics]\nenabled = false\n");
  edit_file(file, "rounds = 3", "rounds = " + std::to_string(endless_rounds));
  edit_file(file, "inner_steps = 3", "inner_steps = 20");
  auto [coord, nodes] = start_cluster(dir, file, 2);
  CATCH_REQUIRE(wait_until([&] { return has_checkpoint(dir, "n0") && has_checkpoint(dir, "n1"); }, 120));
  kill(coord.pid, SIGKILL);
  CATCH_CHECK(wait_exit(coord, 30) == 128 + SIGKILL);
  // A coordinator started from the cluster file with the key directory `keys` instead: both nodes say
  // `said`, then it is killed.
  const auto coordinator_with = [&](const std::string& keys, const std::string& said) {
    const auto other = dir + "/cluster-" + keys + ".toml";
    fs::copy_file(file, other);
    edit_file(other, "keys = \"" + dir + "/keys\"", "keys = \"" + dir + "/" + keys + "\"");
    auto wrong = spawn({binary(), "coordinator", other}, dir + "/coord-" + keys + ".log");
    const bool both_said = wait_until(
        [&] {
          return contains(read_text(dir + "/n0.log"), said) && contains(read_text(dir + "/n1.log"), said);
        },
        60);
    CATCH_INFO(tail(read_text(dir + "/n0.log")) << "\n--- coordinator with " << keys << "\n"
                                                << read_text(dir + "/coord-" + keys + ".log"));
    CATCH_CHECK(both_said);
    kill(wrong.pid, SIGKILL);
    CATCH_CHECK(wait_exit(wrong, 30) == 128 + SIGKILL);
  };
  // The same cluster key, but a node directory without n0 and n1: its ZAP handler refuses both.
  fs::copy(dir + "/keys", dir + "/keys-other", fs::copy_options::recursive);
  for (const char* n : {"n0", "n1"}) fs::remove(dir + "/keys-other/nodes/" + std::string(n) + ".public");
  coordinator_with("keys-other", "now refuses this node's CURVE key");
  // Another cluster's keys: it cannot read the nodes' hellos and drops them.
  const auto [foreign_code, foreign_out] =
      run({binary(), "keys", "new", "--out", dir + "/keys-foreign", "--nodes", "n0,n1"},
          dir + "/keys-foreign.log", 60);
  CATCH_REQUIRE(foreign_code == 0);
  coordinator_with("keys-foreign", "drops this node's CURVE hellos");
  // The right coordinator again: the nodes open their sockets again and it takes the running cluster over.
  auto right = spawn({binary(), "coordinator", file}, dir + "/coord2.log");
  CATCH_REQUIRE(wait_master_records(dir + "/cluster", "takeover", 1, 60));
  CATCH_REQUIRE(wait_more_rounds({dir + "/cluster/n0", dir + "/cluster/n1"}, 2));
  stop_cluster(dir, file);
  std::vector<int> codes;
  for (auto& n : nodes) codes.push_back(wait_exit(n, 300));
  const int right_code = wait_exit(right, 60);
  const auto clog = read_text(dir + "/coord2.log");
  CATCH_INFO(clog << "\n--- n0\n" << tail(read_text(dir + "/n0.log")));
  CATCH_CHECK(codes == std::vector<int>{0, 0});
  CATCH_CHECK(right_code == 0);
  check_master_end(dir + "/cluster", "stopped", "n0,n1", "");
  CATCH_CHECK(contains(read_text(dir + "/n0.log"), "connected to the coordinator at"));
  const auto a = round_crcs(dir + "/cluster/n0"), b = round_crcs(dir + "/cluster/n1");
  CATCH_CHECK(a.size() == static_cast<size_t>(stop_round(dir + "/cluster/n0")));
  CATCH_CHECK(a == b);
  fs::remove_all(dir);  // kept only when a REQUIRE stopped the test
}
