// State transfer throughput (cluster/state_server.hpp, cluster/state_fetcher.hpp) and what serving costs the
// serving process.
//   --role local: --peers servers and the joiner in this process, over loopback; prints MB/s.
//   --role serve: one server bound to --bind; a thread doing fixed busy work (standing in for training) runs
//     throughout, and the process reports its iteration rate and longest gap before serving (the 2.5 s before
//     the first chunk) and while serving (from the first chunk to SIGTERM, which the joiner's side
//     sends when its download is over; or to --idle-s after the last chunk queued, or --max-s).
//   --role fetch: downloads from --endpoints; prints MB/s and MB/s ÷ --link-mbit (the joiner's own link).
// bench/state_transfer_wan.sh runs serve and fetch across network namespaces with limited links.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "cluster/state_fetcher.hpp"
#include "cluster/state_server.hpp"
#include "runtime/clock/clock.hpp"
#include "runtime/errors/errors.hpp"

using namespace longwave;
using namespace longwave::comm;
using namespace longwave::cluster;
using clk = std::chrono::steady_clock;

namespace {

volatile std::sig_atomic_t g_terminate = 0;

struct settings {
  std::string role = "local";
  uint64_t bytes = 64ull << 20;
  size_t peers = 1;
  std::string endpoints;
  std::string bind = "tcp://127.0.0.1:5700";
  uint64_t cluster_id = 77;
  size_t chunk_bytes = 1 << 20;
  double link_mbit = 0;
  double idle_s = 60;
  double max_s = 120;
  int repeats = 3;
};

std::shared_ptr<std::vector<std::byte>> make_blob(uint64_t n) {
  auto v = std::make_shared<std::vector<std::byte>>(n);
  std::mt19937_64 rng(42);
  for (uint64_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t x = rng();
    std::memcpy(v->data() + i, &x, 8);
  }
  return v;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const auto end = s.find(',', start);
    const auto piece = s.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!piece.empty()) out.push_back(piece);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

double mb_per_s(uint64_t bytes, double seconds) {
  return static_cast<double>(bytes) / 1e6 / seconds;
}

void print_fetch(const fetched_state& got, const std::vector<std::string>& peers, double link_mbit) {
  const double rate = mb_per_s(got.bytes.size(), got.seconds);
  fmt::print("fetch {:.1f} MiB from {} peer(s) in {:.3f} s: {:.1f} MB/s", got.bytes.size() / 1048576.0,
             peers.size(), got.seconds, rate);
  if (link_mbit > 0) fmt::print(", {:.3f} of the joiner's {:g} Mbit/s link", rate * 8 / link_mbit, link_mbit);
  fmt::print("\n");
  for (size_t i = 0; i < peers.size(); ++i)
    fmt::print("  {} sent {:.1f} MiB\n", peers[i], got.bytes_per_peer[i] / 1048576.0);
  for (auto& d : got.dropped) fmt::print("  dropped {}\n", d);
}

int run_local(const settings& s) {
  auto blob = make_blob(s.bytes);
  std::vector<std::unique_ptr<state_server>> servers;
  std::vector<std::string> peers;
  for (size_t i = 0; i < s.peers; ++i) {
    servers.push_back(std::make_unique<state_server>("tcp://127.0.0.1:*", s.cluster_id));
    servers.back()->publish({1, 0}, 1, blob);
    peers.push_back(servers.back()->endpoint());
  }
  fetch_options opts;
  opts.chunk_bytes = s.chunk_bytes;
  for (int r = 0; r < s.repeats; ++r) {
    auto got = fetch_state(peers, s.cluster_id, opts);
    if (got.bytes != *blob) throw lw_error(errc::corrupt_data, "fetched bytes differ from the served ones");
    print_fetch(got, peers, 0);
  }
  return 0;
}

// A fixed amount of arithmetic per iteration (about a millisecond), standing in for a training step.
uint64_t busy_iteration(std::vector<uint64_t>& buf) {
  uint64_t acc = 0;
  for (int pass = 0; pass < 8; ++pass)
    for (auto& x : buf) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      acc ^= x >> 17;
    }
  return acc;
}

int run_serve(const settings& s) {
  auto blob = make_blob(s.bytes);
  state_server server(s.bind, s.cluster_id);
  server.publish({1, 0}, 1, blob);
  // Iteration end times of the busy thread; the main thread watches bytes_served for the serving window.
  std::vector<clk::time_point> ends;
  ends.reserve(1 << 20);
  std::mutex mu;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> sink{0};
  std::thread busy([&] {
    std::vector<uint64_t> buf(16 << 10, 1);  // 128 KiB: stays in cache
    while (!stop.load(std::memory_order_relaxed)) {
      sink += busy_iteration(buf);
      const auto t = clk::now();
      std::lock_guard<std::mutex> lk(mu);
      if (ends.size() < ends.capacity()) ends.push_back(t);
    }
  });
  std::signal(SIGTERM, [](int) { g_terminate = 1; });
  fmt::print("serving {} at {}\n", s.bytes, server.endpoint());
  std::fflush(stdout);
  const auto t0 = clk::now();
  std::optional<clk::time_point> first, last;
  uint64_t seen = 0;
  while (runtime::seconds_since(t0) < s.max_s) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const uint64_t b = server.bytes_served();
    const auto now = clk::now();
    if (b != seen) {
      if (!first) first = now;
      last = now;
      seen = b;
    }
    if (g_terminate) {
      last = now;  // the joiner is done: serving lasted until now
      break;
    }
    if (last && std::chrono::duration<double>(now - *last).count() > s.idle_s) break;
  }
  stop = true;
  busy.join();
  if (!first) {
    fmt::print("serve: nothing was fetched within {} s\n", s.max_s);
    return 1;
  }
  const auto window = [&](clk::time_point a, clk::time_point b) {
    double max_gap = 0;
    uint64_t n = 0;
    clk::time_point prev{};
    for (auto t : ends) {
      if (t < a || t > b) continue;
      if (n > 0) max_gap = std::max(max_gap, std::chrono::duration<double>(t - prev).count());
      prev = t;
      ++n;
    }
    const double secs = std::chrono::duration<double>(b - a).count();
    return std::pair<double, double>{n / secs, max_gap};
  };
  // The last 2.5 s before serving at most: by then the other serving processes have started up too.
  const auto before_from =
      std::max(t0 + std::chrono::milliseconds(500), *first - std::chrono::milliseconds(2500));
  const auto [rate_before, gap_before] = window(before_from, *first);
  const auto [rate_during, gap_during] = window(*first, *last);
  const double serve_s = std::chrono::duration<double>(*last - *first).count();
  fmt::print("serve: served {:.1f} MiB over {:.2f} s ({:.1f} MB/s)\n", seen / 1048576.0, serve_s,
             mb_per_s(seen, serve_s));
  fmt::print("serve: busy loop {:.1f} it/s before serving, {:.1f} it/s while serving: {:.3f} of before\n",
             rate_before, rate_during, rate_during / rate_before);
  fmt::print("serve: busy loop longest gap {:.1f} ms before serving, {:.1f} ms while serving\n",
             gap_before * 1e3, gap_during * 1e3);
  fmt::print("serve: rejected requests {}\n", server.rejected_total());
  return 0;
}

int run_fetch(const settings& s) {
  const auto peers = split(s.endpoints);
  fetch_options opts;
  opts.chunk_bytes = s.chunk_bytes;
  auto got = fetch_state(peers, s.cluster_id, opts);
  print_fetch(got, peers, s.link_mbit);
  if (got.bytes != *make_blob(s.bytes)) {
    fmt::print("fetch: the bytes differ from the served ones\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"state transfer throughput, and the serving process's stall"};
  settings s;
  app.add_option("--role", s.role, "local, serve or fetch")
      ->check(CLI::IsMember({"local", "serve", "fetch"}));
  app.add_option("--bytes", s.bytes, "state size (suffixes k, M, G: powers of 1024)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--peers", s.peers, "local: serving peers")->check(CLI::Range(1, 16));
  app.add_option("--endpoints", s.endpoints, "fetch: the peers, comma-separated");
  app.add_option("--bind", s.bind, "serve: the endpoint to bind");
  app.add_option("--cluster-id", s.cluster_id, "cluster id");
  app.add_option("--chunk-bytes", s.chunk_bytes, "chunk size")->transform(CLI::AsSizeValue(false));
  app.add_option("--link-mbit", s.link_mbit, "fetch: the joiner's link rate in Mbit/s, to print the ratio");
  app.add_option("--idle-s", s.idle_s, "serve: exit this long after the last byte served");
  app.add_option("--max-s", s.max_s, "serve: exit after this long in any case");
  app.add_option("--repeats", s.repeats, "local: fetches")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  try {
    if (s.role == "serve") return run_serve(s);
    if (s.role == "fetch") return run_fetch(s);
    return run_local(s);
  } catch (const lw_error& e) {
    fmt::print(stderr, "bench_state_transfer: {}\n", e.what());
    return 1;
  }
}
