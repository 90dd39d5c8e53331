// Cluster files: [cluster] and [[nodes]] next to the shared training config, per-node configs, and one clear
// error naming the key for each kind of bad cluster file.
#include <catch2/catch.hpp>

#include <string>

#include "config/cluster_config.hpp"
#include "config/config_loader.hpp"
#include "config/inert_settings.hpp"

using namespace longwave::config;

namespace {

const std::string good = R"(
[cluster]
id = "lab"
coordinator = "tcp://10.0.0.1:5600"
join_timeout_s = 30

[security]
keys = "keys"

[[nodes]]
name = "a"
endpoint = "tcp://10.0.0.2:5601"
workers = 2

[[nodes]]
name = "b"
endpoint = "tcp://10.0.0.3:5601"
workers = 3
metrics_port = 9000

[run]
out_dir = "runs/lab"
[train]
inner_steps = 7
[comm]
dtype = "int8"
error_feedback = true
)";

/// The message of the config_error parse_cluster throws; fails the test if it accepts the text.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_cluster(text, overrides, "cluster.toml");
  } catch (const config_error& e) {
    CATCH_CHECK(std::string(e.what()).find('\n') == std::string::npos);
    return e.what();
  }
  CATCH_FAIL("parse_cluster accepted: " << text);
  return {};
}

/// The 1-based line of `text` that holds `what`.
int line_of(const std::string& text, const std::string& what) {
  const auto at = text.find(what);
  CATCH_REQUIRE(at != std::string::npos);
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto pos = text.find(from);
  CATCH_REQUIRE(pos != std::string::npos);
  return text.replace(pos, from.size(), to);
}

}  // namespace

CATCH_TEST_CASE("A cluster file gives the nodes, the coordinator and per-node training configs",
                "[config][cluster]") {
  const auto spec = parse_cluster(good, {}, "cluster.toml");
  CATCH_CHECK(spec.id == "lab");
  CATCH_CHECK(spec.cluster_id == cluster_id_of("lab"));
  CATCH_CHECK(spec.cluster_id != cluster_id_of("lab2"));
  CATCH_CHECK(spec.coordinator == "tcp://10.0.0.1:5600");
  CATCH_CHECK(spec.join_timeout_s == 30);
  CATCH_REQUIRE(spec.nodes.size() == 2);
  CATCH_CHECK(spec.train.train.workers == 5);  // the sum over nodes
  CATCH_CHECK(spec.train.train.inner_steps == 7);
  CATCH_CHECK(spec.train.comm.dtype == longwave::config::wire_dtype::int8);
  CATCH_CHECK(spec.train.comm.error_feedback);

  const auto b = node_config(spec, node_index(spec, "b"));
  CATCH_CHECK(b.train.workers == 3);
  CATCH_CHECK(b.run.out_dir == "runs/lab/b");
  CATCH_CHECK(b.metrics.port == 9000);
  const auto a = node_config(spec, 0);
  CATCH_CHECK(a.metrics.port == 9464 + 1);  // [metrics] port + 1 + index when not set
  CATCH_CHECK(worker_offset(spec, 0) == 0);
  CATCH_CHECK(worker_offset(spec, 1) == 2);
  // federated.clients_per_round counts the nodes' workers (it passed --dry-run, and every node failed later).
  CATCH_CHECK_THAT(
      error_of(good, {"federated.clients_per_round=6"}),
      Catch::Matchers::Contains("federated.clients_per_round = 6: the run has 5 clients (workers)"));
  CATCH_CHECK_NOTHROW(parse_cluster(good, {"federated.clients_per_round=5"}, "c"));
  // An open cluster's joiners add data parts the draw does not know: refused here, not after each node's
  // welcome.
  CATCH_CHECK_THAT(
      error_of(good, {"federated.clients_per_round=2", "cluster.open=true"}),
      Catch::Matchers::Contains("federated.clients_per_round = 2: client sampling draws from the "
                                "cluster file's workers, and [cluster] open = true"));
  // One host's ports differ across kinds: a metrics port on a ring or control port failed to bind late.
  // /metrics binds metrics.address: 0.0.0.0 meets every address of the host.
  const std::vector<std::string> all_addresses{"metrics.address=0.0.0.0"};
  const auto same_host = replaced(good, "tcp://10.0.0.3:5601", "tcp://10.0.0.2:5602");
  CATCH_CHECK_THAT(error_of(replaced(same_host, "metrics_port = 9000", "metrics_port = 5601"), all_addresses),
                   Catch::Matchers::Contains("nodes[1].metrics_port: port 5601 on 10.0.0.2 is also "
                                             "nodes[0].endpoint tcp://10.0.0.2:5601"));
  CATCH_CHECK_THAT(error_of(replaced(good, "tcp://10.0.0.2:5601", "tcp://10.0.0.1:9464"), all_addresses),
                   Catch::Matchers::Contains("port 9464 on 10.0.0.1 is also the coordinator's metrics port"));
  // On 127.0.0.1 (the default address) they meet only a host written 127.0.0.1: a cluster on one machine.
  CATCH_CHECK_NOTHROW(
      parse_cluster(replaced(same_host, "metrics_port = 9000", "metrics_port = 5601"), {}, "c"));
  const auto local = replaced(replaced(replaced(good, "tcp://10.0.0.1:5600", "tcp://127.0.0.1:5600"),
                                       "tcp://10.0.0.2:5601", "tcp://127.0.0.1:5601"),
                              "tcp://10.0.0.3:5601", "tcp://127.0.0.1:5602");
  CATCH_CHECK_THAT(error_of(replaced(local, "metrics_port = 9000", "metrics_port = 5601")),
                   Catch::Matchers::Contains("port 5601 on 127.0.0.1 is also nodes[0].endpoint"));
  // An explicit checkpoint.dir is every node's: two nodes on one host would meet on its lock (exit 4 late).
  CATCH_CHECK_THAT(error_of(same_host, {"checkpoint.dir=/data/ck"}),
                   Catch::Matchers::Contains("checkpoint.dir = \"/data/ck\": nodes 'a' and 'b' both run on "
                                             "10.0.0.2 and would share it"));
  CATCH_CHECK_NOTHROW(parse_cluster(good, {"checkpoint.dir=/data/ck"}, "c"));  // hosts of their own
  CATCH_CHECK_NOTHROW(parse_cluster(same_host, {}, "c"));  // unset: run.out_dir/<node>/checkpoints
  // Another host's ports are its own: b's metrics port may be the coordinator's control port.
  CATCH_CHECK_NOTHROW(
      parse_cluster(replaced(good, "metrics_port = 9000", "metrics_port = 5600"), all_addresses, "c"));

  const auto o = parse_cluster(good, {"cluster.join_timeout_s=5", "train.rounds=3", "cluster.id=other"}, "c");
  CATCH_CHECK(o.join_timeout_s == 5);
  CATCH_CHECK(o.train.train.rounds == 3);
  CATCH_CHECK(o.cluster_id == cluster_id_of("other"));
}

CATCH_TEST_CASE("[cluster] membership keys: heartbeat_timeout_s, min_nodes and quorum_timeout_s",
                "[config][cluster]") {
  using Catch::Matchers::Contains;
  const auto d = parse_cluster(good, {}, "cluster.toml");
  CATCH_CHECK(d.heartbeat_timeout_s == 6);  // a silent node leaves the membership after 6 s
  CATCH_CHECK(d.min_nodes == 1);
  CATCH_CHECK(d.quorum_timeout_s == 60);

  const auto set = parse_cluster(replaced(good, "join_timeout_s = 30",
                                          "join_timeout_s = 30\nheartbeat_timeout_s = 3.5\nmin_nodes = 2\n"
                                          "quorum_timeout_s = 15"),
                                 {}, "cluster.toml");
  CATCH_CHECK(set.heartbeat_timeout_s == 3.5);
  CATCH_CHECK(set.min_nodes == 2);
  CATCH_CHECK(set.quorum_timeout_s == 15);
  const auto o = parse_cluster(good, {"cluster.min_nodes=2", "cluster.quorum_timeout_s=5"}, "c");
  CATCH_CHECK(o.min_nodes == 2);
  CATCH_CHECK(o.quorum_timeout_s == 5);

  const auto with = [&](const std::string& line) {
    return error_of(replaced(good, "join_timeout_s = 30", "join_timeout_s = 30\n" + line));
  };
  CATCH_CHECK_THAT(with("min_nodes = 3"),
                   Catch::Matchers::Contains("cluster.min_nodes = 3: the cluster file lists only 2 node(s)"));
  CATCH_CHECK_THAT(with("min_nodes = 0"), Catch::Matchers::Contains("cluster.min_nodes = 0"));
  CATCH_CHECK_THAT(with("quorum_timeout_s = 0"), Catch::Matchers::Contains("cluster.quorum_timeout_s = 0"));
  CATCH_CHECK_THAT(with("heartbeat_timeout_s = -1"),
                   Catch::Matchers::Contains("cluster.heartbeat_timeout_s = -1"));
  CATCH_CHECK_THAT(with("min_node = 2"),
                   Catch::Matchers::Contains("unknown key 'cluster.min_node'") && Contains("min_nodes"));
  CATCH_CHECK_THAT(error_of(good, {"cluster.min_nodes=4"}),
                   Catch::Matchers::Contains("cluster.min_nodes = 4: the cluster file lists only 2 node(s)"));
  // Where the value was set, as the training keys say it (a probe: "(line 1)" for a --set, a line of the
  // file's comments).
  CATCH_CHECK_THAT(with("heartbeat_timeout_s = 2"),
                   Catch::Matchers::EndsWith(
                       "(at cluster.toml:" +
                       std::to_string(line_of(replaced(good, "join_timeout_s = 30",
                                                       "join_timeout_s = 30\nheartbeat_timeout_s = 2"),
                                              "heartbeat_timeout_s = 2")) +
                       ":23)"));
  CATCH_CHECK_THAT(error_of(good, {"cluster.heartbeat_timeout_s=2"}),
                   Catch::Matchers::EndsWith("between two (from --set)"));
}

CATCH_TEST_CASE("async.dn_period = 0 is twice the nodes the cluster file lists, on every node alike",
                "[config][cluster]") {
  // Each node resolved it from its own ring at start-up: a node that started while the ring was smaller
  // stepped theta by another fraction, and the models parted for good.
  const auto async = replaced(good, "[comm]", "[diloco]\nouter = \"async\"\n[comm]");
  CATCH_CHECK(parse_cluster(async, {}, "c").train.async.dn_period == 4);
  CATCH_CHECK(parse_cluster(async, {"async.dn_period=3"}, "c").train.async.dn_period == 3);
  CATCH_CHECK(parse_cluster(good, {}, "c").train.async.dn_period == 0);  // not async: left as it is
  // Resolved before the fingerprint: two nodes of one file agree, and an explicit equal value is the same.
  CATCH_CHECK(training_fingerprint(parse_cluster(async, {}, "c").train) ==
              training_fingerprint(parse_cluster(async, {"async.dn_period=4"}, "c").train));
}

CATCH_TEST_CASE(
    "async: a quorum above the listed nodes is refused, one node and a one-merge async.tokens warned",
    "[config][cluster]") {
  using Catch::Matchers::Contains;
  const auto async = replaced(good, "[comm]", "[diloco]\nouter = \"async\"\n[comm]");
  // It was capped to the live members without a word.
  CATCH_CHECK_THAT(error_of(async, {"async.quorum=3"}),
                   Contains("async.quorum = 3: the cluster file lists only 2 node(s)"));
  CATCH_CHECK_NOTHROW(parse_cluster(async, {"async.quorum=2"}, "c"));
  CATCH_CHECK_NOTHROW(parse_cluster(good, {"async.quorum=3"}, "c"));  // not async: inert, warned below
  CATCH_CHECK_NOTHROW(
      parse_cluster(async, {"async.quorum=3", "cluster.open=true"}, "c"));  // joiners may come

  const auto warnings = [](const std::string& text, const std::vector<std::string>& ov) {
    return cluster_warnings(parse_cluster(text, ov, "c"), keys_set(text, ov));
  };
  CATCH_CHECK(warnings(async, {}).empty());
  const auto inert = warnings(good, {"async.quorum=3"});
  CATCH_REQUIRE(inert.size() == 1);
  CATCH_CHECK_THAT(inert[0], Contains("async.quorum is set") && Contains("no effect"));
  // Node a's phase: 7 inner steps x 8 sequences x 128 tokens x 2 workers = 14336 tokens, the smaller one.
  const auto tokens = warnings(async, {"async.tokens=14336"});
  CATCH_REQUIRE(tokens.size() == 1);
  CATCH_CHECK_THAT(tokens[0], Contains("async.tokens = 14336: one node's phase is already 14336 tokens") &&
                                  Contains("ends at its first merge"));
  CATCH_CHECK(warnings(async, {"async.tokens=14337"}).empty());
  const auto one = replaced(
      async,
      "[[nodes]]\nname = \"b\"\nendpoint = \"tcp://10.0.0.3:5601\"\nworkers = 3\nmetrics_port = 9000\n", "");
  const auto alone = warnings(one, {});
  CATCH_REQUIRE(alone.size() == 1);
  CATCH_CHECK_THAT(alone[0], Contains("a cluster file of one node"));
  CATCH_CHECK(warnings(one, {"cluster.open=true"}).empty());
  CATCH_CHECK(warnings(replaced(one, "outer = \"async\"", "outer = \"sync\""), {}).empty());
}

CATCH_TEST_CASE("a cluster file's train.workers is named as ignored: the nodes set their own workers",
                "[config][cluster]") {
  using Catch::Matchers::Contains;
  const auto warnings = [](const std::string& text, const std::vector<std::string>& ov) {
    return cluster_warnings(parse_cluster(text, ov, "c"), keys_set(text, ov));
  };
  CATCH_CHECK(warnings(good, {}).empty());
  const auto set = warnings(replaced(good, "inner_steps = 7", "inner_steps = 7\nworkers = 4"), {});
  CATCH_REQUIRE(set.size() == 1);
  CATCH_CHECK_THAT(set[0], Contains("train.workers is set") && Contains("it is ignored") &&
                               Contains("the 2 listed node(s) have 5 worker(s) in all"));
  CATCH_CHECK(warnings(good, {"train.workers=4"}).size() == 1);
  CATCH_CHECK(parse_cluster(good, {"train.workers=4"}, "c").train.train.workers == 5);
}

CATCH_TEST_CASE("[cluster] coordinator may list the addresses a coordinator can run at",
                "[config][cluster]") {
  using Catch::Matchers::Contains;
  const auto list = [](const std::string& v) {
    return replaced(good, "coordinator = \"tcp://10.0.0.1:5600\"", "coordinator = " + v);
  };
  const auto two = parse_cluster(list(R"(["tcp://10.0.0.1:5600", "tcp://10.0.0.9:5600"])"), {}, "c");
  CATCH_CHECK(two.coordinators == std::vector<std::string>{"tcp://10.0.0.1:5600", "tcp://10.0.0.9:5600"});
  CATCH_CHECK(two.coordinator == "tcp://10.0.0.1:5600");
  CATCH_CHECK(parse_cluster(good, {}, "c").coordinators == std::vector<std::string>{"tcp://10.0.0.1:5600"});
  CATCH_CHECK_THAT(error_of(list("[]")), Catch::Matchers::Contains("a list of 1 to 8 addresses, got 0"));
  CATCH_CHECK_THAT(error_of(list(R"(["tcp://10.0.0.1:5600", "tcp://10.0.0.1:5600"])")),
                   Catch::Matchers::Contains("twice"));
  CATCH_CHECK_THAT(error_of(list(R"(["tcp://10.0.0.1:5600", 5])")),
                   Catch::Matchers::Contains("cluster.coordinator[1]") && Contains("expected a string"));
  CATCH_CHECK_THAT(error_of(list(R"(["tcp://10.0.0.1:5600", "tcp://10.0.0.2:5601"])")),
                   Catch::Matchers::Contains("this is the coordinator's endpoint"));
}

CATCH_TEST_CASE(
    "[cluster] open lets nodes not in the file join, with open_workers data regions kept for them",
    "[config][cluster]") {
  using Catch::Matchers::Contains;
  const auto closed = parse_cluster(good, {}, "c");
  CATCH_CHECK_FALSE(closed.open);
  CATCH_CHECK(data_partitions(closed) == closed.train.train.workers);
  auto open =
      parse_cluster(replaced(good, "join_timeout_s = 30", "join_timeout_s = 30\nopen = true"), {}, "c");
  CATCH_CHECK(open.open_workers == 4);
  CATCH_CHECK(data_partitions(open) == open.train.train.workers + 4);
  const auto listed = open.nodes.size();
  CATCH_CHECK(add_open_node(open, "late", "tcp://10.0.0.7:5601", 2) == listed);
  for (const char* taken : {"coordinator", "logs", "prometheus"})  // as for a listed node
    CATCH_CHECK_THROWS_WITH(add_open_node(open, taken, "tcp://10.0.0.8:5601", 1),
                            Contains("a name launch uses in run.out_dir"));
  CATCH_CHECK(node_config(open, listed).train.workers == 2);
  CATCH_CHECK_THAT(error_of(replaced(good, "join_timeout_s = 30", "join_timeout_s = 30\nopen_workers = 2")),
                   Catch::Matchers::Contains("only with cluster.open = true"));
  CATCH_CHECK_THAT(error_of(replaced(good, "join_timeout_s = 30", "join_timeout_s = 30\nopen = 1")),
                   Catch::Matchers::Contains("cluster.open: expected true or false"));
  auto again = parse_cluster(good, {}, "c");
  CATCH_CHECK_THROWS_WITH(add_open_node(again, "late", "tcp://10.0.0.7:5601", 1),
                          Contains("open is not true"));
  CATCH_CHECK_THROWS_WITH(add_open_node(open, "x y", "tcp://10.0.0.8:5601", 1), Contains("a node name is"));
  CATCH_CHECK_THROWS_WITH(add_open_node(open, "other", "tcp://10.0.0.7:5601", 1),
                          Contains("node late has it"));
  CATCH_CHECK_THROWS_WITH(add_open_node(open, "other", "tcp://10.0.0.9:5601", 5), Contains("open_workers"));
  CATCH_CHECK_THROWS_WITH(add_open_node(open, "other", open.coordinators.front(), 1),
                          Contains("this is the coordinator's endpoint"));
}

CATCH_TEST_CASE("[[nodes]] device sets one node's train.device, and a bad one names the node's key",
                "[config][cluster]") {
  const auto spec = parse_cluster(replaced(good, "workers = 3\n", "workers = 3\ndevice = \"cuda:1\"\n"), {},
                                  "cluster.toml");
  CATCH_CHECK(node_config(spec, 0).train.device == "cpu");
  CATCH_CHECK(node_config(spec, 1).train.device == "cuda:1");
  // Not part of the fingerprint the coordinator checks: a CPU node and a GPU node train together.
  CATCH_CHECK(training_fingerprint(node_config(spec, 0)) == training_fingerprint(node_config(spec, 1)));
  const auto all = parse_cluster(good, {"train.device=auto"}, "cluster.toml");
  CATCH_CHECK(node_config(all, 0).train.device == "auto");
  CATCH_CHECK(error_of(replaced(good, "workers = 3\n", "workers = 3\ndevice = \"gpu\"\n")) ==
              "config error: nodes[1].device = \"gpu\": allowed values are cpu, cuda, cuda:N (a GPU index) "
              "and auto");
}

CATCH_TEST_CASE(
    "[[nodes]] speed paces one node's inner steps at train.pace_step_s / speed, outside the fingerprint",
    "[config][cluster]") {
  const auto spec = parse_cluster(replaced(good, "workers = 3\n", "workers = 3\nspeed = 0.25\n"),
                                  {"train.pace_step_s=0.2"}, "cluster.toml");
  CATCH_CHECK(node_config(spec, 0).train.paced_step_s() == Approx(0.2));
  CATCH_CHECK(node_config(spec, 1).train.speed == 0.25);
  CATCH_CHECK(node_config(spec, 1).train.paced_step_s() == Approx(0.8));
  // Nodes of different speeds, or a paced cluster and an unpaced one, train together.
  const uint64_t plain = training_fingerprint(parse_cluster(good, {}, "cluster.toml").train);
  CATCH_CHECK(training_fingerprint(node_config(spec, 0)) == plain);
  CATCH_CHECK(training_fingerprint(node_config(spec, 1)) == plain);
  CATCH_CHECK(parse_cluster(good, {}, "cluster.toml").train.train.paced_step_s() == 0);  // not paced
  CATCH_CHECK_THAT(error_of(replaced(good, "workers = 3\n", "workers = 3\nspeed = 0\n")),
                   Catch::Matchers::Contains("nodes[1].speed = 0: must be a number in (0, 1000] (its inner "
                                             "steps take train.pace_step_s / speed seconds)"));
  CATCH_CHECK_THAT(error_of(replaced(good, "workers = 3\n", "workers = 3\nspeed = \"fast\"\n")),
                   Catch::Matchers::Contains("nodes[1].speed: expected a number, got a string"));
  CATCH_CHECK_THAT(error_of(replaced(good, "workers = 3\n", "workers = 3.0\n")),
                   Catch::Matchers::Contains("nodes[1].workers: expected an integer, got a number (write 3 "
                                             "without the decimal point)"));
  CATCH_CHECK_THAT(error_of(good, {"train.pace_step_s=-1"}), Catch::Matchers::Contains("train.pace_step_s"));
}

CATCH_TEST_CASE("Bad cluster files name the key at fault", "[config][cluster]") {
  using Catch::Matchers::Contains;
  for (const char* taken : {"coordinator", "logs", "prometheus"})
    CATCH_CHECK_THAT(
        error_of(replaced(good, "name = \"b\"", std::string("name = \"") + taken + "\"")),
        Contains(std::string("nodes[1].name = \"") + taken + "\": a name launch uses in run.out_dir"));
  CATCH_CHECK_THAT(error_of(replaced(good, "name = \"b\"", "name = \"a\"")),
                   Catch::Matchers::Contains("nodes[1].name = \"a\": another node has this name"));
  CATCH_CHECK_THAT(
      error_of(replaced(good, "tcp://10.0.0.3:5601", "tcp://10.0.0.2:5601")),
      Catch::Matchers::Contains("nodes[1].endpoint") && Contains("another node uses this endpoint"));
  CATCH_CHECK_THAT(error_of(replaced(good, "tcp://10.0.0.3:5601", "10.0.0.3:5601")),
                   Catch::Matchers::Contains("nodes[1].endpoint") && Contains("must be tcp://HOST:PORT"));
  CATCH_CHECK_THAT(error_of(replaced(good, "tcp://10.0.0.3:5601", "tcp://10.0.0.3:99999")),
                   Catch::Matchers::Contains("PORT must be a number in 1..65535"));
  CATCH_CHECK_THAT(error_of(replaced(good, "tcp://10.0.0.1:5600", "tcp://*:5600")),
                   Catch::Matchers::Contains("cluster.coordinator") && Contains("not '*'"));
  // Sockets bind addresses: a host name or IPv6 failed to bind with "No such device", exit 1, after
  // --dry-run passed (binding a name's address is no answer: /etc/hosts maps a machine's own name to
  // 127.0.1.1, which no peer reaches).
  CATCH_CHECK_THAT(error_of(replaced(good, "tcp://10.0.0.3:5601", "tcp://[::1]:5601")),
                   Catch::Matchers::Contains("nodes[1].endpoint") && Contains("IPv6 is not supported"));
  CATCH_CHECK_THAT(error_of(replaced(good, "tcp://10.0.0.3:5601", "tcp://node-b.example:5601")),
                   Catch::Matchers::Contains("HOST 'node-b.example' must be an IPv4 address"));
  CATCH_CHECK_THAT(error_of(replaced(good, "tcp://10.0.0.1:5600", "tcp://localhost:5600")),
                   Catch::Matchers::Contains("cluster.coordinator") && Contains("must be an IPv4 address"));
  CATCH_CHECK_THAT(error_of(replaced(good, "workers = 3", "workers = 0")),
                   Catch::Matchers::Contains("nodes[1].workers = 0: must be an integer in [1, 256]"));
  CATCH_CHECK_THAT(error_of(replaced(good, "workers = 3", "worker = 3")),
                   Catch::Matchers::Contains("unknown key 'nodes[1].worker'"));
  CATCH_CHECK_THAT(error_of(replaced(good, "join_timeout_s = 30", "join_timeout = 30")),
                   Catch::Matchers::Contains("unknown key 'cluster.join_timeout'"));
  CATCH_CHECK_THAT(error_of(replaced(good, "join_timeout_s = 30", "join_timeout_s = -1")),
                   Catch::Matchers::Contains("cluster.join_timeout_s = -1"));
  // Below 1.5 heartbeat periods every live node would be taken for lost between two beats.
  CATCH_CHECK_THAT(
      error_of(replaced(good, "join_timeout_s = 30", "join_timeout_s = 30\nheartbeat_timeout_s = 0.01")),
      Catch::Matchers::Contains("cluster.heartbeat_timeout_s = 0.01: must be at least 3 s"));
  CATCH_CHECK_THAT(error_of(replaced(good, "name = \"a\"", "name = \"a b\"")),
                   Catch::Matchers::Contains("nodes[0].name = \"a b\": use 1..32 letters"));
  CATCH_CHECK_THAT(error_of(replaced(good, "name = \"a\"\n", "")),
                   Catch::Matchers::Contains("nodes[0].name is missing"));
  CATCH_CHECK_THAT(error_of(replaced(good, "metrics_port = 9000", "metrics_port = 9465")),
                   Catch::Matchers::Contains("nodes[1].metrics_port") && Contains("9465"));
  CATCH_CHECK_THAT(
      error_of(replaced(good, "[run]\n", "[run]\nmode = \"ddp\"\n")),
      Catch::Matchers::Contains("run.mode = \"ddp\": a cluster trains with run.mode = \"diloco\""));
  // Single mode would first ask for train.workers = 1, which a cluster file leaves to its nodes.
  CATCH_CHECK_THAT(
      error_of(replaced(good, "[run]\n", "[run]\nmode = \"single\"\n")),
      Catch::Matchers::Contains("run.mode = \"single\": a cluster trains with run.mode = \"diloco\""));
  CATCH_CHECK_THAT(error_of(replaced(good, "dtype = \"int8\"", "dtype = \"int4\"")),
                   Catch::Matchers::Contains("comm.dtype"));
  CATCH_CHECK_THAT(error_of("[cluster]\nid = \"x\"\n"), Catch::Matchers::Contains("no [[nodes]] entries"));
  const auto spec = parse_cluster(good, {}, "cluster.toml");
  try {
    node_index(spec, "zz");
    CATCH_FAIL("node_index accepted an unknown name");
  } catch (const config_error& e) {
    CATCH_CHECK_THAT(std::string(e.what()),
                     Contains("--node zz: the cluster file has no such node (nodes: a, b)"));
  }
}

CATCH_TEST_CASE(
    "The training fingerprint is the same for every node and changes with the math, not the machine",
    "[config]") {
  const auto spec = parse_cluster(good, {}, "cluster.toml");
  const uint64_t f = training_fingerprint(spec.train);
  for (size_t i = 0; i < spec.nodes.size(); ++i) CATCH_CHECK(training_fingerprint(node_config(spec, i)) == f);
  // Per-machine settings do not count...
  for (const char* o : {"train.threads=3", "run.out_dir=/elsewhere", "comm.timeout_s=17",
                        "eval.every_rounds=7", "metrics.enabled=false", "checkpoint.keep=9"})
    CATCH_CHECK(training_fingerprint(parse_cluster(good, {o}, "cluster.toml").train) == f);
  // ...what every node must share does.
  for (const char* o : {"train.lr=0.01", "outer.momentum=0.5", "comm.dtype=bf16", "model.seq_len=32",
                        "diloco.outer=delayed", "run.seed=99", "comm.chunk_kib=64"})
    CATCH_CHECK(training_fingerprint(parse_cluster(good, {o}, "cluster.toml").train) != f);
}

CATCH_TEST_CASE("[security]: CURVE by default with a key directory, mode none must be said, revoked keys",
                "[unit][config][cluster][security]") {
  const auto spec = parse_cluster(good, {}, "cluster.toml");
  CATCH_CHECK(spec.security.mode == security_mode::curve);
  CATCH_CHECK(spec.security.keys == "keys");
  CATCH_CHECK(spec.security.revoked.empty());
  // No keys and no mode: refused, with the way to make keys and the way out.
  const auto keyless = replaced(good, "[security]\nkeys = \"keys\"\n", "");
  const auto why = error_of(keyless);
  CATCH_CHECK_THAT(why, Catch::Matchers::Contains("security.keys: not set"));
  CATCH_CHECK_THAT(why, Catch::Matchers::Contains("longwave keys new"));
  CATCH_CHECK_THAT(why, Catch::Matchers::Contains("mode = \"none\""));
  CATCH_CHECK(parse_cluster(keyless, {"security.mode=none"}, "c").security.mode == security_mode::none);
  CATCH_CHECK(parse_cluster(keyless, {"security.keys=elsewhere"}, "c").security.keys == "elsewhere");
  const auto revoked =
      parse_cluster(replaced(good, "keys = \"keys\"", "keys = \"keys\"\nrevoked = [\"b\", \"c\"]"), {}, "c");
  CATCH_CHECK(revoked.security.revoked == std::vector<std::string>{"b", "c"});
  CATCH_CHECK_THAT(error_of(good, {"security.mode=tls"}),
                   Catch::Matchers::Contains("must be \"curve\" or \"none\""));
  CATCH_CHECK_THAT(error_of(replaced(good, "keys = \"keys\"", "keys = \"keys\"\nallow = 1")),
                   Catch::Matchers::Contains("unknown key 'security.allow'"));
  CATCH_CHECK_THAT(error_of(replaced(good, "keys = \"keys\"", "keys = \"keys\"\nrevoked = \"b\"")),
                   Catch::Matchers::Contains("security.revoked: expected a list"));
  CATCH_CHECK_THAT(error_of(replaced(good, "keys = \"keys\"", "keys = 3")),
                   Catch::Matchers::Contains("security.keys: expected a string"));
  // Security settings are per cluster, not training settings: the fingerprint ignores them.
  CATCH_CHECK(training_fingerprint(parse_cluster(good, {"security.keys=other"}, "c").train) ==
              training_fingerprint(spec.train));
}
