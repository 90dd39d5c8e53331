// Client sampling (federated.clients_per_round) and data partitions over the real binary: only the drawn
// workers train each round (their token counts say so), every node of a cluster draws alike and commits the
// same theta, and bad settings exit 2 naming the key.
#include <catch2/catch.hpp>

#include <signal.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/cluster.hpp"
#include "tests/support/json.hpp"
#include "tests/support/process.hpp"

using namespace longwave::test;
namespace fs = std::filesystem;

namespace {

constexpr int64_t steps = 3, batch = 4, seq = 64, rounds = 4;
constexpr int64_t tokens_per_round = steps * batch * seq;

/// The clients each round's log line names: "round R: N of M clients take part: a, b".
std::map<int64_t, std::set<int64_t>> draws_in(const std::string& log) {
  std::map<int64_t, std::set<int64_t>> out;
  const std::regex line(R"(round (\d+): \d+ of \d+ clients take part: ([0-9, ]*[0-9]))");
  for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it) {
    std::set<int64_t> clients;
    std::istringstream list(std::regex_replace((*it)[2].str(), std::regex(","), " "));
    for (int64_t c; list >> c;) clients.insert(c);
    out[std::stoll((*it)[1].str())] = clients;
  }
  return out;
}

/// Each worker's cumulative token count after each round, from the "worker" records of metrics.jsonl.
std::map<int64_t, std::map<int64_t, int64_t>> worker_tokens(const std::string& out_dir) {
  std::map<int64_t, std::map<int64_t, int64_t>> out;  // round -> worker -> tokens
  std::istringstream in(read_text(out_dir + "/metrics.jsonl"));
  for (std::string l; std::getline(in, l);) {
    const auto doc = parse_json(l);
    if (std::string(doc["kind"].GetString()) != "worker") continue;
    out[doc["round"].GetInt64()][doc["worker"].GetInt64()] = doc["tokens"].GetInt64();
  }
  return out;
}

/// The lines of `launch`'s merged output that one node printed (they start with "[name").
std::string lines_from(const std::string& log, const std::string& prefix) {
  std::istringstream in(log);
  std::string out;
  for (std::string l; std::getline(in, l);)
    if (l.rfind(prefix, 0) == 0) out += l + "\n";
  return out;
}

/// A corpus of eight "books" of about 30 KB, a blank line between them.
std::string write_books(const std::string& dir) {
  std::string text;
  for (int b = 0; b < 8; ++b) {
    if (b) text += "\n";
    for (int v = 0; v < 400; ++v)
      text += "Book " + std::to_string(b) + " verse " + std::to_string(v) + ": and the workers trained on.\n";
  }
  const auto path = dir + "/books.txt";
  write_text(path, text);
  return path;
}

std::string single_config(const std::string& dir, const std::string& extra) {
  const auto path = dir + "/run.toml";
  write_text(path, "[run]\nout_dir = \"" + dir +
                       "/run\"\nseed = 5\n[model]\nseq_len = 64\n[train]\nworkers = 4\n"
                       "inner_steps = 3\nrounds = 4\nbatch_size = 4\nwarmup_steps = 2\nthreads = 1\n[outer]\n"
                       "lr = 1.0\nmomentum = 0.0\n[eval]\nevery_rounds = 0\nbatches = 2\n[metrics]\n"
                       "enabled = false\n" +
                       extra);
  return path;
}

/// A cluster file of nodes n0 and n1, two workers each, one client drawn a round (outer.lr 1; without
/// momentum, FedAvg), training `n_rounds` rounds.
std::string sampling_cluster(const std::string& dir, int64_t n_rounds, double momentum = 0.0) {
  cluster_ports ports;
  const auto file =
      cluster_file(dir, {2, 2}, ports,
                   "[metrics]\nenabled = false\n[outer]\nlr = 1.0\nmomentum = " + std::to_string(momentum) +
                       "\n[federated]\nclients_per_round = 1\n[data]\npartition = \"iid\"\n");
  edit_file(file, "rounds = 3", "rounds = " + std::to_string(n_rounds));
  return file;
}

}  // namespace

CATCH_TEST_CASE("Client sampling trains only the drawn workers, and the log names them",
                "[process][federated]") {
  const auto dir = scratch_dir("federated_single");
  const auto cfg = single_config(dir, "[data]\npartition = \"books\"\n[federated]\nclients_per_round = 2\n");
  auto [code, log] = run({binary(), "run", cfg}, dir + "/run.log", 300);
  CATCH_INFO(tail(log));
  CATCH_REQUIRE(code == 0);
  CATCH_CHECK(contains(log, "federated: 2 of 4 clients train each round"));
  CATCH_CHECK(contains(log, "partition books: 4 parts"));
  const auto draws = draws_in(log);
  CATCH_REQUIRE(draws.size() == rounds);
  const auto tokens = worker_tokens(dir + "/run");
  std::set<std::set<int64_t>> distinct;
  for (int64_t r = 1; r <= rounds; ++r) {
    const auto& drawn = draws.at(r);
    CATCH_REQUIRE(drawn.size() == 2);
    distinct.insert(drawn);
    for (int64_t w = 0; w < 4; ++w) {
      const int64_t before = r == 1 ? 0 : tokens.at(r - 1).at(w);
      CATCH_INFO("round " << r << " worker " << w);
      CATCH_CHECK(tokens.at(r).at(w) - before == (drawn.count(w) ? tokens_per_round : 0));
    }
  }
  CATCH_CHECK(distinct.size() > 1);  // the draw changes from round to round
  const auto result = parse_json(read_text(dir + "/run/result.json"));
  CATCH_CHECK(result["tokens"].GetInt64() == rounds * 2 * tokens_per_round);
  CATCH_CHECK(std::isfinite(result["val_loss"].GetDouble()));
  fs::remove_all(dir);
}

CATCH_TEST_CASE("Every node of a cluster draws the same clients and commits the same theta",
                "[process][federated][cluster]") {
  const auto dir = scratch_dir("federated_cluster");
  const auto file = sampling_cluster(dir, rounds);
  auto [code, log] = run({binary(), "launch", file}, dir + "/launch.log", 300);
  CATCH_INFO(tail(log));
  CATCH_REQUIRE(code == 0);
  const auto n0 = draws_in(lines_from(log, "[n0")), n1 = draws_in(lines_from(log, "[n1"));
  CATCH_REQUIRE(n0.size() == rounds);
  CATCH_CHECK(n0 == n1);
  // One client a round, on one node: the other node's workers idle and it only relays.
  int64_t trained = 0;
  for (const char* node : {"n0", "n1"}) {
    const auto t = worker_tokens(dir + "/cluster/" + node);
    for (const auto& [w, n] : t.at(rounds)) trained += n;
  }
  CATCH_CHECK(trained == rounds * tokens_per_round);
  const auto c0 = round_crcs(dir + "/cluster/n0"), c1 = round_crcs(dir + "/cluster/n1");
  CATCH_REQUIRE(c0.size() == rounds);
  CATCH_CHECK(c0 == c1);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "Rounds whose drawn clients are all on a SIGKILLed node leave theta, and the survivor finishes",
    "[process][federated][cluster]") {
  // Every node weighed 0 in such a round: the all-reduce failed, the cluster retried it as a ring failure
  // (blaming the links) and called the run off after four.
  const auto dir = scratch_dir("federated_kill");
  // With momentum, a zero average applied would move theta still: the round must not step at all.
  const auto file = sampling_cluster(dir, 12, 0.9);
  // n1 holds its ring frames of round 4: round 4 is redone without it, and n0 trains rounds 4..12 alone.
  auto c = start_cluster(dir, file, 2, {{}, {"LONGWAVE_FAULT_ALLREDUCE_GATE=4:" + dir + "/never"}});
  CATCH_REQUIRE(wait_for_text(dir + "/n0.log", "round 4: 1 of 4 clients", 240));
  kill(c.second[1].pid, SIGKILL);
  CATCH_CHECK(wait_exit(c.second[1], 30) == 128 + SIGKILL);
  const int code = wait_exit(c.second[0], 300);
  const auto log = read_text(dir + "/n0.log");
  CATCH_INFO(tail(log) << cluster_logs(dir, {"n0", "n1"}));
  CATCH_REQUIRE(code == 0);
  CATCH_CHECK(wait_exit(c.first, 60) == 0);
  const auto draws = draws_in(log);
  const auto crcs = round_crcs(dir + "/cluster/n0");
  CATCH_REQUIRE(crcs.size() == 12);
  // n0 alone from round 4 on: its membership of n0 alone kept round 3's all-reduce.
  int64_t kept = -1;
  for (const auto& r : records_of(dir + "/cluster/n0"))
    if (std::string(r["kind"].GetString()) == "membership" && std::string(r["members"].GetString()) == "n0")
      kept = r["kept_round"].GetInt64();
  CATCH_CHECK(kept == 3);
  int nobody = 0;
  for (int64_t r = 4; r <= 12; ++r) {
    CATCH_INFO("round " << r);
    CATCH_REQUIRE(draws.at(r).size() == 1);
    const bool on_n1 = *draws.at(r).begin() >= 2;  // n1 holds the clients 2 and 3
    const auto said = contains(log, "round " + std::to_string(r) + ": none of the drawn clients");
    CATCH_CHECK(said == on_n1);
    // Nothing averaged: theta_global is the last round's, bit for bit; else the drawn client moved it.
    CATCH_CHECK((crcs.at(r) == crcs.at(r - 1)) == on_n1);
    nobody += on_n1;
  }
  CATCH_CHECK(nobody > 0);  // run.seed = 7 draws n1's clients in some of rounds 4..12
  fs::remove_all(dir);
}

CATCH_TEST_CASE("Bad client sampling and partition settings exit 2 naming the key", "[process][federated]") {
  const auto dir = scratch_dir("federated_bad");
  struct bad_case {
    std::string extra, key;
  };
  const std::vector<bad_case> cases = {
      {"[federated]\nclients_per_round = 5\n", "federated.clients_per_round = 5: the run has 4 clients"},
      {"[federated]\nclients_per_round = 2\n[diloco]\nouter = \"delayed\"\n",
       "federated.clients_per_round = 2: client sampling runs with"},
      {"[data]\npartition = \"chapters\"\n", "data.partition"},
  };
  for (const auto& c : cases) {
    const auto cfg = single_config(dir, c.extra);
    auto [code, log] = run({binary(), "run", cfg, "--fresh"}, dir + "/run.log", 120);
    CATCH_INFO(log);
    CATCH_CHECK(code == 2);
    CATCH_CHECK(contains(log, c.key));
  }
  // Ready shards without a record of where documents start cannot be split into books.
  auto [prep, prep_log] =
      run({binary(), "data", "prepare", write_books(dir), "--out", dir + "/shards"}, dir + "/prep.log", 120);
  CATCH_INFO(prep_log);
  CATCH_REQUIRE(prep == 0);
  CATCH_REQUIRE(fs::exists(dir + "/shards/train.docs"));
  const auto cfg = single_config(dir, "[data]\npath = \"" + dir + "/shards\"\npartition = \"books\"\n");
  auto [ok, ok_log] =
      run({binary(), "run", cfg, "--fresh", "--set", "train.rounds=1"}, dir + "/run.log", 120);
  CATCH_INFO(ok_log);
  CATCH_CHECK(ok == 0);
  fs::remove(dir + "/shards/train.docs");
  auto [code, log] = run({binary(), "run", cfg, "--fresh", "--set", "train.rounds=1"}, dir + "/run.log", 120);
  CATCH_INFO(log);
  CATCH_CHECK(code == 2);
  CATCH_CHECK(contains(log, "data.partition = books needs the documents' starts"));
  fs::remove_all(dir);
}
