// Outer-step policies over real processes: a 2-node x 1-worker cluster on loopback trains with each policy
// and wire dtype, each policy at its best outer setting from bench/policy_quality.sh. One test case per run
// checks what its records show; one more compares the runs' losses. int8 on the wire must end within 1.5% of
// fp32 for every policy, and "streaming" within 1.5% of "sync" (the issue's goal, which it meets). "delayed"
// and "eager" miss that goal on runs this short (about +5% and +2.5%, bench/RESULTS.md); for them the test
// guards the measured order: eager closer to sync than delayed, both within a bound. "async" runs to sync's
// token budget; its issue's goal (within 2 % of sync at four nodes) is a bench figure, and here the test
// guards the measured order (within 5 % of sync).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "tests/support/json.hpp"
#include "tests/support/process.hpp"

using namespace longwave::test;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> policies{"sync", "delayed", "eager", "streaming"};
constexpr int64_t rounds = 12;
// One worker a node: every order of the comparison holds as with two (bench/RESULTS.md, "CI's time", session
// 31), in about half the time; the averaging of a node's workers is the cluster and behaviour tests' part.
constexpr int64_t workers_per_node = 1;

/// Each policy's best outer setting at 12 rounds x H=10 in bench/RESULTS.md: {lr, momentum, nesterov}.
/// delayed and eager use heavy-ball momentum -0.5, which offsets their stale average (session 9).
const std::map<std::string, std::array<std::string, 3>> outer_setting{{"sync", {"0.5", "0", "true"}},
                                                                      {"delayed", {"0.7", "-0.5", "false"}},
                                                                      {"eager", {"0.7", "-0.5", "false"}},
                                                                      {"streaming", {"1.0", "0", "true"}},
                                                                      {"async", {"1.0", "0", "true"}}};

// A short run: 120 inner steps per worker, 12 rounds; one torch thread per worker (the model: settings()).
const char* train_sections = R"(seed = 11
[model]
seq_len = 64
[train]
inner_steps = 10
rounds = 12
batch_size = 8
warmup_steps = 10
threads = 1
[eval]
every_rounds = 0
batches = 16
[checkpoint]
every_rounds = 4
)";

/// Writes a 2-node cluster file (workers_per_node each) on free loopback ports; out_dir is dir/run.
std::string cluster_file(const std::string& dir) {
  std::string text = "[cluster]\nid = \"policy-" + fs::path(dir).filename().string() +
                     "\"\ncoordinator = \"tcp://127.0.0.1:" + std::to_string(free_port()) +
                     "\"\nmetrics_port = " + std::to_string(free_port()) + "\n";
  for (int i = 0; i < 2; ++i)
    text += "\n[[nodes]]\nname = \"n" + std::to_string(i) +
            "\"\nendpoint = \"tcp://127.0.0.1:" + std::to_string(free_port()) +
            "\"\nworkers = " + std::to_string(workers_per_node) +
            "\nmetrics_port = " + std::to_string(free_port()) + "\n";
  text += "\n[run]\nout_dir = \"" + dir + "/run\"\n";
  text += train_sections;
  text += curve_keys(dir);
  const auto path = dir + "/cluster.toml";
  write_text(path, text);
  return path;
}

/// The comm.dtype of a run's dtype name: "sparse-shared" is comm.dtype = "sparse" with shared indices.
std::string wire_name(const std::string& dtype) {
  return dtype.substr(0, dtype.find('-'));
}

/// The --set arguments of one run.
std::vector<std::string> settings(const std::string& policy, const std::string& dtype) {
  const auto& [lr, mu, nesterov] = outer_setting.at(policy);
  std::vector<std::string> args;
  for (const auto& kv : {"diloco.outer=" + policy, "comm.dtype=" + wire_name(dtype), "outer.lr=" + lr,
                         "outer.momentum=" + mu, "outer.nesterov=" + nesterov})
    args.insert(args.end(), {"--set", kv});
  if (dtype.rfind("sparse", 0) == 0) {
    // The sparse runs check records, not quality against the others: the mechanics model is enough.
    const auto model = mechanics_model_sets();
    args.insert(args.end(), model.begin(), model.end());
  } else {
    // The comparison's runs: the tiny preset at half its depth, 1.8x faster, keeps every order of the full
    // one (bench/RESULTS.md, "CI's time"); the mechanics model does not (streaming +13 % against sync).
    args.insert(args.end(), {"--set", "model.layers=2"});
  }
  if (policy == "async")
    // Sync's token budget (12 rounds x 2 nodes x 10 steps x 8 x 64) ends the run, not a count of versions;
    // a merge as soon as one node reports (bench/RESULTS.md, issue 39).
    for (const auto* kv : {"train.rounds=100000", "async.tokens=122880", "async.quorum=1",
                           "async.grace_max_s=2", "async.max_staleness=8"})
      args.insert(args.end(), {"--set", kv});
  if (dtype == "sparse-shared")
    // A comb sends a value every 1/density rounds: at 12 rounds it needs a higher density than top-k
    // (bench/RESULTS.md, shared indices: density 0.1 with ef_decay 0 ends below fp32 at 50 rounds).
    args.insert(args.end(), {"--set", "comm.sparse_indices=shared", "--set", "comm.ef_decay=0", "--set",
                             "comm.density=0.1"});
  return args;
}

// ---- results shared between test cases --------------------------------------------------------------------
// ctest runs each test case as its own process. A run publishes n0's result.json in the build tree, named by
// a hash of what decides it (longwave, longwave-torch, the test, config, settings), so the comparison case
// reuses the runs of the same build and launches only what is missing; a rebuilt binary or test never matches
// an older result.

fs::path results_dir() {
  return fs::path(LW_TEST_BINARY_DIR) / "policy-runs";
}

std::string run_name(const std::string& policy, const std::string& dtype) {
  return policy + "-" + dtype;
}

std::string run_key(const std::string& policy, const std::string& dtype) {
  std::string what = train_sections;
  const fs::path front = binary();
  for (const fs::path& bin :
       {front, front.parent_path() / "longwave-torch", fs::read_symlink("/proc/self/exe")})
    what += " " + std::to_string(fs::file_size(bin)) + " " +
            std::to_string(fs::last_write_time(bin).time_since_epoch().count());
  for (const auto& a : settings(policy, dtype)) what += " " + a;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016zx", std::hash<std::string>{}(what));
  return hex;
}

fs::path published_result(const std::string& policy, const std::string& dtype) {
  return results_dir() / (run_name(policy, dtype) + "-" + run_key(policy, dtype) + ".json");
}

/// Copies the run's n0/result.json to its published name (by rename, so a reader never sees half of it),
/// removing what earlier builds published for the same policy and dtype.
void publish(const std::string& policy, const std::string& dtype, const std::string& run_dir) {
  const auto target = published_result(policy, dtype);
  const auto prefix = run_name(policy, dtype) + "-";
  for (const auto& e : fs::directory_iterator(results_dir())) {
    const auto f = e.path().filename().string();
    if (e.is_regular_file() && f.rfind(prefix, 0) == 0 && f.size() == prefix.size() + 21)
      fs::remove(e.path());
  }
  const auto tmp = target.string() + ".tmp" + std::to_string(getpid());
  fs::copy_file(run_dir + "/run/n0/result.json", tmp, fs::copy_options::overwrite_existing);
  fs::rename(tmp, target);
}

/// Launches one run in a fresh folder of its own and publishes its result; returns the folder.
std::string launch(const std::string& policy, const std::string& dtype) {
  const auto name = run_name(policy, dtype);
  const auto dir = (results_dir() / (name + "-run" + std::to_string(getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto args = settings(policy, dtype);
  args.insert(args.begin(), {binary(), "launch", cluster_file(dir), "--fresh"});
  auto [code, log] = run(args, dir + "/launch.log", 900);
  CATCH_INFO(name << "\n" << log);
  CATCH_REQUIRE(code == 0);
  publish(policy, dtype, dir);
  return dir;
}

rapidjson::Document read_json(const std::string& path) {
  try {
    return parse_json(read_text(path));
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

double val_loss(const json& result) {
  const auto& v = at(result, "val_loss");
  CATCH_REQUIRE(v.IsNumber());  // null: no evaluation, or a diverged one
  return v.GetDouble();
}

// ---- one run's records ------------------------------------------------------------------------------------

/// One node's metrics.jsonl, one parsed object per line.
std::vector<rapidjson::Document> read_records(const std::string& path) {
  std::vector<rapidjson::Document> out;
  const auto text = read_text(path);
  size_t begin = 0, line = 1;
  for (size_t end; begin < text.size(); begin = end + 1, ++line) {
    end = std::min(text.find('\n', begin), text.size());
    try {
      out.push_back(parse_json(text.substr(begin, end - begin)));
    } catch (const std::exception& e) {
      throw std::runtime_error(path + ":" + std::to_string(line) + ": " + e.what());
    }
  }
  return out;
}

std::vector<const json*> of_kind(const std::vector<rapidjson::Document>& records, const std::string& kind) {
  std::vector<const json*> out;
  for (const auto& r : records)
    if (str(at(r, "kind")) == kind) out.push_back(&r);
  return out;
}

using ring_label = std::pair<int64_t, int64_t>;  // (round, label)

/// What a policy leaves in the records of a 12-round run.
struct policy_records {
  std::vector<ring_label> allreduces;  ///< every all-reduce's ring label, sorted
  std::vector<int64_t> outer_rounds;   ///< the round of every outer step, sorted
  double staleness = 0;                ///< of every worker record, in rounds
  std::vector<int64_t> exact_labels;   ///< labels that send fp32 whatever comm.dtype is (parameters)
};

/// The given labels of every round 1..12, then `more`, sorted.
std::vector<ring_label> each_round(std::vector<int64_t> labels, std::vector<ring_label> more = {}) {
  for (int64_t r = 1; r <= rounds; ++r)
    for (const auto l : labels) more.emplace_back(r, l);
  std::sort(more.begin(), more.end());
  return more;
}

/// Rounds first..last, each `times` times, then `more`, sorted.
std::vector<int64_t> outer_steps(int64_t first, int64_t last, int times = 1, std::vector<int64_t> more = {}) {
  for (int64_t r = first; r <= last; ++r) more.insert(more.end(), times, r);
  std::sort(more.begin(), more.end());
  return more;
}

// sync: each round's average (label 0) is applied at the end of that round.
const policy_records sync_records{each_round({0}), outer_steps(1, rounds), 0.0, {}};
// delayed: round r's average is applied at the end of round r+1 (workers one round stale); the outer step of
// round 12 is the last average, applied after the last round before the final evaluation.
const policy_records delayed_records{each_round({0}), outer_steps(1, rounds), 1.0, {}};
// eager: as delayed, plus each worker's own fresh pseudo-gradient; after the last round one more eager step
// (13) applies the rest of round 12's average, and the final parameters are the mean of all workers' outer
// parameters: ring label 1 of round 12, in fp32.
const policy_records eager_records{each_round({0}, {{rounds, 1}}), outer_steps(1, rounds + 1), 1.0, {1}};
// streaming (P = 2 fragments, tau = 1 of H = 10): fragment syncs 1 and 2 each round, each an outer step on
// its fragment; after the last round fragment 1 is synced once more (label P+1 = 3).
const policy_records streaming_records{
    each_round({1, 2}, {{rounds, 3}}), outer_steps(1, rounds, 2, {rounds}), 0.1, {}};

/// Launches one run and checks its records on both nodes against what its policy and dtype leave.
void check_run(const std::string& policy, const std::string& dtype, const policy_records& expected) {
  const auto dir = launch(policy, dtype);
  std::vector<double> losses;
  std::vector<std::vector<ring_label>> labels;
  for (const std::string node : {"n0", "n1"}) {
    CATCH_INFO("node " << node);
    const auto result = read_json(dir + "/run/" + node + "/result.json");
    CATCH_CHECK(at(result, "rounds").GetInt64() == rounds);
    CATCH_CHECK(at(result, "inner_steps_per_worker").GetInt64() == rounds * 10);  // H = 10
    losses.push_back(val_loss(result));
    const auto records = read_records(dir + "/run/" + node + "/metrics.jsonl");
    const auto starts = of_kind(records, "start"), ends = of_kind(records, "end");
    CATCH_REQUIRE(starts.size() == 1);
    CATCH_CHECK(str(at(*starts[0], "comm_dtype")) == wire_name(dtype));
    CATCH_CHECK(at(*starts[0], "cluster_workers").GetInt64() == 2 * workers_per_node);
    CATCH_REQUIRE(ends.size() == 1);
    CATCH_CHECK(at(*ends[0], "exit_code").GetInt64() == 0);
    std::vector<ring_label> node_labels;
    int theta0 = 0;  // the fresh start's exact all-reduce of rank 0's theta_0 (round 0, label 1)
    for (const auto* a : of_kind(records, "allreduce")) {
      const int64_t label = at(*a, "label").GetInt64();
      if (at(*a, "round").GetInt64() == 0) {
        ++theta0;
        CATCH_CHECK(label == 1);
        CATCH_CHECK(str(at(*a, "dtype")) == "fp32");
        continue;
      }
      node_labels.emplace_back(at(*a, "round").GetInt64(), label);
      const auto& exact = expected.exact_labels;
      CATCH_INFO("all-reduce of round " << node_labels.back().first << ", label " << label);
      CATCH_CHECK(
          str(at(*a, "dtype")) ==
          (std::count(exact.begin(), exact.end(), label) > 0 ? std::string("fp32") : wire_name(dtype)));
    }
    CATCH_CHECK(theta0 == 1);
    std::sort(node_labels.begin(), node_labels.end());
    CATCH_CHECK(node_labels == expected.allreduces);
    labels.push_back(node_labels);
    std::vector<int64_t> outer;
    for (const auto* o : of_kind(records, "outer")) outer.push_back(at(*o, "round").GetInt64());
    std::sort(outer.begin(), outer.end());
    CATCH_CHECK(outer == expected.outer_rounds);
    const auto workers = of_kind(records, "worker");
    CATCH_CHECK(workers.size() == workers_per_node * rounds);
    for (const auto* w : workers) {
      CATCH_CHECK(at(*w, "staleness").GetDouble() == Approx(expected.staleness));
      // The idle split, measured by the real worker: each part is a time, and they add up to the idle time
      // (a part clamped at 0 only adds).
      double parts = 0;
      for (const char* k : {"load_s", "delta_s", "gaps_s", "boundary_s"}) {
        CATCH_INFO(k);
        CATCH_CHECK(at(*w, k).GetDouble() >= 0);
        parts += at(*w, k).GetDouble();
      }
      CATCH_CHECK(parts >= at(*w, "idle_s").GetDouble() - 1e-9);
      if (at(*w, "gaps_s").GetDouble() > 0 && at(*w, "boundary_s").GetDouble() > 0)
        CATCH_CHECK(parts == Approx(at(*w, "idle_s").GetDouble()).margin(1e-9));
    }
  }
  CATCH_CHECK(losses[0] == losses[1]);  // every node ends with the same theta_global
  // And it trained: the byte model starts at ln 256 = 5.5 (the mechanics model of the sparse runs learns
  // slower: 3.5 to 4.2 after these 120 steps).
  CATCH_CHECK(losses[0] < (dtype.rfind("sparse", 0) == 0 ? 4.8 : 3.5));
  CATCH_CHECK(labels[0] == labels[1]);  // and took part in the same all-reduces
  fs::remove_all(dir);
}

/// The async run: every version on both nodes with one theta CRC, to sync's token budget, one final theta.
void check_async_run() {
  const auto dir = launch("async", "fp32");
  std::vector<double> losses;
  std::map<int64_t, std::set<std::string>> crcs;
  std::vector<int64_t> last;
  for (const std::string node : {"n0", "n1"}) {
    CATCH_INFO("node " << node);
    losses.push_back(val_loss(read_json(dir + "/run/" + node + "/result.json")));
    const auto records = read_records(dir + "/run/" + node + "/metrics.jsonl");
    const auto versions = of_kind(records, "version");
    CATCH_REQUIRE(!versions.empty());
    for (size_t i = 0; i < versions.size(); ++i) {
      CATCH_CHECK(at(*versions[i], "version").GetInt64() == int64_t(i + 1));
      crcs[int64_t(i + 1)].insert(str(at(*versions[i], "theta_crc32c")));
    }
    CATCH_CHECK(at(*versions.back(), "merged_tokens").GetInt64() >= 122880);
    last.push_back(int64_t(versions.size()));
    const auto ends = of_kind(records, "end");
    CATCH_REQUIRE(ends.size() == 1);
    CATCH_CHECK(at(*ends[0], "exit_code").GetInt64() == 0);
  }
  CATCH_CHECK(last[0] == last[1]);
  for (const auto& [v, set] : crcs) {
    CATCH_INFO("version " << v);
    CATCH_CHECK(set.size() == 1);
  }
  CATCH_CHECK(losses[0] == losses[1]);
  CATCH_CHECK(losses[0] < 3.5);
  fs::remove_all(dir);
}

/// A run's val loss: its published result, else a launch of it now.
double loss_of(const std::string& policy, const std::string& dtype) {
  if (!fs::exists(published_result(policy, dtype))) fs::remove_all(launch(policy, dtype));
  return val_loss(read_json(published_result(policy, dtype)));
}

}  // namespace

CATCH_TEST_CASE("policy sync over fp32: one all-reduce per round (label 0), the same theta on both nodes",
                "[process][policy]") {
  check_run("sync", "fp32", sync_records);
}

CATCH_TEST_CASE("policy sync over int8: the round averages go as int8, the same theta on both nodes",
                "[process][policy]") {
  check_run("sync", "int8", sync_records);
}

CATCH_TEST_CASE("policy delayed over fp32: workers one round stale, round 12's average applied after it",
                "[process][policy]") {
  check_run("delayed", "fp32", delayed_records);
}

CATCH_TEST_CASE("policy delayed over int8: workers one round stale, round 12's average applied after it",
                "[process][policy]") {
  check_run("delayed", "int8", delayed_records);
}

CATCH_TEST_CASE(
    "policy eager over fp32: the final parameters are the mean of all workers (label 1 of round 12)",
    "[process][policy]") {
  check_run("eager", "fp32", eager_records);
}

CATCH_TEST_CASE("policy eager over int8: the final mean of the parameters goes as fp32 (label 1 of round 12)",
                "[process][policy]") {
  check_run("eager", "int8", eager_records);
}

CATCH_TEST_CASE(
    "policy streaming over fp32: fragments 1 and 2 each round, fragment 1 again at the end (label 3)",
    "[process][policy]") {
  check_run("streaming", "fp32", streaming_records);
}

CATCH_TEST_CASE(
    "policy streaming over int8: fragments 1 and 2 each round, fragment 1 again at the end (label 3)",
    "[process][policy]") {
  check_run("streaming", "int8", streaming_records);
}

// The sparse codec (comm defaults: 1.56 % of each chunk at 2 bits, error feedback): each node's message is
// all-gathered and every node sums them in rank order, so theta stays the same on both.
CATCH_TEST_CASE("policy sync over sparse: the round averages are gathered, the same theta on both nodes",
                "[process][policy][sparse]") {
  check_run("sync", "sparse", sync_records);
}

CATCH_TEST_CASE("policy delayed over sparse: workers one round stale, the same theta on both nodes",
                "[process][policy][sparse]") {
  check_run("delayed", "sparse", delayed_records);
}

CATCH_TEST_CASE("policy eager over sparse: the final mean of the parameters goes as fp32, not sparse",
                "[process][policy][sparse]") {
  check_run("eager", "sparse", eager_records);
}

CATCH_TEST_CASE("policy streaming over sparse: each fragment gathered with its own residual",
                "[process][policy][sparse]") {
  check_run("streaming", "sparse", streaming_records);
}

// Shared indices (comm.sparse_indices = "shared"): every node sends the same seeded indices, as int8 over the
// dense ring, so the bytes do not grow with the nodes; theta stays the same on both.
CATCH_TEST_CASE(
    "policy sync over sparse with shared indices: the values are ring-summed, the same theta on both",
    "[process][policy][sparse]") {
  check_run("sync", "sparse-shared", sync_records);
}

CATCH_TEST_CASE("policy async over fp32: every version on both nodes with one theta, to sync's token budget",
                "[process][policy][async]") {
  check_async_run();
}

CATCH_TEST_CASE(
    "policy comparison: int8 within 1.5% of fp32, streaming within 1.5% of sync, eager nearer than delayed",
    "[process][policy]") {
  std::map<std::string, double> loss;
  // async at sync's tokens: within 5 % (the measured order; its goal is a four-node bench figure).
  loss["async-fp32"] = loss_of("async", "fp32");
  std::printf("policy test: async-fp32 val loss %.6f\n", loss["async-fp32"]);
  for (const auto& policy : policies)
    for (const std::string dtype : {"fp32", "int8"}) {
      const auto name = run_name(policy, dtype);
      loss[name] = loss_of(policy, dtype);
      std::printf("policy test: %s val loss %.6f\n", name.c_str(), loss[name]);
    }
  // Quantization: int8 within 1.5% of fp32 under the same policy.
  for (const std::string& policy : policies) {
    const double fp32 = loss.at(policy + "-fp32"), int8 = loss.at(policy + "-int8");
    CATCH_INFO(policy << ": int8 " << int8 << " vs fp32 " << fp32);
    CATCH_CHECK(std::abs(int8 - fp32) / fp32 <= 0.015);
  }
  for (const std::string dtype : {"fp32", "int8"}) {
    const double sync = loss.at("sync-" + dtype), delayed = loss.at("delayed-" + dtype),
                 eager = loss.at("eager-" + dtype), streaming = loss.at("streaming-" + dtype);
    CATCH_INFO(dtype << ": sync " << sync << ", delayed " << delayed << ", eager " << eager << ", streaming "
                     << streaming);
    CATCH_CHECK(streaming / sync <= 1.015);  // the issue's convergence goal
    CATCH_CHECK(sync < 2.4);                 // all trained: the byte model starts at ln 256 = 5.5
    CATCH_CHECK(eager < delayed);            // the fresh own pseudo-gradient helps
    CATCH_CHECK(eager / sync < 1.06);
    CATCH_CHECK(delayed / sync < 1.10);
  }
  // async's merges follow the nodes' timing, so its loss spreads with the machine's load: -1.4 to +3.1 % of
  // sync's over 16 runs (+3.1 % inside the whole suite). The guard sits above that spread.
  CATCH_CHECK(loss.at("async-fp32") / loss.at("sync-fp32") < 1.05);
}
