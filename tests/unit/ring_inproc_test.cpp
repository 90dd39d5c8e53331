// The ring all-reduce and all-gather over the in-process transport (comm/inproc_transport): every rank a
// thread of this process, so the ring's logic (averages, rank order, a lost link, a healed partition, the
// rate-limit decorator) runs in milliseconds. The ZeroMQ transport keeps its own tests over real sockets
// (tests/integration/ring_allreduce_test.cpp).
#include <unistd.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/fault_transport.hpp"
#include "comm/inproc_transport.hpp"
#include "comm/ring_allreduce.hpp"
#include "runtime/errors/errors.hpp"

namespace {

using namespace longwave;
using namespace longwave::comm;

std::vector<std::string> names_of(int world) {
  std::vector<std::string> e;
  for (int r = 0; r < world; ++r) e.push_back("r" + std::to_string(r));
  return e;
}

struct ring_set {
  std::shared_ptr<inproc_hub> hub = inproc_hub::make();
  std::vector<std::unique_ptr<ring_allreduce>> ranks;

  explicit ring_set(int world, ring_options o = {}) {
    if (!o.transport) o.transport = hub->factory();
    o.chunk_bytes = o.chunk_bytes == (size_t{1} << 20) ? 4096 : o.chunk_bytes;  // many chunks per segment
    for (int r = 0; r < world; ++r) ranks.push_back(std::make_unique<ring_allreduce>(r, names_of(world), o));
  }

  // Runs fn(rank) on a thread per rank; returns each rank's error code (errc::none when it returned).
  std::vector<errc> run(const std::function<void(int)>& fn) {
    std::vector<errc> codes(ranks.size(), errc::none);
    std::vector<std::thread> threads;
    for (size_t r = 0; r < ranks.size(); ++r)
      threads.emplace_back([&, r] {
        try {
          fn(static_cast<int>(r));
        } catch (const lw_error& e) {
          codes[r] = e.code();
        }
      });
    for (auto& t : threads) t.join();
    return codes;
  }
};

std::vector<float> values(int rank, size_t n) {
  std::mt19937 gen(static_cast<uint32_t>(1000 + rank));
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

}  // namespace

CATCH_TEST_CASE("inproc ring: fp32 all-reduce gives the weighted average, bit-identical on every rank",
                "[comm][inproc]") {
  for (const int world : {1, 2, 3, 5}) {
    CATCH_DYNAMIC_SECTION(world << " ranks") {
      ring_set s(world);
      const size_t n = 10007;  // odd: uneven segments and a short last chunk
      std::vector<std::vector<float>> data;
      for (int r = 0; r < world; ++r) data.push_back(values(r, n));
      const auto before = data;
      const auto codes = s.run([&](int r) { s.ranks[r]->allreduce(1, data[r].data(), n, 1.0 + r); });
      for (const auto c : codes) CATCH_CHECK(c == errc::none);
      double total = 0;
      for (int r = 0; r < world; ++r) total += 1.0 + r;
      for (size_t i = 0; i < n; i += 97) {
        double want = 0;
        for (int r = 0; r < world; ++r) want += (1.0 + r) * before[r][i];
        CATCH_CHECK(data[0][i] == Approx(want / total).margin(1e-6));
      }
      for (int r = 1; r < world; ++r) CATCH_CHECK(data[r] == data[0]);
      for (int r = 0; r < world; ++r) {
        CATCH_CHECK(s.ranks[r]->completed_round() == 1);
        CATCH_CHECK(s.ranks[r]->last_total_weight() == Approx(total));
      }
    }
  }
}

CATCH_TEST_CASE("inproc ring: when every rank weighs 0 every rank gets zeros and a total weight of 0",
                "[comm][inproc]") {
  // Client sampling whose drawn clients are all on nodes that are gone: the caller decides (it threw).
  for (const int world : {1, 3}) {
    for (const auto dtype : {wire_dtype::fp32, wire_dtype::int8}) {
      CATCH_DYNAMIC_SECTION(world << " ranks, " << to_string(dtype)) {
        ring_options o;
        o.dtype = dtype;
        ring_set s(world, o);
        const size_t n = 5003;
        std::vector<std::vector<float>> data;
        for (int r = 0; r < world; ++r) data.push_back(values(r, n));  // not zeros: the result must be
        const auto codes = s.run([&](int r) { s.ranks[r]->allreduce(1, data[r].data(), n, 0.0); });
        for (int r = 0; r < world; ++r) {
          CATCH_CHECK(codes[r] == errc::none);
          CATCH_CHECK(data[r] == std::vector<float>(n, 0.0f));
          CATCH_CHECK(s.ranks[r]->last_total_weight() == 0.0);
          CATCH_CHECK(s.ranks[r]->completed_round() == 1);
        }
        std::vector<std::vector<std::byte>> msg(world, std::vector<std::byte>(64, std::byte{7}));
        std::vector<gathered> got(world);
        const auto gather_codes =
            s.run([&](int r) { got[r] = s.ranks[r]->allgather(2, msg[r].data(), 64, 0.0); });
        for (int r = 0; r < world; ++r) {
          CATCH_CHECK(gather_codes[r] == errc::none);
          CATCH_CHECK(s.ranks[r]->last_total_weight() == 0.0);
        }
      }
    }
  }
}

CATCH_TEST_CASE("inproc ring: all-gather hands every rank every message in rank order", "[comm][inproc]") {
  ring_set s(4);
  const size_t bytes = 9000;
  std::vector<std::vector<std::byte>> msg(4, std::vector<std::byte>(bytes));
  for (int r = 0; r < 4; ++r)
    for (size_t i = 0; i < bytes; ++i) msg[r][i] = static_cast<std::byte>((r * 31 + i) & 0xff);
  std::vector<gathered> got(4);
  const auto codes = s.run([&](int r) { got[r] = s.ranks[r]->allgather(1, msg[r].data(), bytes, 0.5 + r); });
  for (int r = 0; r < 4; ++r) {
    CATCH_CHECK(codes[r] == errc::none);
    CATCH_REQUIRE(got[r].messages.size() == 4 * bytes);
    for (int q = 0; q < 4; ++q) {
      CATCH_CHECK(std::equal(msg[q].begin(), msg[q].end(), got[r].messages.begin() + q * bytes));
      CATCH_CHECK(got[r].weights[q] == 0.5 + q);
    }
  }
}

CATCH_TEST_CASE(
    "inproc ring: a cut link fails the sender's round with peer_lost, and after healing the ring goes on",
    "[comm][inproc]") {
  ring_options o;
  o.stall_report_after = std::chrono::milliseconds(100);  // a declared loss ends a stalled call this soon
  ring_set s(3, o);
  const size_t n = 5000;
  std::vector<std::vector<float>> data;
  for (int r = 0; r < 3; ++r) data.push_back(values(r, n));
  auto round = [&](uint64_t k) { return s.run([&](int r) { s.ranks[r]->allreduce(k, data[r].data(), n); }); };
  for (const auto c : round(1)) CATCH_CHECK(c == errc::none);

  s.hub->cut("r1", "r2");
  std::vector<errc> codes(3, errc::none);
  std::thread others([&] {
    // Ranks 0 and 2 stall for want of rank 1's frames; they give up once told a node was lost, as a
    // member does when the master says so.
    auto c = s.run([&](int r) {
      if (r != 1) s.ranks[r]->allreduce(2, data[r].data(), n);
    });
    codes[0] = c[0];
    codes[2] = c[2];
  });
  try {
    s.ranks[1]->allreduce(2, data[1].data(), n);
  } catch (const lw_error& e) {
    codes[1] = e.code();
    CATCH_CHECK(std::string(e.what()).find("connection to r2 lost") != std::string::npos);
  }
  for (int r : {0, 2}) s.ranks[r]->peer_declared_lost("node r1 lost (test)");
  others.join();
  CATCH_CHECK(codes[1] == errc::peer_lost);
  CATCH_CHECK(codes[0] == errc::peer_lost);
  CATCH_CHECK(codes[2] == errc::peer_lost);

  s.hub->heal("r1", "r2");
  for (int r = 0; r < 3; ++r) data[r] = values(r, n);
  const auto ok = round(3);
  for (const auto c : ok) CATCH_CHECK(c == errc::none);
  CATCH_CHECK(data[1] == data[0]);
  CATCH_CHECK(data[2] == data[0]);
  CATCH_CHECK(s.ranks[0]->completed_round() == 3);
}

CATCH_TEST_CASE("inproc ring: a rank whose next rank never binds misses its deadline, naming the wait",
                "[comm][inproc]") {
  ring_options o;
  o.transport = inproc_hub::make()->factory();
  o.timeout = std::chrono::milliseconds(300);
  ring_allreduce lonely(0, names_of(2), o);
  std::vector<float> v(100, 1.0f);
  try {
    lonely.allreduce(1, v.data(), v.size());
    CATCH_FAIL("the call returned without its peer");
  } catch (const lw_error& e) {
    CATCH_CHECK(e.code() == errc::deadline_missed);
    CATCH_CHECK(std::string(e.what()).find("waiting for reduce_scatter") != std::string::npos);
  }
}

CATCH_TEST_CASE("inproc ring: two rings cannot bind one endpoint of a hub", "[comm][inproc]") {
  auto hub = inproc_hub::make();
  ring_options o;
  o.transport = hub->factory();
  ring_allreduce a(0, names_of(2), o);
  try {
    ring_allreduce b(0, names_of(2), o);
    CATCH_FAIL("the second bind succeeded");
  } catch (const lw_error& e) {
    CATCH_CHECK(e.code() == errc::io_error);
    CATCH_CHECK(std::string(e.what()).find("already bound") != std::string::npos);
  }
}

CATCH_TEST_CASE("the rate-limit decorator holds a ring's frames to its rate", "[comm][inproc]") {
  // A lower bound only: a slower machine takes longer, never less than the bytes over the rate.
  auto hub = inproc_hub::make();
  transport_faults f;
  f.send_bytes_per_s = 1e6;
  ring_options o;
  o.transport = with_faults(hub->factory(), f);
  ring_set s(2, o);
  const size_t n = 100000;  // 400 kB: each rank sends half of it twice, about 400 kB in all
  std::vector<std::vector<float>> data{values(0, n), values(1, n)};
  const auto t0 = std::chrono::steady_clock::now();
  const auto codes = s.run([&](int r) { s.ranks[r]->allreduce(1, data[r].data(), n); });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto c : codes) CATCH_CHECK(c == errc::none);
  CATCH_CHECK(data[1] == data[0]);
  const double sent = static_cast<double>(s.ranks[0]->bytes_sent());
  CATCH_CHECK(sent > 3.9e5);
  // A frame leaves once a link of that rate would have carried it with its TCP/IP headers (66 bytes per
  // 1448), after a burst of 256 KiB: at least 0.15 s here.
  CATCH_CHECK(took >= (sent * 1514.0 / 1448.0 - 256.0 * 1024) / f.send_bytes_per_s - 0.001);
}

CATCH_TEST_CASE("transport faults are read from the environment and a malformed one is named",
                "[comm][inproc]") {
  unsetenv("LONGWAVE_FAULT_DIE_IN_ALLREDUCE");
  unsetenv("LONGWAVE_FAULT_RING_RATE");
  CATCH_CHECK_FALSE(transport_faults_from_env().has_value());
  setenv("LONGWAVE_FAULT_DIE_IN_ALLREDUCE", "4:12", 1);
  setenv("LONGWAVE_FAULT_RING_RATE", "2000000", 1);
  auto f = transport_faults_from_env();
  CATCH_REQUIRE(f.has_value());
  CATCH_CHECK(f->die_in_round == 4);
  CATCH_CHECK(f->die_after_chunks == 12);
  CATCH_CHECK(f->send_bytes_per_s == 2e6);
  CATCH_CHECK_FALSE(f->hang);
  setenv("LONGWAVE_FAULT_DIE_IN_ALLREDUCE", "4:12:hang", 1);
  f = transport_faults_from_env();
  CATCH_REQUIRE(f.has_value());
  CATCH_CHECK((f->die_in_round == 4 && f->die_after_chunks == 12 && f->hang));
  for (const char* bad : {"4", "4:x", "0:3", "4:12:1", "4:12:hangs", "4:12hang"}) {
    setenv("LONGWAVE_FAULT_DIE_IN_ALLREDUCE", bad, 1);
    try {
      transport_faults_from_env();
      CATCH_FAIL("accepted " << bad);
    } catch (const lw_error& e) {
      CATCH_CHECK(e.code() == errc::invalid_config);
      CATCH_CHECK(std::string(e.what()).find("LONGWAVE_FAULT_DIE_IN_ALLREDUCE") != std::string::npos);
    }
  }
  unsetenv("LONGWAVE_FAULT_DIE_IN_ALLREDUCE");
  setenv("LONGWAVE_FAULT_RING_RATE", "fast", 1);
  CATCH_CHECK_THROWS_WITH(transport_faults_from_env(), Catch::Contains("LONGWAVE_FAULT_RING_RATE=fast"));
  unsetenv("LONGWAVE_FAULT_RING_RATE");
  setenv("LONGWAVE_FAULT_ALLREDUCE_GATE", "7:/tmp/a gate", 1);
  f = transport_faults_from_env();
  CATCH_REQUIRE(f.has_value());
  CATCH_CHECK((f->gate_round == 7 && f->gate_path == "/tmp/a gate" && f->send_bytes_per_s == 0));
  for (const char* bad : {"7", "7:", "0:/tmp/g", "x:/tmp/g"}) {
    setenv("LONGWAVE_FAULT_ALLREDUCE_GATE", bad, 1);
    CATCH_CHECK_THROWS_WITH(transport_faults_from_env(), Catch::Contains("LONGWAVE_FAULT_ALLREDUCE_GATE"));
  }
  unsetenv("LONGWAVE_FAULT_ALLREDUCE_GATE");
}

CATCH_TEST_CASE("the gate decorator holds one round's frames until its file exists", "[comm][inproc]") {
  auto hub = inproc_hub::make();
  const auto gate = std::filesystem::temp_directory_path() / ("lw-gate-" + std::to_string(getpid()));
  std::filesystem::remove(gate);
  transport_faults f;
  f.gate_round = 2;
  f.gate_path = gate.string();
  ring_options o;
  o.transport = with_faults(hub->factory(), f);
  ring_set s(2, o);
  const size_t n = 1000;
  std::vector<std::vector<float>> data{values(0, n), values(1, n)};
  // Round 1 passes; round 2 waits (its all-reduce is not done while the file is missing), then completes.
  auto codes = s.run([&](int r) { s.ranks[r]->allreduce(1, data[r].data(), n); });
  for (const auto c : codes) CATCH_CHECK(c == errc::none);
  std::atomic<int> done{0};
  std::thread second([&] {
    s.run([&](int r) { s.ranks[r]->allreduce(2, data[r].data(), n); });
    done = 1;
  });
  // Closed, it never completes: a while for it to (wrongly) do so, however fast the machine.
  for (int i = 0; i < 50 && done == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CATCH_CHECK(done == 0);
  std::ofstream(gate).put('\n');
  second.join();
  CATCH_CHECK(done == 1);
  CATCH_CHECK(data[1] == data[0]);
  std::filesystem::remove(gate);
}

CATCH_TEST_CASE("a fault for a later round lets every other round through, round 0 included",
                "[comm][inproc]") {
  // The decorator reads the round of each frame for a fault: a round it does not name is never held (the
  // first frames of a run, theta_0's, are of round 0).
  auto hub = inproc_hub::make();
  transport_faults f;
  f.die_in_round = 99;
  f.die_after_chunks = 1;
  ring_options o;
  o.transport = with_faults(hub->factory(), f);
  ring_set s(2, o);
  const size_t n = 1000;
  std::vector<std::vector<float>> data{values(0, n), values(1, n)};
  for (const uint64_t round : {0, 1, 2}) {
    const auto codes = s.run([&](int r) { s.ranks[r]->allreduce(round, data[r].data(), n); });
    for (const auto c : codes) CATCH_CHECK(c == errc::none);
  }
  CATCH_CHECK(data[1] == data[0]);
}

CATCH_TEST_CASE("inproc ring: the rank before a slow link is the one that waits to send", "[comm][inproc]") {
  auto hub = inproc_hub::make();
  transport_faults slow;
  slow.send_bytes_per_s = 1e6;  // rank 1 -> rank 2 only
  std::vector<std::unique_ptr<ring_allreduce>> ranks;
  for (int r = 0; r < 3; ++r) {
    ring_options o;
    o.chunk_bytes = 4096;
    o.transport = r == 1 ? with_faults(hub->factory(), slow) : hub->factory();
    ranks.push_back(std::make_unique<ring_allreduce>(r, names_of(3), o));
  }
  const size_t n = 100000;
  std::vector<std::vector<float>> data{values(0, n), values(1, n), values(2, n)};
  std::vector<std::thread> threads;
  const auto began = std::chrono::steady_clock::now();
  for (int r = 0; r < 3; ++r) threads.emplace_back([&, r] { ranks[r]->allreduce(1, data[r].data(), n); });
  for (auto& t : threads) t.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  CATCH_CHECK(data[1] == data[0]);
  // Rank 1 sends about 4/3 of 400 kB (557 kB with headers) at 1 MB/s after a 256 KiB burst: the call cannot
  // end sooner than the link allows (a slower machine only takes longer), and rank 1, holding chunks its link
  // will not take yet, waits to send more than the others. How much of that time is waiting to send rather
  // than to receive depends on how fast the ranks compute (0.19 s under ASan, about 0.3 s without), so only
  // the order is checked.
  const double burst = 256.0 * 1024, rate = 1e6;
  CATCH_INFO("took " << took << " s, rank 1 sent " << ranks[1]->bytes_sent() << " bytes");
  CATCH_CHECK(took >= (static_cast<double>(ranks[1]->bytes_sent()) - burst) / rate * 0.99);
  const double slow_wait = ranks[1]->send_wait_seconds();
  CATCH_CHECK(slow_wait > 0);
  for (int r : {0, 2}) {
    CATCH_CHECK(ranks[r]->send_wait_seconds() < slow_wait / 2);
    CATCH_CHECK(ranks[r]->receive_wait_seconds() > 0);
  }
}
