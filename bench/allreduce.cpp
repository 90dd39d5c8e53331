// Ring all-reduce benchmark: N ranks (local processes over loopback, or one rank per process with
// --endpoints/--rank, e.g. inside network namespaces) average --n floats per dtype. Prints time per
// all-reduce, bus bandwidth 2(N-1)/N * wire bytes / time, fp32 goodput (fp32 bytes averaged per second), the
// ratios busbw ÷ link rate (--link-gbit) and busbw ÷ raw ZeroMQ point-to-point bandwidth measured in the same
// run, and each dtype's goodput ÷ fp32's.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "bench/process_usage.hpp"
#include "comm/codec.hpp"
#include "comm/elastic_ring.hpp"
#include "comm/fault_transport.hpp"
#include "comm/ring_allreduce.hpp"
#include "comm/sparse_error_feedback.hpp"
#include "comm/sparse_sum.hpp"
#include "runtime/checksum/crc32c.hpp"
#include "runtime/clock/clock.hpp"
#include "runtime/errors/errors.hpp"
#include "runtime/memory/allocator.hpp"

using namespace longwave;
using namespace longwave::comm;
using namespace longwave::runtime;
using longwave::bench::process_usage;

namespace {

struct settings {
  int ranks = 2;
  size_t n = size_t{64} << 20;
  std::vector<std::string> dtypes = {"fp32", "fp16", "bf16", "int8"};
  bool codebook = false;
  int iters = 5;
  int warmup = 1;
  size_t chunk_bytes = size_t{1} << 20;
  int hwm = ring_options{}.send_hwm;  // messages queued per direction (send and receive)
  int timeout_ms = 120000;
  double link_gbit = 0.0;
  std::vector<std::string> endpoints;  // one rank per process when given
  int rank = -1;
  uint64_t cluster_id = 0x4c57424e;
  bool baseline = true;
  sparse_options sparse;  // dtype "sparse": encode with error feedback, all-gather, rank-ordered mean
};

/// A dtype may name a variant: "int8/elastic" (the cluster's elastic ring, its input copy and confirmation
/// all-reduce included) or "int8/curve" (the plain ring over CURVE-encrypted links).
std::string variant_of(const std::string& dtype) {
  const auto slash = dtype.find('/');
  return slash == std::string::npos ? std::string() : dtype.substr(slash + 1);
}

bool is_elastic(const std::string& dtype) {
  return variant_of(dtype) == "elastic";
}

/// "int8/elastic" -> "int8".
std::string base_dtype(const std::string& dtype) {
  return dtype.substr(0, dtype.find('/'));
}

/// Rank r's CURVE key pair, the same in every process: a secret key is any 32 bytes (Curve25519 clamps it).
curve_key bench_key(int rank) {
  uint8_t secret[32];
  uint64_t x = 0xC0FFEE1234567ull + static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ull;
  for (auto& b : secret) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x >> 24);
  }
  char z85[41] = {};
  zmq_z85_encode(z85, secret, 32);
  curve_key k;
  k.secret_key = std::string(z85, 40);
  k.public_key = public_of(k.secret_key);
  return k;
}

// One timed all-reduce of one rank.
struct sample {
  size_t dtype_index;
  int iter;
  double seconds;
  uint64_t bytes_sent;
  double cpu_seconds;  // this process, all threads (user + system) during the all-reduce
  long minor_faults;   // pages the kernel faulted in for this process during the all-reduce
};

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

constexpr int stream_port_offset = 32;  // dtype d's ring uses port + d

std::string with_port_offset(const std::string& ep, int offset) {
  const auto colon = ep.rfind(':');
  if (colon == std::string::npos) throw std::runtime_error("endpoint without a port: " + ep);
  return ep.substr(0, colon + 1) + std::to_string(std::stoi(ep.substr(colon + 1)) + offset);
}

// Runs every dtype's all-reduces as rank `rank`. Dtype d uses the endpoints' ports + d, so a rank that moves
// on to the next dtype never reaches a peer's previous ring.
std::vector<sample> run_rank(const settings& s, int rank, const std::vector<std::string>& endpoints) {
  std::vector<sample> out;
  std::vector<float> original(s.n), data(s.n);
  uint64_t x = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank + 1);
  for (auto& v : original) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<float>(static_cast<int64_t>(x >> 40) - (int64_t{1} << 23)) * 0x1p-26f;
  }
  for (size_t d = 0; d < s.dtypes.size(); ++d) {
    ring_options o;
    o.dtype = *config::from_string<wire_dtype>(base_dtype(s.dtypes[d]));
    const bool sparse = o.dtype == wire_dtype::sparse;
    if (sparse) o.dtype = wire_dtype::fp32;  // the ring's own dense calls (the barrier token)
    o.codec.int8_codebook = s.codebook;
    o.chunk_bytes = s.chunk_bytes;
    o.send_hwm = o.recv_hwm = s.hwm;
    o.timeout = std::chrono::milliseconds(s.timeout_ms);
    o.cluster_id = s.cluster_id + d;
    // LONGWAVE_FAULT_RING_RATE meters each rank's sends, as on a node (bench/rate_limit.sh compares it with
    // tc tbf).
    if (const auto faults = transport_faults_from_env()) o.transport = with_faults({}, *faults);
    std::vector<std::string> eps;
    for (const auto& ep : endpoints) eps.push_back(with_port_offset(ep, static_cast<int>(d)));
    if (variant_of(s.dtypes[d]) == "curve") {
      for (size_t r = 0; r < eps.size(); ++r)
        o.public_keys.push_back(bench_key(static_cast<int>(r)).public_key);
      o.curve = ring_curve{bench_key(rank), {}};
    }
    // "<dtype>/elastic": the cluster's collective (its input copy and confirmation all-reduce included).
    std::unique_ptr<collective> made;
    if (is_elastic(s.dtypes[d]))
      made = std::make_unique<elastic_ring>(epoch_view{1, static_cast<uint32_t>(rank), eps, eps, {}}, o);
    else
      made = std::make_unique<ring_allreduce>(rank, eps, o);
    collective& ring = *made;
    // Sparse, as the communicator does it: this rank's message through error feedback, every rank's
    // gathered, and their mean in rank order.
    sparse_error_feedback ef(sparse ? s.n : 0, 0.95f);
    std::vector<std::byte> message(sparse ? sparse_encoded_size(s.n, s.sparse) : 0);
    auto reduce = [&](uint64_t round) {
      if (!sparse) return ring.allreduce(round, data.data(), s.n);
      ef.encode(data.data(), s.n, 0, message.data(), s.sparse);
      const auto g = ring.allgather(round, message.data(), message.size());
      std::string why;
      if (!sparse_mean(g, s.n, s.sparse, false, data.data(), &why)) throw std::runtime_error(why);
    };
    for (int it = 0; it < s.warmup + s.iters; ++it) {
      std::copy(original.begin(), original.end(), data.begin());
      // A one-value all-reduce first lines the ranks up (as nccl-tests' barrier), so that no rank's time
      // includes waiting for a peer that is still copying its input.
      float token = 1.0f;
      ring.allreduce(2 * static_cast<uint64_t>(it), &token, 1);
      const uint64_t sent0 = ring.bytes_sent();
      const process_usage u0 = process_usage::now();
      const auto t0 = std::chrono::steady_clock::now();
      reduce(2 * static_cast<uint64_t>(it) + 1);
      const double sec = seconds_since(t0);
      const process_usage u1 = process_usage::now();
      if (it >= s.warmup)
        out.push_back(sample{d, it - s.warmup, sec, ring.bytes_sent() - sent0,
                             u1.cpu_seconds - u0.cpu_seconds, u1.minor_faults - u0.minor_faults});
    }
  }
  return out;
}

// The link's own ceiling in the ring's pattern, measured in the same run: every rank PUSHes as many bytes as
// an fp32 all-reduce sends (2(N-1)/N of the vector, in chunk-sized messages, each a fresh buffer filled by a
// copy, as the ring's) to the next rank while PULLing the same from the previous one; no reduction, no CRC,
// no dependency between receiving and sending. Returns this rank's seconds from the start (every rank has
// heard from its previous one) until it has received everything; the median of up to 3 runs.
double stream_seconds(const settings& s, int rank, const std::vector<std::string>& endpoints) {
  const auto world = static_cast<int>(endpoints.size());
  const size_t total = 2 * static_cast<size_t>(world - 1) * s.n * 4 / static_cast<size_t>(world);
  const size_t msgs = (total + s.chunk_bytes - 1) / s.chunk_bytes;
  zmq::context_t ctx(1);
  zmq::socket_t pull(ctx, zmq::socket_type::pull), push(ctx, zmq::socket_type::push);
  pull.set(zmq::sockopt::rcvhwm, s.hwm);
  push.set(zmq::sockopt::sndhwm, s.hwm);
  push.set(zmq::sockopt::linger, 30000);
  pull.bind(with_port_offset(endpoints[static_cast<size_t>(rank)], stream_port_offset));
  push.connect(with_port_offset(endpoints[static_cast<size_t>((rank + 1) % world)], stream_port_offset));
  std::vector<char> src(s.chunk_bytes, 1);
  std::vector<double> times;
  for (int rep = 0; rep < std::max(1, std::min(s.iters, 3)); ++rep) {
    zmq::message_t m;
    push.send(zmq::str_buffer("ready"));
    if (!pull.recv(m)) throw std::runtime_error("stream baseline: no word from the previous rank");
    const auto t0 = std::chrono::steady_clock::now();
    double seconds = 0.0;
    std::thread rx([&] {  // the socket is used by one thread at a time: this one until the join
      zmq::message_t in;
      for (size_t k = 0; k < msgs; ++k) (void)pull.recv(in);
      seconds = seconds_since(t0);
    });
    for (size_t k = 0; k < msgs; ++k) {
      zmq::message_t out(src.data(), std::min(s.chunk_bytes, total - k * s.chunk_bytes));
      push.send(out, zmq::send_flags::none);
    }
    rx.join();
    times.push_back(seconds);
  }
  return median(times);
}

std::vector<std::string> free_loopback_endpoints(size_t k, int spacing) {
  // Bind k sockets to port 0 together and release them; each rank then uses port .. port + spacing - 1, so
  // also check that the follow-on ports are free (not guaranteed later; a bind failure names the endpoint).
  std::vector<std::string> eps;
  for (int attempt = 0; eps.size() < k && attempt < 1000; ++attempt) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      close(fd);
      continue;
    }
    const int base = ntohs(a.sin_port);
    close(fd);
    bool all_free = base + spacing < 65536;
    for (int p = base + 1; all_free && p < base + spacing; ++p) {
      const int f = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in b{};
      b.sin_family = AF_INET;
      b.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      b.sin_port = htons(static_cast<uint16_t>(p));
      all_free = bind(f, reinterpret_cast<sockaddr*>(&b), sizeof b) == 0;
      close(f);
    }
    const std::string ep = "tcp://127.0.0.1:" + std::to_string(base);
    if (all_free && std::find(eps.begin(), eps.end(), ep) == eps.end()) eps.push_back(ep);
  }
  if (eps.size() < k) throw std::runtime_error("cannot find free loopback ports");
  return eps;
}

// Raw ZeroMQ PUSH -> PULL between two local processes, chunk-sized messages: the loopback "link rate" this
// machine offers, measured in the same run. Returns bytes per second.
double p2p_baseline(size_t bytes, size_t chunk) {
  const auto ep = free_loopback_endpoints(1, 1)[0];
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe");
  const size_t n_msgs = std::max<size_t>(1, bytes / chunk);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    double rate = 0.0;
    try {
      zmq::context_t ctx(1);
      zmq::socket_t pull(ctx, zmq::socket_type::pull);
      pull.set(zmq::sockopt::rcvhwm, 64);
      pull.bind(ep);
      zmq::message_t m;
      (void)pull.recv(m);  // the first message starts the clock
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t i = 1; i < n_msgs; ++i) (void)pull.recv(m);
      const double sec = seconds_since(t0);
      rate = n_msgs > 1 ? static_cast<double>((n_msgs - 1) * chunk) / sec : 0.0;
    } catch (const zmq::error_t&) {
    }
    if (write(fds[1], &rate, sizeof rate) != sizeof rate) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  {
    zmq::context_t ctx(1);
    zmq::socket_t push(ctx, zmq::socket_type::push);
    push.set(zmq::sockopt::sndhwm, 64);
    push.set(zmq::sockopt::linger, 10000);
    push.connect(ep);
    for (size_t i = 0; i < n_msgs; ++i) {
      zmq::message_t m(chunk);
      std::memset(m.data(), static_cast<int>(i), chunk);
      push.send(m, zmq::send_flags::none);
    }
  }
  double rate = 0.0;
  if (read(fds[0], &rate, sizeof rate) != sizeof rate) rate = 0.0;
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  return rate;
}

void print_table(const settings& s, int world, const std::vector<std::vector<sample>>& per_rank, double p2p) {
  std::printf("%-6s %10s %10s %12s %14s %14s", "dtype", "time_ms", "wire_MiB", "busbw_GB/s", "goodput_GB/s",
              "goodput/fp32");
  if (s.link_gbit > 0) std::printf(" %12s", "busbw/link");
  if (p2p > 0) std::printf(" %12s", "busbw/p2p");
  std::printf("\n");
  double fp32_goodput = 0.0;
  double int8_goodput = 0.0;
  double sparse_goodput = 0.0;
  std::map<std::string, double> median_ms;
  for (size_t d = 0; d < s.dtypes.size(); ++d) {
    // Per iteration the slowest rank's time (the all-reduce is done when the last rank is done).
    std::vector<double> times;
    uint64_t wire = 0;
    for (int it = 0; it < s.iters; ++it) {
      double t = 0.0;
      for (const auto& samples : per_rank)
        for (const auto& x : samples)
          if (x.dtype_index == d && x.iter == it) {
            t = std::max(t, x.seconds);
            if (it == 0) wire += x.bytes_sent;
          }
      times.push_back(t);
    }
    const double t = median(times);
    median_ms[s.dtypes[d]] = t * 1e3;
    // Each rank sends 2(N-1)/N of the vector's wire bytes (headers included), so busbw = 2(N-1)/N * wire
    // bytes / t is simply one rank's sent bytes / t (averaged over the ranks whose samples are here).
    const double per_rank_sent = static_cast<double>(wire) / static_cast<double>(per_rank.size());
    const double busbw = per_rank_sent / t;
    const double goodput = static_cast<double>(s.n) * 4.0 / t;
    if (s.dtypes[d] == "fp32") fp32_goodput = goodput;
    char ratio[32] = "-";
    if (fp32_goodput > 0) std::snprintf(ratio, sizeof ratio, "%.3fx", goodput / fp32_goodput);
    if (s.dtypes[d] == "int8") int8_goodput = goodput;
    if (base_dtype(s.dtypes[d]) == "sparse") sparse_goodput = goodput;
    // wire_MiB: one rank's message (an all-gather sends N-1 of them; a ring all-reduce 2(N-1)/N of one).
    const double message_bytes = base_dtype(s.dtypes[d]) == "sparse"
                                     ? per_rank_sent / (world - 1)
                                     : per_rank_sent * world / (2.0 * (world - 1));
    std::printf("%-6s %10.1f %10.3f %12.3f %14.3f %14s", s.dtypes[d].c_str(), t * 1e3,
                message_bytes / (1 << 20), busbw / 1e9, goodput / 1e9, ratio);
    if (s.link_gbit > 0) std::printf(" %12.3f", busbw * 8.0 / (s.link_gbit * 1e9));
    if (p2p > 0) std::printf(" %12.3f", busbw / p2p);
    std::printf("\n       each iteration (ms):");
    for (const double x : times) std::printf(" %.1f", x * 1e3);
    // Process CPU time and page faults per all-reduce, averaged over ranks and iterations: a rank that
    // faults in fresh buffers (malloc handing pages back) costs CPU the other ranks and the kernel need.
    double cpu = 0.0;
    double faults = 0.0;
    size_t k = 0;
    for (const auto& samples : per_rank)
      for (const auto& x : samples)
        if (x.dtype_index == d) {
          cpu += x.cpu_seconds;
          faults += static_cast<double>(x.minor_faults);
          ++k;
        }
    if (k > 0)
      std::printf("\n       per rank and all-reduce: %.3f CPU s, %.0f minor page faults", cpu / k,
                  faults / k);
    std::printf("\n");
  }
  if (fp32_goodput > 0 && int8_goodput > 0)
    std::printf("int8 / fp32 effective goodput (fp32 bytes averaged per second): %.3f\n",
                int8_goodput / fp32_goodput);
  if (int8_goodput > 0 && sparse_goodput > 0)
    std::printf("sparse / int8 effective goodput: %.3f (density %g, %u bits)\n",
                sparse_goodput / int8_goodput, s.sparse.density, s.sparse.value_bits);
  for (const auto& [name, ms] : median_ms)
    if (!variant_of(name).empty() && median_ms.count(base_dtype(name)))
      std::printf("%s / %s time (%s): %.3f\n", name.c_str(), base_dtype(name).c_str(),
                  is_elastic(name) ? "input copy and confirmation all-reduce" : "CURVE-encrypted links",
                  ms / median_ms.at(base_dtype(name)));
}

}  // namespace

int main(int argc, char** argv) {
  const bool fixed_malloc = longwave::runtime::keep_freed_buffers();
  settings s;
  std::string endpoints;
  CLI::App app{"Ring all-reduce benchmark (bus bandwidth, fp32 goodput, ratios per dtype)"};
  app.add_option("--ranks", s.ranks, "ranks as local processes over loopback (ignored with --endpoints)")
      ->check(CLI::Range(2, 64));
  app.add_option("--n", s.n, "floats per all-reduce (suffixes k, M, G: powers of 1024)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--dtypes", s.dtypes, "wire dtypes, in order (fp32 first for the goodput ratio)")
      ->delimiter(',');
  app.add_flag("--codebook", s.codebook, "int8 with the 256-bin codebook instead of a scale");
  app.add_option("--iters", s.iters, "timed all-reduces per dtype")->check(CLI::Range(1, 1000));
  app.add_option("--warmup", s.warmup, "untimed all-reduces per dtype first")->check(CLI::Range(0, 100));
  app.add_option("--chunk-bytes", s.chunk_bytes, "chunk payload size")->transform(CLI::AsSizeValue(false));
  app.add_option("--hwm", s.hwm, "ZeroMQ high-water mark in messages, each direction")
      ->check(CLI::Range(1, 100000));
  app.add_option("--timeout-ms", s.timeout_ms, "no-progress timeout per all-reduce");
  app.add_option("--link-gbit", s.link_gbit, "link rate in Gbit/s, to print busbw / link");
  app.add_option(
      "--endpoints", endpoints,
      "comma-separated bind endpoints of all ranks (dtype d uses port + d); run one rank per process");
  app.add_option("--rank", s.rank, "this process's rank with --endpoints");
  app.add_option("--cluster-id", s.cluster_id, "cluster id (dtype d uses id + d)");
  app.add_option("--density", s.sparse.density, "sparse: kept fraction of each chunk")
      ->check(CLI::Range(1e-6, 1.0));
  app.add_option("--value-bits", s.sparse.value_bits, "sparse: bits per kept value")
      ->check(CLI::IsMember({2, 4}));
  app.add_flag("!--no-baseline", s.baseline,
               "skip the raw ZeroMQ baseline (point-to-point on loopback; ring streams with --endpoints)");
  CLI11_PARSE(app, argc, argv);
  for (const auto& d : s.dtypes) {
    const auto v = variant_of(d);
    if (!config::from_string<wire_dtype>(base_dtype(d)) || !(v.empty() || v == "elastic" || v == "curve")) {
      std::fprintf(
          stderr,
          "bench_allreduce: unknown dtype '%s' (fp32, fp16, bf16, int8, sparse; '/elastic' appended: the "
          "cluster's elastic ring; '/curve': CURVE-encrypted links)\n",
          d.c_str());
      return 2;
    }
  }
  if (!endpoints.empty()) {
    std::stringstream ss(endpoints);
    for (std::string ep; std::getline(ss, ep, ',');) s.endpoints.push_back(ep);
    if (s.rank < 0 || s.rank >= static_cast<int>(s.endpoints.size()) || s.endpoints.size() < 2) {
      std::fprintf(stderr, "bench_allreduce: --endpoints needs at least 2 endpoints and --rank in [0, %zu)\n",
                   s.endpoints.size());
      return 2;
    }
  }
  const int world = s.endpoints.empty() ? s.ranks : static_cast<int>(s.endpoints.size());
  std::printf("bench_allreduce: ranks=%d n=%zu (%.1f MiB fp32) dtypes=", world, s.n, s.n * 4.0 / (1 << 20));
  for (size_t d = 0; d < s.dtypes.size(); ++d) std::printf("%s%s", d ? "," : "", s.dtypes[d].c_str());
  char link[64];
  if (s.link_gbit > 0)
    std::snprintf(link, sizeof link, "%g Gbit/s", s.link_gbit);
  else
    std::snprintf(link, sizeof link, "%s", s.endpoints.empty() ? "loopback" : "not given");
  std::printf(
      "%s chunk_bytes=%zu hwm=%d iters=%d warmup=%d timeout_ms=%d simd=%s crc32c=%s malloc=%s link=%s\n",
      s.codebook ? " (int8 codebook)" : "", s.chunk_bytes, s.hwm, s.iters, s.warmup, s.timeout_ms,
      simd_level(), crc32c_hardware() ? "sse4.2" : "portable", fixed_malloc ? "fixed-thresholds" : "default",
      link);
  if (const char* rate = std::getenv("LONGWAVE_FAULT_RING_RATE"); rate && *rate)
    std::printf("each rank's ring sends are metered at %s bytes/s (LONGWAVE_FAULT_RING_RATE)\n", rate);
  std::fflush(stdout);

  try {
    if (!s.endpoints.empty()) {  // one rank of a distributed run
      double stream_rate = 0.0;
      if (s.baseline && s.n >= static_cast<size_t>(world)) {  // a stream needs something to carry
        const double sec = stream_seconds(s, s.rank, s.endpoints);
        const double bytes = 2.0 * (world - 1) * static_cast<double>(s.n) * 4.0 / world;
        stream_rate = bytes / sec;
        // One line for bench/allreduce_wan.sh: "stream <ms> <GB/s> [<÷ link>]".
        std::printf("stream %10.1f %8.3f", sec * 1e3, stream_rate / 1e9);
        if (s.link_gbit > 0) std::printf(" %8.3f", stream_rate * 8.0 / (s.link_gbit * 1e9));
        std::printf("   (raw ZeroMQ ring streams: %.1f MiB to the next rank while receiving as much)\n",
                    bytes / (1 << 20));
      }
      auto samples = run_rank(s, s.rank, s.endpoints);
      std::printf("rank %d (own times; the slowest rank's are the ring's):\n", s.rank);
      print_table(s, world, {samples}, stream_rate);
      return 0;
    }
    double p2p = 0.0;
    if (s.baseline) {
      p2p = p2p_baseline(std::min<size_t>(s.n * 4, size_t{512} << 20), s.chunk_bytes);
      std::printf("baseline: raw ZeroMQ PUSH->PULL, %zu-byte messages, 2 local processes: %.3f GB/s\n",
                  s.chunk_bytes, p2p / 1e9);
    }
    const auto eps = free_loopback_endpoints(static_cast<size_t>(world), static_cast<int>(s.dtypes.size()));
    std::vector<pid_t> pids;
    std::vector<int> read_fds;
    for (int r = 0; r < world; ++r) {
      int fds[2];
      if (pipe(fds) != 0) throw std::runtime_error("pipe");
      const pid_t pid = fork();  // before this process starts any thread
      if (pid == 0) {
        close(fds[0]);
        int code = 0;
        std::string text;
        try {
          for (const auto& x : run_rank(s, r, eps))
            text += std::to_string(x.dtype_index) + " " + std::to_string(x.iter) + " " +
                    std::to_string(x.seconds) + " " + std::to_string(x.bytes_sent) + " " +
                    std::to_string(x.cpu_seconds) + " " + std::to_string(x.minor_faults) + "\n";
        } catch (const lw_error& e) {
          std::fprintf(stderr, "rank %d: %s: %s\n", r, to_string(e.code()), e.what());
          code = 1;
        }
        const char* p = text.data();
        size_t left = text.size();
        while (left > 0) {
          const ssize_t w = write(fds[1], p, left);
          if (w <= 0) break;
          p += w;
          left -= static_cast<size_t>(w);
        }
        close(fds[1]);
        _exit(code);
      }
      close(fds[1]);
      pids.push_back(pid);
      read_fds.push_back(fds[0]);
    }
    std::vector<std::vector<sample>> per_rank(world);
    bool ok = true;
    for (int r = 0; r < world; ++r) {
      std::string text;
      char buf[4096];
      for (ssize_t got; (got = read(read_fds[r], buf, sizeof buf)) > 0;)
        text.append(buf, static_cast<size_t>(got));
      close(read_fds[r]);
      int status = 0;
      waitpid(pids[r], &status, 0);
      ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      std::istringstream in(text);
      sample x{};
      while (in >> x.dtype_index >> x.iter >> x.seconds >> x.bytes_sent >> x.cpu_seconds >> x.minor_faults)
        per_rank[r].push_back(x);
    }
    if (!ok) {
      std::fprintf(stderr, "bench_allreduce: a rank failed (see above)\n");
      return 1;
    }
    print_table(s, world, per_rank, p2p);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allreduce: %s\n", e.what());
    return 1;
  }
  return 0;
}
