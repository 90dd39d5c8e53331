// Ring all-reduce over real ZeroMQ sockets on loopback, every rank a forked process: exact fp32 averages for
// odd sizes and rings of 1 to 8 ranks, weights, lossy dtypes, a hostile peer sending bad frames, a rank that
// never starts and one that dies. Also the frame, Envelope and CRC-32C checks on their own.
//
// The test process never starts a thread or a ZeroMQ context itself: every ring member is a child forked
// from the single-threaded parent; it builds its own ring_allreduce, writes results to scratch files and
// leaves with _exit.
#include <arpa/inet.h>
#include <capnp/any.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "comm/codec.hpp"
#include "comm/frame.hpp"
#include "comm/ring_allreduce.hpp"
#include "comm/wire.capnp.h"
#include "runtime/checksum/crc32c.hpp"
#include "runtime/errors/errors.hpp"
#include "tests/support/errors.hpp"
#include "tests/support/raw_frames.hpp"

namespace {

using namespace longwave;
using longwave::runtime::crc32c;
using longwave::runtime::crc32c_portable;
using namespace longwave::comm;
namespace fs = std::filesystem;
using ms = std::chrono::milliseconds;

// ---- scratch files ----------------------------------------------------------------------------------------

fs::path scratch(const std::string& name) {
  auto d = fs::temp_directory_path() / ("longwave-ring-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_floats(const fs::path& p, const std::vector<float>& v) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
}

std::vector<float> read_floats(const fs::path& p) {
  std::ifstream in(p, std::ios::binary | std::ios::ate);
  if (!in) return {};
  const auto bytes = static_cast<size_t>(in.tellg());
  std::vector<float> v(bytes / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream(p) << s;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool wait_for_file(const fs::path& p, ms timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!fs::exists(p)) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(ms(5));
  }
  return true;
}

// ---- child processes
// ----------------------------------------------------------------------------------------

constexpr int exit_addr_in_use = 75;  // a child could not bind: the parent retries with other ports
constexpr int exit_exception = 70;

using body_fn = std::function<int()>;

// Runs each body in its own forked process and waits for all of them, SIGKILLing any still running after
// timeout_s. Returns the exit codes (-1: killed).
std::vector<int> run_processes(const std::vector<body_fn>& bodies, double timeout_s) {
  std::vector<pid_t> pids;
  for (const auto& body : bodies) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code = exit_exception;
      try {
        code = body();
      } catch (const lw_error& e) {
        std::fprintf(stderr, "child %d: %s: %s\n", static_cast<int>(getpid()), to_string(e.code()), e.what());
        const bool in_use = e.code() == errc::io_error && std::strstr(e.what(), "in use") != nullptr;
        code = in_use ? exit_addr_in_use : exit_exception;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: %s\n", static_cast<int>(getpid()), e.what());
      }
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(pids.size(), -2);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  size_t left = pids.size();
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    for (size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (codes[i] == -2 && waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --left;
      }
    }
    std::this_thread::sleep_for(ms(5));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (codes[i] != -2) continue;
    kill(pids[i], SIGKILL);
    waitpid(pids[i], nullptr, 0);
    codes[i] = -1;
  }
  return codes;
}

// k distinct free loopback endpoints: bound together to port 0 (the kernel picks distinct ports), then
// released. Another process may take one in between; run_ring retries then.
std::vector<std::string> free_endpoints(size_t k) {
  std::vector<int> fds;
  std::vector<std::string> eps;
  for (size_t i = 0; i < k; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("cannot bind a loopback socket to port 0");
    eps.push_back("tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port)));
    fds.push_back(fd);
  }
  for (int fd : fds) close(fd);
  return eps;
}

// Runs the processes make(endpoints) returns, with n_ports fresh endpoints; again with new ones if a child
// found its port taken.
std::vector<int> run_ring(size_t n_ports,
                          const std::function<std::vector<body_fn>(std::vector<std::string>)>& make,
                          double timeout_s) {
  std::vector<int> codes;
  for (int attempt = 0; attempt < 4; ++attempt) {
    codes = run_processes(make(free_endpoints(n_ports)), timeout_s);
    if (std::find(codes.begin(), codes.end(), exit_addr_in_use) == codes.end()) break;
  }
  return codes;
}

// ---- inputs, rounds and the exact answer
// ----------------------------------------------------------------------

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Rank r's input for a round: uniform in [-1, 1) plus 0.25 r, so the terms neither all cancel nor all agree.
std::vector<float> input(int rank, size_t n, uint64_t round) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t h = splitmix64((round << 44) ^ (uint64_t(rank) << 36) ^ i);
    v[i] =
        static_cast<float>(static_cast<double>(h >> 11) * 0x1p-52 - 1.0) + 0.25f * static_cast<float>(rank);
  }
  return v;
}

struct round_spec {
  uint64_t round;
  uint32_t fragment;
  size_t n;
  bool weighted;
  bool fp32 = false;  ///< this call overrides the ring's dtype with fp32
};

double weight_of(int rank, bool weighted) {
  return weighted ? 0.5 + 0.75 * rank : 1.0;
}

fs::path result_path(const fs::path& dir, const std::string& tag, int rank, const round_spec& s) {
  return dir / (tag + "-r" + std::to_string(rank) + "-" + std::to_string(s.round) + "." +
                std::to_string(s.fragment) + ".bin");
}

// One ring member: runs the rounds in order and writes each result, then its counters to <tag>-r<rank>.txt.
int ring_member(const fs::path& dir, const std::string& tag, int rank, std::vector<std::string> eps,
                ring_options opts, const std::vector<round_spec>& rounds,
                ring_allreduce::reject_callback on_reject = {}) {
  ring_allreduce ring(rank, std::move(eps), opts, std::move(on_reject));
  for (const auto& s : rounds) {
    auto data = input(rank, s.n, s.round * 16 + s.fragment);
    ring.allreduce(s.round, data.data(), s.n, weight_of(rank, s.weighted), s.fragment,
                   s.fp32 ? std::optional{wire_dtype::fp32} : std::nullopt);
    write_floats(result_path(dir, tag, rank, s), data);
  }
  write_text(dir / (tag + "-r" + std::to_string(rank) + ".txt"),
             "rejected " + std::to_string(ring.rejected_frames()) + "\nsent " +
                 std::to_string(ring.bytes_sent()) + "\nreceived " + std::to_string(ring.bytes_received()) +
                 "\n");
  return 0;
}

// How a call ended: "none" if it returned, else the name of its lw_error's code.
template <class Fn>
std::string outcome_of(Fn&& call) {
  return to_string(test::error_of(call));
}

// Where ring member r writes how its call ended, for the parent to check.
fs::path rank_file(const fs::path& dir, int r) {
  return dir / ("r" + std::to_string(r) + ".txt");
}

uint64_t counter(const fs::path& dir, const std::string& tag, int rank, const std::string& name) {
  std::istringstream in(read_text(dir / (tag + "-r" + std::to_string(rank) + ".txt")));
  std::string key;
  uint64_t v = 0;
  while (in >> key >> v)
    if (key == name) return v;
  return ~uint64_t{0};
}

// The largest error allowed at index i, given S_i = sum_r |w_r x_r[i]|, W = sum_r w_r and M = max_i S_i.
using bound_fn = std::function<double(double s_i, double m, double w_total)>;

struct case_check {
  bool all_present = true;
  bool identical = true;
  size_t violations = 0;
  double worst_ratio = 0.0;  // max error / bound
};

// Compares every rank's result of one round with rank 0's (bit for bit) and with the exact average computed
// here in double from the same inputs.
case_check check_round(const fs::path& dir, const std::string& tag, int world, const round_spec& s,
                       const bound_fn& bound) {
  case_check c;
  std::vector<std::vector<float>> got(world);
  for (int r = 0; r < world; ++r) {
    got[r] = read_floats(result_path(dir, tag, r, s));
    if (!fs::exists(result_path(dir, tag, r, s)) || got[r].size() != s.n) c.all_present = false;
  }
  if (!c.all_present) return c;
  for (int r = 1; r < world; ++r)
    if (s.n != 0 && std::memcmp(got[r].data(), got[0].data(), s.n * sizeof(float)) != 0) c.identical = false;
  std::vector<double> sum(s.n, 0.0), mag(s.n, 0.0);
  double w_total = 0.0;
  for (int r = 0; r < world; ++r) {
    const double w = weight_of(r, s.weighted);
    w_total += w;
    const auto x = input(r, s.n, s.round * 16 + s.fragment);
    for (size_t i = 0; i < s.n; ++i) {
      sum[i] += w * x[i];
      mag[i] += std::fabs(w * x[i]);
    }
  }
  const double m = s.n ? *std::max_element(mag.begin(), mag.end()) : 0.0;
  for (size_t i = 0; i < s.n; ++i) {
    const double err = std::fabs(static_cast<double>(got[0][i]) - sum[i] / w_total);
    const double b = bound(mag[i], m, w_total);
    if (!(err <= b)) ++c.violations;
    c.worst_ratio = std::max(c.worst_ratio, err / b);
  }
  return c;
}

// fp32: 1e-6 relative to the size of the averaged terms (S_i / W); relative to the average itself is not
// attainable where the terms cancel.
const bound_fn fp32_bound = [](double s_i, double, double w) { return 1e-6 * s_i / w + 1e-30; };

// Lossy dtypes: the ring encodes each partial sum once per reduce-scatter step (N-1 times) and the average
// once; each encode errs by at most u relative (fp16, bf16) or scale/2 = max|chunk|/254 (int8) or one bin
// width <= 2 max|chunk|/256 (int8 codebook), and every partial sum is bounded by S_i <= M. (N+1) encodes'
// worth plus fp32 rounding is a safe bound.
bound_fn lossy_bound(wire_dtype dt, bool codebook, int world) {
  const double k = world + 1;
  switch (dt) {
    case wire_dtype::fp16:
      return [k](double s_i, double, double w) { return k * 0x1p-11 * s_i / w + 1e-7 + 1e-6 * s_i / w; };
    case wire_dtype::bf16:
      return [k](double s_i, double, double w) { return k * 0x1p-8 * s_i / w + 1e-6 * s_i / w + 1e-30; };
    case wire_dtype::int8:
      if (codebook) return [k](double, double m, double w) { return k * 2.0 * m / 256.0 / w * 1.01 + 1e-30; };
      return [k](double, double m, double w) { return k * m / 254.0 / w * 1.01 + 1e-30; };
    case wire_dtype::fp32:
    case wire_dtype::sparse: break;
  }
  return fp32_bound;
}

ring_options test_options(uint64_t cluster) {
  ring_options o;
  o.chunk_bytes = 4096;  // 1024 fp32 values: a million values make hundreds of chunks per segment
  o.timeout = ms(20000);
  o.cluster_id = cluster;
  return o;
}

std::vector<round_spec> size_rounds(int world) {
  std::vector<round_spec> v;
  uint64_t round = 3;
  for (size_t n :
       {size_t{0}, size_t{1}, size_t{3}, size_t(world - 1), size_t{1000}, size_t{5000}, size_t{1000003}})
    v.push_back({round++, 0, n, false});
  v.push_back({round, 0, 1000, true});
  v.push_back({round, 1, 1000003, true});  // a later fragment of the same round
  v.push_back({round + 5, 0, 7, true});
  return v;
}

}  // namespace

// ---- frames, envelopes and the CRC on their own
// -------------------------------------------------------------

CATCH_TEST_CASE("CRC-32C matches the Castagnoli check value with and without the crc32 instruction",
                "[comm]") {
  const char* check = "123456789";
  CATCH_CHECK(crc32c(check, 9) == 0xE3069283u);
  CATCH_CHECK(crc32c_portable(check, 9) == 0xE3069283u);
  CATCH_CHECK(crc32c(check + 4, 5, crc32c(check, 4)) == 0xE3069283u);
  CATCH_CHECK(crc32c(nullptr, 0) == 0u);
  std::vector<unsigned char> buf((size_t{1} << 20) + 64);
  std::mt19937 rng(7);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  // Sizes around the hardware path's 3 x 256 and 3 x 8192 byte interleaved blocks.
  for (size_t off = 0; off < 9; ++off)
    for (size_t n :
         {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{31}, size_t{33}, size_t{767}, size_t{768},
          size_t{769}, size_t{4096}, size_t{24575}, size_t{24576}, size_t{3 * 24576 + 77}, size_t{1} << 20})
      CATCH_CHECK(crc32c(buf.data() + off, n) == crc32c_portable(buf.data() + off, n));
  // Continuing a CRC across pieces equals one pass.
  const uint32_t whole = crc32c(buf.data(), 100000);
  CATCH_CHECK(crc32c(buf.data() + 30001, 100000 - 30001, crc32c(buf.data(), 30001)) == whole);
}

namespace {

chunk_header sample_header() {
  chunk_header h;
  h.cluster_id = 0xC0FFEE;
  h.epoch = 2;
  h.round = 12;
  h.fragment = 2;
  h.phase = ring_phase::all_gather;
  h.step = 1;
  h.segment = 3;
  h.chunk = 5;
  h.sender = 1;
  h.world_size = 4;
  h.dtype = wire_dtype::fp32;
  h.total_elements = 1000;
  h.element_count = 4;
  h.byte_count = 16;
  h.weight = 2.5;
  return h;
}

chunk_expectation expectation_for(const chunk_header& h) {
  chunk_expectation e;
  e.cluster_id = h.cluster_id;
  e.epoch = h.epoch;
  e.round = h.round;
  e.fragment = h.fragment;
  e.world_size = h.world_size;
  e.total_elements = h.total_elements;
  e.dtype = h.dtype;
  e.sender = h.sender;
  e.phase = h.phase;
  e.step = h.step;
  e.segment = h.segment;
  e.chunk = h.chunk;
  e.element_count = h.element_count;
  e.byte_count = h.byte_count;
  return e;
}

// A header built with Cap'n Proto directly, so fields our builder never writes can be set.
template <class Fn>
std::vector<std::byte> raw_header(const chunk_header& h, Fn&& tweak) {
  capnp::MallocMessageBuilder mb;
  auto w = mb.initRoot<wire::ChunkHeader>();
  w.setProtocolVersion(protocol_version());
  w.setClusterId(h.cluster_id);
  w.setRound(h.round);
  w.setFragment(h.fragment);
  w.setPhase(static_cast<wire::Phase>(h.phase));
  w.setStep(h.step);
  w.setSegment(h.segment);
  w.setChunk(h.chunk);
  w.setSender(h.sender);
  w.setWorldSize(h.world_size);
  w.setDtype(static_cast<wire::Dtype>(h.dtype));
  w.setTotalElements(h.total_elements);
  w.setElementCount(h.element_count);
  w.setByteCount(h.byte_count);
  w.setChecksum(h.checksum);
  w.setWeight(h.weight);
  w.setEpoch(h.epoch);
  tweak(w);
  auto words = capnp::messageToFlatArray(mb);
  auto bytes = words.asBytes();
  std::vector<std::byte> out(bytes.size());
  std::memcpy(out.data(), bytes.begin(), bytes.size());
  return out;
}

reject_reason parse_reason(const std::vector<std::byte>& f) {
  auto r = parse_chunk_header(f.data(), f.size());
  return r ? reject_reason::bad_payload : r.error().reason;  // bad_payload: "parsed fine" in these checks
}

}  // namespace

CATCH_TEST_CASE("a chunk header round-trips and each wrong field is rejected with its reason", "[comm]") {
  const float payload[4] = {1.f, -2.f, 3.5f, 0.f};
  chunk_header h = sample_header();
  h.checksum = crc32c(payload, sizeof payload);
  const auto frame = build_chunk_header(h);
  CATCH_CHECK(frame.size() % 8 == 0);
  CATCH_CHECK(frame.size() <= max_chunk_header_bytes);
  const auto e = expectation_for(h);
  auto ok = validate_chunk(frame.data(), frame.size(), payload, sizeof payload, e);
  CATCH_REQUIRE(ok.ok());
  const auto& p = ok.value();
  CATCH_CHECK(p.cluster_id == h.cluster_id);
  CATCH_CHECK(p.epoch == 2);
  CATCH_CHECK(p.round == h.round);
  CATCH_CHECK(p.fragment == h.fragment);
  CATCH_CHECK(p.phase == h.phase);
  CATCH_CHECK((p.step == 1 && p.segment == 3 && p.chunk == 5 && p.sender == 1 && p.world_size == 4));
  CATCH_CHECK((p.total_elements == 1000 && p.element_count == 4 && p.byte_count == 16));
  CATCH_CHECK(p.checksum == h.checksum);
  CATCH_CHECK(p.weight == 2.5);

  // Each mutation of the header, checked against the unchanged expectation.
  auto reason_with = [&](auto&& mutate, const void* pl = nullptr, size_t pl_size = 16) {
    chunk_header m = h;
    mutate(m);
    const auto f = build_chunk_header(m);
    auto r = validate_chunk(f.data(), f.size(), pl ? pl : payload, pl_size, e);
    return r ? std::string("accepted") : std::string(to_string(r.error().reason));
  };
  CATCH_CHECK(reason_with([](chunk_header& m) { m.cluster_id = 1; }) == "wrong_cluster");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.epoch = 3; }) == "wrong_epoch");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.epoch = 1; }) == "wrong_epoch");
  // Epoch is checked after the cluster and before the round.
  CATCH_CHECK(reason_with([](chunk_header& m) {
                m.epoch = 3;
                m.cluster_id = 1;
              }) == "wrong_cluster");
  CATCH_CHECK(reason_with([](chunk_header& m) {
                m.epoch = 3;
                m.round = 11;
              }) == "wrong_epoch");
  {
    chunk_header m = h;
    m.epoch = 3;
    const auto r = check_chunk(m, payload, sizeof payload, e);
    CATCH_REQUIRE(r.has_value());
    CATCH_CHECK(r->message() == "wrong_epoch: epoch 3, this ring is in epoch 2");
  }
  CATCH_CHECK(reason_with([](chunk_header& m) { m.round = 11; }) == "wrong_round");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.fragment = 1; }) == "wrong_round");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.sender = 2; }) == "wrong_sender");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.step = 0; }) == "wrong_step");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.phase = ring_phase::reduce_scatter; }) == "wrong_step");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.segment = 0; }) == "wrong_step");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.chunk = 6; }) == "wrong_step");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.dtype = wire_dtype::fp16; }) == "bad_dtype");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.world_size = 5; }) == "bad_size");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.total_elements = 999; }) == "bad_size");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.element_count = 3; }) == "bad_size");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.checksum ^= 1; }) == "bad_checksum");
  CATCH_CHECK(reason_with([](chunk_header&) {}, payload, 12) == "truncated");
  const float longer[5] = {};
  CATCH_CHECK(reason_with([](chunk_header&) {}, longer, 20) == "bad_size");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.byte_count = 20; }, longer, 20) == "bad_size");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.weight = std::nan(""); }) == "malformed");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.weight = -1.0; }) == "malformed");
  CATCH_CHECK(reason_with([](chunk_header& m) { m.element_count = 2000; }) == "bad_size");

  chunk_header later = h;
  later.round = 13;
  CATCH_CHECK(is_later_round(later, e));
  later.round = 12;
  later.fragment = 3;
  CATCH_CHECK(is_later_round(later, e));
  CATCH_CHECK_FALSE(is_later_round(h, e));
  // A later round of another epoch or cluster is not kept for later: it is rejected.
  later.epoch = 3;
  CATCH_CHECK_FALSE(is_later_round(later, e));
  later.epoch = h.epoch;
  later.cluster_id = 1;
  CATCH_CHECK_FALSE(is_later_round(later, e));
}

CATCH_TEST_CASE("malformed header frames are rejected without throwing", "[comm]") {
  const chunk_header h = sample_header();
  const auto good = build_chunk_header(h);
  CATCH_CHECK(parse_reason({}) == reject_reason::truncated);
  CATCH_CHECK(parse_reason(std::vector<std::byte>(7)) == reject_reason::truncated);
  CATCH_CHECK(parse_reason(std::vector<std::byte>(13)) == reject_reason::bad_size);
  CATCH_CHECK(parse_reason(std::vector<std::byte>(max_chunk_header_bytes + 8)) == reject_reason::bad_size);
  auto cut = good;
  cut.resize(cut.size() - 8);
  CATCH_CHECK(parse_reason(cut) == reject_reason::truncated);
  auto longer = good;
  longer.resize(longer.size() + 8);
  CATCH_CHECK(parse_reason(longer) == reject_reason::bad_size);
  // One segment of one word whose root pointer is a capability pointer, not a struct.
  std::vector<std::byte> bogus(16, std::byte{0xff});
  const uint32_t table[2] = {0, 1};
  std::memcpy(bogus.data(), table, 8);
  CATCH_CHECK(parse_reason(bogus) == reject_reason::malformed);
  // A segment table claiming 100 segments.
  std::vector<std::byte> many(64);
  const uint32_t n_seg = 99;
  std::memcpy(many.data(), &n_seg, 4);
  CATCH_CHECK(parse_reason(many) == reject_reason::malformed);
  CATCH_CHECK(parse_reason(raw_header(h, [](auto& w) { w.setProtocolVersion(protocol_version() + 1); })) ==
              reject_reason::bad_version);
  CATCH_CHECK(parse_reason(raw_header(h, [](auto& w) { w.setDtype(static_cast<wire::Dtype>(9)); })) ==
              reject_reason::bad_dtype);
  CATCH_CHECK(parse_reason(raw_header(h, [](auto& w) { w.setPhase(static_cast<wire::Phase>(4)); })) ==
              reject_reason::malformed);
  CATCH_CHECK(parse_reason(raw_header(h, [](auto& w) { w.setWorldSize(0); })) == reject_reason::malformed);
  // A root that is a text, not a struct: Cap'n Proto throws, parse reports it.
  {
    capnp::MallocMessageBuilder mb;
    mb.getRoot<capnp::AnyPointer>().setAs<capnp::Text>("not a header, definitely not a header at all");
    auto words = capnp::messageToFlatArray(mb);
    std::vector<std::byte> f(words.asBytes().size());
    std::memcpy(f.data(), words.asBytes().begin(), f.size());
    auto r = parse_chunk_header(f.data(), f.size());
    CATCH_CHECK_FALSE(r.ok());
  }
  // Random frames and bit flips of a valid one: every outcome is a value, never a crash or an exception. A
  // random frame never passes (it would need, among others, our 16-bit protocol version); a flip of a valid
  // header may (it changes a field's value), but not every one does (flips in the segment table or a
  // pointer).
  std::mt19937_64 rng(42);
  size_t parsed = 0, random_parsed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> f;
    if (i % 2 == 0) {
      f.resize(8 * (rng() % 24));
      for (auto& b : f) b = static_cast<std::byte>(rng());
      if (f.size() >= 8 && i % 4 == 0) std::memset(f.data(), 0, 4);  // one segment: reach the decoder
    } else {
      f = good;
      for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k)
        f[rng() % f.size()] ^= static_cast<std::byte>(1u << (rng() % 8));
    }
    auto r = parse_chunk_header(f.data(), f.size());
    if (r) ++parsed;
    if (r && i % 2 == 0) ++random_parsed;
  }
  CATCH_CHECK(random_parsed == 0);
  CATCH_CHECK(parsed < 10000);  // some bit flips are refused
}

CATCH_TEST_CASE("allreduce refuses an old round, a bad weight and bad ring arguments", "[comm]") {
  // One rank: no transport, no thread, so this runs in the test process itself.
  ring_options o;
  ring_allreduce solo(0, {"tcp://127.0.0.1:1"}, o);
  std::vector<float> x = {1.f, 2.f, 3.f};
  CATCH_CHECK(solo.completed_round() == 0);
  solo.allreduce(5, x.data(), x.size(), 3.0);
  CATCH_CHECK(x == std::vector<float>({1.f, 2.f, 3.f}));
  CATCH_CHECK(solo.completed_round() == 5);  // what the node's heartbeats report
  auto code_of = [](auto&& fn) {
    try {
      fn();
    } catch (const lw_error& e) {
      return e.code();
    }
    return errc::none;
  };
  CATCH_CHECK(code_of([&] { solo.allreduce(5, x.data(), x.size()); }) == errc::stale_round);
  CATCH_CHECK(code_of([&] { solo.allreduce(4, x.data(), x.size()); }) == errc::stale_round);
  CATCH_CHECK(code_of([&] { solo.allreduce(5, x.data(), x.size(), 1.0, 1); }) == errc::none);
  CATCH_CHECK(code_of([&] { solo.allreduce(6, x.data(), x.size(), -1.0); }) == errc::invalid_config);
  CATCH_CHECK(code_of([&] { solo.allreduce(7, x.data(), x.size(), std::nan("")); }) == errc::invalid_config);
  CATCH_CHECK(solo.completed_round() == 5);  // failed calls do not count
  // Every rank of weight 0: zeros, total weight 0 (the caller decides).
  CATCH_CHECK(code_of([&] { solo.allreduce(7, x.data(), x.size(), 0.0); }) == errc::none);
  CATCH_CHECK(x == std::vector<float>(3, 0.0f));
  CATCH_CHECK(solo.last_total_weight() == 0.0);
  CATCH_CHECK(code_of([&] { solo.allreduce(8, nullptr, 0); }) == errc::none);
  CATCH_CHECK(code_of([&] {
                ring_allreduce(2, {"tcp://127.0.0.1:1", "tcp://127.0.0.1:2"}, o);
              }) == errc::invalid_config);
  CATCH_CHECK(code_of([&] { ring_allreduce(0, {}, o); }) == errc::invalid_config);
  CATCH_CHECK(code_of([&] { ring_allreduce(0, {"tcp://127.0.0.1:1", ""}, o); }) == errc::invalid_config);
  CATCH_CHECK(code_of([&] {
                ring_allreduce(0, {"tcp://127.0.0.1:1", "tcp://127.0.0.1:1"}, o);
              }) == errc::invalid_config);
  ring_options zero_chunk;
  zero_chunk.chunk_bytes = 0;
  CATCH_CHECK(code_of([&] { ring_allreduce(0, {"tcp://127.0.0.1:1"}, zero_chunk); }) == errc::invalid_config);

  // One rank with a lossy dtype returns what the wire would carry: decode(encode(x)) per chunk.
  ring_options half;
  half.dtype = wire_dtype::fp16;
  half.chunk_bytes = 64;
  ring_allreduce solo16(0, {"tcp://127.0.0.1:1"}, half);
  auto y = input(0, 100, 1);
  auto expect = y;
  for (size_t off = 0; off < y.size(); off += 32) {
    const size_t cnt = std::min<size_t>(32, y.size() - off);
    std::vector<std::byte> buf(encoded_size(wire_dtype::fp16, cnt));
    encode(wire_dtype::fp16, y.data() + off, cnt, buf.data());
    CATCH_REQUIRE(decode(wire_dtype::fp16, buf.data(), buf.size(), cnt, expect.data() + off));
  }
  solo16.allreduce(1, y.data(), y.size());
  CATCH_CHECK(y == expect);
}

CATCH_TEST_CASE("a ring endpoint that is already bound fails construction with io_error", "[comm]") {
  auto codes =
      run_processes({[] {
                      auto ep = free_endpoints(1)[0];
                      const uint16_t port = static_cast<uint16_t>(std::stoi(ep.substr(ep.rfind(':') + 1)));
                      const int fd = socket(AF_INET, SOCK_STREAM, 0);
                      sockaddr_in a{};
                      a.sin_family = AF_INET;
                      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
                      a.sin_port = htons(port);
                      if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 1) != 0)
                        return 3;
                      try {
                        ring_allreduce r(0, {ep, "tcp://127.0.0.1:1"}, ring_options{});
                      } catch (const lw_error& e) {
                        return e.code() == errc::io_error && std::strstr(e.what(), ep.c_str()) ? 0 : 4;
                      }
                      return 5;
                    }},
                    30);
  CATCH_CHECK(codes[0] == 0);
}

// ---- rings of processes
// ---------------------------------------------------------------------------------------

CATCH_TEST_CASE("fp32 ring all-reduce gives the exact average, bit-identical on every rank, for 1 to 8 ranks",
                "[comm]") {
  for (int world : {1, 2, 3, 4, 5, 8}) {
    CATCH_INFO("world " << world);
    const auto dir = scratch("fp32-" + std::to_string(world));
    const auto rounds = size_rounds(world);
    auto codes = run_ring(
        world,
        [&](std::vector<std::string> eps) {
          std::vector<body_fn> bodies;
          for (int r = 0; r < world; ++r)
            bodies.push_back([=] { return ring_member(dir, "fp32", r, eps, test_options(0xA11), rounds); });
          return bodies;
        },
        120);
    for (int r = 0; r < world; ++r) CATCH_CHECK(codes[r] == 0);
    for (const auto& s : rounds) {
      CATCH_INFO("round " << s.round << " fragment " << s.fragment << " n " << s.n << " weighted "
                          << s.weighted);
      const auto c = check_round(dir, "fp32", world, s, fp32_bound);
      CATCH_CHECK(c.all_present);
      CATCH_CHECK(c.identical);
      CATCH_CHECK(c.violations == 0);
      CATCH_CHECK(c.worst_ratio <= 1.0);
    }
    for (int r = 0; r < world; ++r) {
      CATCH_CHECK(counter(dir, "fp32", r, "rejected") == 0);
      if (world > 1) CATCH_CHECK(counter(dir, "fp32", r, "sent") > 0);
    }
    fs::remove_all(dir);
  }
}

CATCH_TEST_CASE(
    "fp16, bf16 and int8 rings stay within the codec bound and agree bit for bit on every rank, and a call "
    "can ask for fp32",
    "[comm]") {
  struct variant {
    wire_dtype dtype;
    bool codebook;
  };
  const std::vector<variant> variants = {{wire_dtype::fp16, false},
                                         {wire_dtype::bf16, false},
                                         {wire_dtype::int8, false},
                                         {wire_dtype::int8, true}};
  // Round 5 asks for fp32 on the lossy ring (parameters that must not be rounded), round 6 is lossy again.
  const std::vector<round_spec> rounds = {{1, 0, 1000003, false},     {2, 0, 3, false},
                                          {3, 0, 0, false},           {4, 0, 1000, true},
                                          {5, 0, 300007, true, true}, {6, 0, 3001, false}};
  for (int world : {2, 3, 4}) {
    CATCH_INFO("world " << world);
    const auto dir = scratch("lossy-" + std::to_string(world));
    auto codes = run_ring(
        world * variants.size(),
        [&](std::vector<std::string> eps) {
          std::vector<body_fn> bodies;
          for (int r = 0; r < world; ++r)
            bodies.push_back([=] {
              for (size_t v = 0; v < variants.size(); ++v) {
                ring_options o = test_options(0xB00 + v);
                o.dtype = variants[v].dtype;
                o.codec.int8_codebook = variants[v].codebook;
                const std::vector<std::string> ring_eps(eps.begin() + v * world,
                                                        eps.begin() + (v + 1) * world);
                ring_member(dir, "v" + std::to_string(v), r, ring_eps, o, rounds);
              }
              return 0;
            });
          return bodies;
        },
        120);
    for (int r = 0; r < world; ++r) CATCH_CHECK(codes[r] == 0);
    for (size_t v = 0; v < variants.size(); ++v) {
      CATCH_INFO("dtype " << to_string(variants[v].dtype) << (variants[v].codebook ? " codebook" : ""));
      for (const auto& s : rounds) {
        CATCH_INFO("round " << s.round << " n " << s.n);
        const auto c =
            check_round(dir, "v" + std::to_string(v), world, s,
                        s.fp32 ? fp32_bound : lossy_bound(variants[v].dtype, variants[v].codebook, world));
        CATCH_CHECK(c.all_present);
        CATCH_CHECK(c.identical);
        CATCH_CHECK(c.violations == 0);
      }
    }
    fs::remove_all(dir);
  }
}

namespace {

// Messages a hostile process sends to rank 1 of a 3-rank ring in round 7, and the reasons they must get
// whatever the arrival order (none of them can pass for a real chunk).
std::vector<std::vector<std::vector<std::byte>>> hostile_messages(uint64_t cluster, size_t n) {
  chunk_header h;
  h.cluster_id = cluster;
  h.round = 7;
  h.phase = ring_phase::reduce_scatter;
  h.sender = 0;
  h.world_size = 3;
  h.dtype = wire_dtype::fp32;
  h.total_elements = n;
  h.element_count = 100;
  h.byte_count = 400;
  h.weight = 1.0;
  std::vector<std::byte> payload(400, std::byte{1});
  h.checksum = crc32c(payload.data(), payload.size());
  auto with = [&](auto&& mutate) {
    chunk_header m = h;
    mutate(m);
    return build_chunk_header(m);
  };
  std::mt19937_64 rng(99);
  auto random_bytes = [&](size_t k) {
    std::vector<std::byte> v(k);
    for (auto& b : v) b = static_cast<std::byte>(rng());
    return v;
  };
  const auto good = build_chunk_header(h);
  auto cut = good;
  cut.resize(cut.size() - 8);
  std::vector<std::vector<std::vector<std::byte>>> m;
  m.push_back({good});                                                       // truncated: no payload
  m.push_back({good, payload, payload});                                     // bad_size: 3 frames
  m.push_back({random_bytes(13), payload});                                  // bad_size: not words
  m.push_back({cut, payload});                                               // truncated header
  m.push_back({random_bytes(24), random_bytes(64)});                         // anything
  m.push_back({random_bytes(64), random_bytes(400)});                        // anything
  m.push_back({good, std::vector<std::byte>(500)});                          // bad_size: payload > header
  m.push_back({good, std::vector<std::byte>(396)});                          // truncated: payload < header
  m.push_back({with([](chunk_header& x) { x.round = 6; }), payload});        // wrong_round (older)
  m.push_back({with([](chunk_header& x) { x.cluster_id ^= 1; }), payload});  // wrong_cluster
  // wrong_epoch, although its round is the next one's: frames of another epoch are never held.
  m.push_back({with([](chunk_header& x) {
                 x.round = 8;
                 x.epoch = 1;
               }),
               payload});
  m.push_back({with([](chunk_header& x) { x.sender = 2; }), payload});  // wrong_sender
  m.push_back({raw_header(h, [](auto& w) { w.setProtocolVersion(protocol_version() + 2); }),
               payload});  // bad_version
  m.push_back(
      {raw_header(h, [](auto& w) { w.setDtype(static_cast<wire::Dtype>(9)); }), payload});  // bad_dtype
  std::vector<std::byte> bogus(16, std::byte{0xff});
  const uint32_t table[2] = {0, 1};
  std::memcpy(bogus.data(), table, 8);
  m.push_back({bogus, payload});  // malformed
  // Rank 1's first expected chunk (segment 0, chunk 0: 1024 values) with a wrong CRC: bad_checksum if it is
  // read before the real one, wrong_step after.
  std::vector<std::byte> chunk0(4096, std::byte{2});
  m.push_back({with([&](chunk_header& x) {
                 x.element_count = 1024;
                 x.byte_count = 4096;
                 x.checksum = crc32c(chunk0.data(), chunk0.size()) ^ 0x55;
               }),
               chunk0});
  m.push_back({with([](chunk_header& x) { x.weight = -1.0; }), payload});  // malformed
  return m;
}

}  // namespace

CATCH_TEST_CASE("a rank drops a hostile peer's malformed frames, reports each, and still averages correctly",
                "[comm]") {
  const auto dir = scratch("hostile");
  const uint64_t cluster = 0xBAD;
  const size_t n = 1000003;
  const std::vector<round_spec> rounds = {{7, 0, n, false}, {8, 0, 1000, true}};
  const auto messages = hostile_messages(cluster, n);
  auto codes = run_ring(
      3,
      [&](std::vector<std::string> eps) {
        std::vector<body_fn> bodies;
        for (int r = 0; r < 3; ++r)
          bodies.push_back([=] {
            auto opts = test_options(cluster);
            std::mutex mu;
            std::vector<std::string> reports;
            auto on_reject = [&](const std::string& peer, const std::string& reason) {
              std::lock_guard<std::mutex> lk(mu);
              reports.push_back(reason + " | " + peer);
            };
            ring_allreduce ring(r, eps, opts, on_reject);
            if (!wait_for_file(dir / "hostile-sent", ms(20000))) return 9;
            for (const auto& s : rounds) {
              auto data = input(r, s.n, s.round * 16 + s.fragment);
              ring.allreduce(s.round, data.data(), s.n, weight_of(r, s.weighted), s.fragment);
              write_floats(result_path(dir, "h", r, s), data);
            }
            std::string text;
            {
              std::lock_guard<std::mutex> lk(mu);
              for (const auto& line : reports) text += line + "\n";
            }
            write_text(dir / ("reports-r" + std::to_string(r) + ".txt"), text);
            write_text(dir / ("h-r" + std::to_string(r) + ".txt"),
                       "rejected " + std::to_string(ring.rejected_frames()) + "\n");
            write_text(dir / ("done-r" + std::to_string(r)), "");
            return 0;
          });
        // The hostile peer: connects to rank 1's listening endpoint like a previous rank would.
        bodies.push_back([=] {
          zmq::context_t ctx(1);
          zmq::socket_t push(ctx, zmq::socket_type::push);
          push.set(zmq::sockopt::linger, 0);
          push.connect(eps[1]);
          for (const auto& msg : messages) test::send_frames(push, msg);
          std::this_thread::sleep_for(ms(500));  // delivered into rank 1's queue before the ring starts
          write_text(dir / "hostile-sent", "");
          wait_for_file(dir / "done-r1", ms(60000));  // stay connected until rank 1 has read everything
          return 0;
        });
        return bodies;
      },
      120);
  for (int r = 0; r < 4; ++r) CATCH_CHECK(codes[r] == 0);
  for (const auto& s : rounds) {
    CATCH_INFO("round " << s.round);
    const auto c = check_round(dir, "h", 3, s, fp32_bound);
    CATCH_CHECK(c.all_present);
    CATCH_CHECK(c.identical);
    CATCH_CHECK(c.violations == 0);
  }
  CATCH_CHECK(counter(dir, "h", 1, "rejected") >= messages.size());
  CATCH_CHECK(counter(dir, "h", 0, "rejected") == 0);
  CATCH_CHECK(counter(dir, "h", 2, "rejected") == 0);
  const std::string reports = read_text(dir / "reports-r1.txt");
  CATCH_INFO(reports);
  for (const char* reason : {"truncated", "bad_size", "wrong_round", "wrong_cluster", "wrong_epoch",
                             "wrong_sender", "bad_version", "bad_dtype", "malformed"})
    CATCH_CHECK(("\n" + reports).find("\n" + std::string(reason) + ":") != std::string::npos);
  CATCH_CHECK((reports.find("\nbad_checksum:") != std::string::npos ||
               reports.find("\nwrong_step:") != std::string::npos));
  CATCH_CHECK(reports.find("127.0.0.1") != std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a cancelled ring is torn down at once and rebuilt on the same endpoints in the next epoch",
                "[comm]") {
  const auto dir = scratch("epoch");
  const round_spec first{1, 0, 5000, true}, second{3, 0, 1000003, true};
  auto codes = run_ring(
      2,
      [&](std::vector<std::string> eps) {
        // Both ranks in one child, each on its own thread, as a node rebuilding its ring would.
        return std::vector<body_fn>{[=] {
          auto both = [&](ring_allreduce& a, ring_allreduce& b, const std::string& tag, const round_spec& s) {
            std::thread t([&] {
              auto d = input(1, s.n, s.round * 16);
              b.allreduce(s.round, d.data(), s.n, weight_of(1, s.weighted));
              write_floats(result_path(dir, tag, 1, s), d);
            });
            auto d = input(0, s.n, s.round * 16);
            a.allreduce(s.round, d.data(), s.n, weight_of(0, s.weighted));
            write_floats(result_path(dir, tag, 0, s), d);
            t.join();
          };
          auto opts = test_options(0xE90C);
          opts.epoch = 1;
          std::string outcome = "none";
          std::chrono::steady_clock::time_point t0;
          {
            ring_allreduce r0(0, eps, opts), r1(1, eps, opts);
            both(r0, r1, "e1", first);
            // Rank 0 starts the next round alone: 32 MiB for rank 1, more than the socket buffers hold, so
            // frames are still queued in ZeroMQ when the cancel comes.
            auto d = input(0, size_t{1} << 23, 2);
            std::thread t([&] { outcome = outcome_of([&] { r0.allreduce(2, d.data(), d.size()); }); });
            std::this_thread::sleep_for(ms(300));
            r0.cancel();
            r1.cancel();
            t.join();
            t0 = std::chrono::steady_clock::now();
          }
          const auto teardown = std::chrono::duration_cast<ms>(std::chrono::steady_clock::now() - t0).count();
          opts.epoch = 2;
          ring_allreduce r0(0, eps, opts), r1(1, eps, opts);
          both(r0, r1, "e2", second);
          write_text(dir / "epoch.txt", outcome + " " + std::to_string(teardown) + " " +
                                            std::to_string(r0.rejected_frames() + r1.rejected_frames()) +
                                            "\n");
          return 0;
        }};
      },
      120);
  CATCH_CHECK(codes[0] == 0);
  std::istringstream in(read_text(dir / "epoch.txt"));
  std::string outcome;
  long teardown = -1, rejected = -1;
  in >> outcome >> teardown >> rejected;
  CATCH_INFO("cancelled call: " << outcome << ", teardown " << teardown
                                << " ms, rejected in epoch 2: " << rejected);
  CATCH_CHECK(outcome == "cancelled");
  CATCH_CHECK(teardown >= 0);
  CATCH_CHECK(teardown < 5000);  // no linger for frames nobody will read (the timeout is 20 s)
  CATCH_CHECK(rejected == 0);
  for (const auto& [tag, s] : {std::pair{"e1", first}, std::pair{"e2", second}}) {
    CATCH_INFO(tag);
    const auto c = check_round(dir, tag, 2, s, fp32_bound);
    CATCH_CHECK(c.all_present);
    CATCH_CHECK(c.identical);
    CATCH_CHECK(c.violations == 0);
  }
  fs::remove_all(dir);
}

CATCH_TEST_CASE("ranks in different epochs reject each other's frames as wrong_epoch and the call fails",
                "[comm]") {
  const auto dir = scratch("wrong-epoch");
  auto codes = run_ring(
      2,
      [&](std::vector<std::string> eps) {
        std::vector<body_fn> bodies;
        for (int r = 0; r < 2; ++r)
          bodies.push_back([=] {
            auto opts = test_options(0xE90C);
            opts.epoch = 2 + r;
            opts.timeout = ms(1500);
            auto first_reason = std::make_shared<std::string>();
            auto mu = std::make_shared<std::mutex>();
            ring_allreduce ring(r, eps, opts, [first_reason, mu](const std::string&, const std::string& why) {
              std::lock_guard<std::mutex> lk(*mu);
              if (first_reason->empty()) *first_reason = why;
            });
            auto data = input(r, 5000, 1);
            const auto outcome = outcome_of([&] { ring.allreduce(1, data.data(), data.size()); });
            std::lock_guard<std::mutex> lk(*mu);
            write_text(rank_file(dir, r),
                       outcome + " " + std::to_string(ring.rejected_frames()) + "\n" + *first_reason + "\n");
            return 0;
          });
        return bodies;
      },
      60);
  for (int r = 0; r < 2; ++r) {
    CATCH_CHECK(codes[r] == 0);
    std::istringstream in(read_text(rank_file(dir, r)));
    std::string outcome, reason;
    long rejected = -1;
    in >> outcome >> rejected;
    in.ignore();
    std::getline(in, reason);
    CATCH_INFO("rank " << r << ": " << outcome << ", " << rejected << " rejected; first: " << reason);
    // Both send at once; the one that fails first closes its socket, so the other may end on peer_lost.
    CATCH_CHECK((outcome == "deadline_missed" || outcome == "peer_lost"));
    CATCH_CHECK(rejected > 0);
    CATCH_CHECK(reason.rfind("wrong_epoch: epoch ", 0) == 0);
  }
  CATCH_CHECK(read_text(rank_file(dir, 0)).find("epoch 3, this ring is in epoch 2") != std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a ring with a rank that never starts fails with deadline_missed within the timeout",
                "[comm]") {
  const auto dir = scratch("deadline");
  const ms timeout(1500);
  auto codes = run_ring(
      3,
      [&](std::vector<std::string> eps) {
        std::vector<body_fn> bodies;
        for (int r = 0; r < 2; ++r)  // rank 2 never starts
          bodies.push_back([=] {
            auto opts = test_options(0xDEAD);
            opts.timeout = timeout;
            ring_allreduce ring(r, eps, opts);
            auto data = input(r, 100000, 1);
            const auto t0 = std::chrono::steady_clock::now();
            std::string outcome = "none";
            try {
              ring.allreduce(1, data.data(), data.size());
            } catch (const lw_error& e) {
              outcome = to_string(e.code());
              std::fprintf(stderr, "rank %d (expected failure): %s\n", r, e.what());
            }
            const auto elapsed =
                std::chrono::duration_cast<ms>(std::chrono::steady_clock::now() - t0).count();
            write_text(rank_file(dir, r), outcome + " " + std::to_string(elapsed) + "\n");
            return 0;
          });
        return bodies;
      },
      60);
  for (int r = 0; r < 2; ++r) {
    CATCH_CHECK(codes[r] == 0);
    std::istringstream in(read_text(rank_file(dir, r)));
    std::string outcome;
    long elapsed = -1;
    in >> outcome >> elapsed;
    CATCH_INFO("rank " << r << ": " << outcome << " after " << elapsed << " ms");
    CATCH_CHECK(outcome == "deadline_missed");
    CATCH_CHECK(elapsed >= timeout.count());
    CATCH_CHECK(elapsed < timeout.count() + 3000);
  }
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a rank whose next peer dies mid-round fails with peer_lost before the timeout", "[comm]") {
  const auto dir = scratch("peer-lost");
  const ms timeout(6000);
  auto codes = run_ring(
      3,
      [&](std::vector<std::string> eps) {
        std::vector<body_fn> bodies;
        for (int r = 0; r < 2; ++r)
          bodies.push_back([=] {
            auto opts = test_options(0x1057);
            opts.timeout = timeout;
            ring_allreduce ring(r, eps, opts);
            auto data = input(r, 1000003, 1);
            const auto t0 = std::chrono::steady_clock::now();
            std::string outcome = "none";
            try {
              ring.allreduce(1, data.data(), data.size());
            } catch (const lw_error& e) {
              outcome = to_string(e.code());
              std::fprintf(stderr, "rank %d (expected failure): %s\n", r, e.what());
            }
            const auto elapsed =
                std::chrono::duration_cast<ms>(std::chrono::steady_clock::now() - t0).count();
            write_text(rank_file(dir, r), outcome + " " + std::to_string(elapsed) + "\n");
            return 0;
          });
        bodies.push_back([=] {  // rank 2 joins the ring, never calls allreduce, and is killed
          ring_allreduce ring(2, eps, test_options(0x1057));
          std::this_thread::sleep_for(ms(1000));
          kill(getpid(), SIGKILL);
          return 0;
        });
        return bodies;
      },
      60);
  CATCH_CHECK(codes[2] == 128 + SIGKILL);
  std::string outcome;
  long elapsed = -1;
  std::istringstream in(read_text(rank_file(dir, 1)));
  in >> outcome >> elapsed;
  CATCH_INFO("rank 1: " << outcome << " after " << elapsed << " ms");
  CATCH_CHECK(outcome == "peer_lost");
  CATCH_CHECK(elapsed < timeout.count());
  std::istringstream in0(read_text(rank_file(dir, 0)));
  in0 >> outcome >> elapsed;
  CATCH_INFO("rank 0: " << outcome << " after " << elapsed << " ms");
  CATCH_CHECK((outcome == "deadline_missed" || outcome == "peer_lost"));
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a stalled rank names the peer it waits for and fails with the coordinator's lost verdict",
                "[comm]") {
  const auto dir = scratch("stall");
  const ms timeout(20000);
  auto codes = run_ring(
      3,
      [&](std::vector<std::string> eps) {
        std::vector<body_fn> bodies;
        for (int r = 0; r < 2; ++r)  // rank 2 ("c") never starts
          bodies.push_back([=] {
            auto opts = test_options(0x57A1);
            opts.timeout = timeout;
            opts.names = {"a", "b", "c"};
            opts.stall_report_after = ms(300);
            opts.stall_report_every = ms(400);
            auto lines = std::make_shared<std::vector<std::string>>();
            auto mu = std::make_shared<std::mutex>();
            opts.on_stall = [lines, mu, dir, r](const std::string& line) {
              std::lock_guard<std::mutex> lk(*mu);
              lines->push_back(line);
              if (lines->size() == 2) write_text(dir / ("stalled-" + std::to_string(r)), "");
            };
            ring_allreduce ring(r, eps, opts);
            // The coordinator's verdict arrives while the call is stalled, once both ranks reported the stall
            // twice (however late a loaded machine makes the reports; at most 10 s).
            std::thread verdict([&ring, dir] {
              for (int i = 0; i < 1000; ++i) {
                if (fs::exists(dir / "stalled-0") && fs::exists(dir / "stalled-1")) break;
                std::this_thread::sleep_for(ms(10));
              }
              ring.peer_declared_lost("the coordinator says: node c lost");
            });
            auto data = input(r, 1000, 1);
            const auto t0 = std::chrono::steady_clock::now();
            std::string outcome = "none", what;
            try {
              ring.allreduce(1, data.data(), data.size());
            } catch (const lw_error& e) {
              outcome = to_string(e.code());
              what = e.what();
            }
            const auto elapsed =
                std::chrono::duration_cast<ms>(std::chrono::steady_clock::now() - t0).count();
            verdict.join();
            std::lock_guard<std::mutex> lk(*mu);
            write_text(rank_file(dir, r), outcome + " " + std::to_string(elapsed) + " " +
                                              std::to_string(lines->size()) + "\n" +
                                              (lines->empty() ? "" : lines->front()) + "\n" + what + "\n");
            return 0;
          });
        return bodies;
      },
      60);
  int verdicts = 0;
  for (int r = 0; r < 2; ++r) {
    CATCH_CHECK(codes[r] == 0);
    std::istringstream in(read_text(rank_file(dir, r)));
    std::string outcome, first_line, what;
    long elapsed = -1, n_lines = -1;
    in >> outcome >> elapsed >> n_lines;
    in.ignore();
    std::getline(in, first_line);
    std::getline(in, what);
    CATCH_INFO("rank " << r << ": " << outcome << " after " << elapsed << " ms, " << n_lines
                       << " stall reports; first: " << first_line << "; error: " << what);
    CATCH_CHECK(outcome == "peer_lost");
    CATCH_CHECK(elapsed >= 700);
    CATCH_CHECK(elapsed < timeout.count());
    CATCH_CHECK(n_lines >= 2);  // at 300 ms, then every 400 ms until the verdict
    CATCH_CHECK(first_line.find("no progress for 0 s") != std::string::npos);
    // Each rank ends on the verdict, or on its neighbour's connection closing because that one took the
    // verdict a moment earlier: never on the deadline.
    const bool verdict = what.find("node c lost") != std::string::npos;
    verdicts += verdict ? 1 : 0;
    CATCH_CHECK((verdict || what.find("connection to") != std::string::npos));
  }
  CATCH_CHECK(verdicts >= 1);
  // Rank 0 receives from rank 2 and names it, with its node name and endpoint.
  const auto r0 = read_text(rank_file(dir, 0));
  CATCH_CHECK(r0.find("from rank 2 (c, tcp://") != std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "a CURVE ring whose next rank refuses this rank's key, or has another key, fails at once naming it",
    "[comm][curve]") {
  // libzmq never retries a refused handshake, and a server that cannot read a hello drops it again and again:
  // either used to stall the call until its timeout.
  const ms timeout(8000);  // the ranks that only wait stall until then
  const std::vector<curve_key> keys = {new_curve_key(), new_curve_key(), new_curve_key()};
  const curve_key stranger = new_curve_key();
  for (const bool refused : {true, false}) {
    // Of 3 ranks, rank 0 pins rank 1's key and admits rank 2's, so pinning a stranger breaks one link only.
    CATCH_DYNAMIC_SECTION((refused ? "rank 1 admits another key than rank 0's" : "rank 0 pins another key")) {
      const int n = refused ? 2 : 3;
      const auto dir = scratch(refused ? "curve-refused" : "curve-pinned");
      auto codes = run_ring(
          n,
          [&](std::vector<std::string> eps) {
            std::vector<body_fn> bodies;
            for (int r = 0; r < n; ++r)
              bodies.push_back([=] {
                auto opts = test_options(0xC0DE);
                opts.timeout = timeout;
                opts.curve = ring_curve{keys[r], {}};
                // What each rank believes the ranks' keys are.
                for (int k = 0; k < n; ++k) opts.public_keys.push_back(keys[k].public_key);
                if (refused && r == 1) opts.public_keys[0] = stranger.public_key;
                if (!refused && r == 0) opts.public_keys[1] = stranger.public_key;
                ring_allreduce ring(r, eps, opts);
                auto data = input(r, 100000, 1);
                const auto t0 = std::chrono::steady_clock::now();
                std::string outcome = "none", why;
                try {
                  ring.allreduce(1, data.data(), data.size());
                } catch (const lw_error& e) {
                  outcome = to_string(e.code());
                  why = e.what();
                }
                const auto elapsed =
                    std::chrono::duration_cast<ms>(std::chrono::steady_clock::now() - t0).count();
                write_text(rank_file(dir, r), outcome + " " + std::to_string(elapsed) + " " + why + "\n");
                return 0;
              });
            return bodies;
          },
          60);
      CATCH_CHECK(codes == std::vector<int>(n, 0));
      std::istringstream in(read_text(rank_file(dir, 0)));
      std::string outcome, why;
      long elapsed = -1;
      in >> outcome >> elapsed;
      std::getline(in, why);
      CATCH_INFO("rank 0: " << outcome << " after " << elapsed << " ms: " << why);
      CATCH_CHECK(outcome == "peer_lost");
      CATCH_CHECK(elapsed < 4000);
      CATCH_CHECK_THAT(why,
                       Catch::Contains(refused ? "refused this node's CURVE key" : "CURVE handshake with"));
      fs::remove_all(dir);
    }
  }
}
