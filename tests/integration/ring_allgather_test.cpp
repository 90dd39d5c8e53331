// The ring all-gather (the transport of sparse messages) on real ZeroMQ sockets on loopback, every rank a
// thread of this process: every rank gets every message byte for byte in rank order with its weight, for 1
// to 4 ranks and messages of 0 bytes to several MiB; gathers interleave with all-reduces on one ring; forged
// frames are rejected and counted; and an elastic ring redoes a stalled gather among the survivors.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "comm/elastic_ring.hpp"
#include "comm/frame.hpp"
#include "comm/ring_allreduce.hpp"
#include "runtime/checksum/crc32c.hpp"
#include "runtime/errors/errors.hpp"
#include "tests/support/raw_frames.hpp"
#include "tests/support/ring_members.hpp"

using namespace longwave;
using namespace longwave::comm;

namespace {

constexpr uint64_t cluster = 0x9a7e;

ring_options options() {
  return test::ring_test_options(cluster);  // 4 KiB chunks: many per message, pipelined step by step
}

/// Rank r's message of round `round`: `bytes` bytes that differ per rank and round.
std::vector<std::byte> message_of(size_t r, size_t bytes, uint64_t round) {
  std::vector<std::byte> m(bytes);
  uint64_t x = (round << 32) ^ ((r + 1) * 0x9E3779B97F4A7C15ull);
  for (auto& b : m) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::byte>(x >> 24);
  }
  return m;
}

/// What every rank must get: the messages in rank order, the weights and their sum.
struct expected_gather {
  gathered value;
  double total = 0;
};

expected_gather expect_of(const std::vector<std::vector<std::byte>>& messages,
                          const std::vector<double>& weights) {
  expected_gather e;
  e.value.bytes = messages.front().size();
  e.value.weights = weights;
  for (const auto& m : messages) e.value.messages.insert(e.value.messages.end(), m.begin(), m.end());
  for (double w : weights) e.total += w;
  return e;
}

/// Checks one rank's gather against the expectation (the bytes compared as one bool: no 12 MiB dumps).
void check_gather(const gathered& got, const expected_gather& want) {
  CATCH_CHECK(got.bytes == want.value.bytes);
  CATCH_CHECK(got.weights == want.value.weights);
  const bool same_bytes = got.messages == want.value.messages;
  CATCH_CHECK(same_bytes);
}

/// Rings of `world` ranks on fresh loopback endpoints.
std::vector<std::unique_ptr<ring_allreduce>> make_rings(
    size_t world, const ring_options& o, const ring_allreduce::reject_callback& on_reject = {}) {
  const auto m = test::make_members(world);
  std::vector<std::unique_ptr<ring_allreduce>> rings;
  for (size_t r = 0; r < world; ++r)
    rings.push_back(std::make_unique<ring_allreduce>(static_cast<int>(r), m.endpoints, o, on_reject));
  return rings;
}

/// Runs call(r) for every rank r on a thread of its own; the error code each rank's call threw (none).
std::vector<errc> on_every_rank(size_t world, const std::function<void(size_t)>& call) {
  std::vector<errc> codes(world, errc::none);
  std::vector<std::thread> threads;
  for (size_t r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        call(r);
      } catch (const lw_error& e) {
        std::fprintf(stderr, "rank %zu: %s: %s\n", r, to_string(e.code()), e.what());
        codes[r] = e.code();
      }
    });
  for (auto& t : threads) t.join();
  return codes;
}

/// One all-gather of every rank's message of round `round` on rings; checks each result and the counters.
void gather_and_check(std::vector<std::unique_ptr<ring_allreduce>>& rings, uint64_t round, size_t bytes,
                      const std::vector<double>& weights, uint32_t fragment = 0) {
  const size_t world = rings.size();
  std::vector<std::vector<std::byte>> messages;
  for (size_t r = 0; r < world; ++r) messages.push_back(message_of(r, bytes, round));
  std::vector<gathered> got(world);
  const auto codes = on_every_rank(world, [&](size_t r) {
    got[r] = rings[r]->allgather(round, messages[r].data(), bytes, weights[r], fragment);
  });
  const auto want = expect_of(messages, weights);
  for (size_t r = 0; r < world; ++r) {
    CATCH_INFO("rank " << r);
    CATCH_CHECK(codes[r] == errc::none);
    check_gather(got[r], want);
    CATCH_CHECK(rings[r]->last_total_weight() == want.total);
    CATCH_CHECK(rings[r]->completed_round() == round);
  }
}

std::vector<double> weights_of(size_t world) {
  std::vector<double> w;
  for (size_t r = 0; r < world; ++r) w.push_back(0.5 + static_cast<double>(r));
  return w;
}

}  // namespace

CATCH_TEST_CASE("ring allgather: every rank gets every message byte for byte in rank order with its weight",
                "[integration][comm]") {
  const size_t big = (size_t{3} << 20) + 7;  // 769 chunks of 4 KiB per message
  for (size_t world = 1; world <= 4; ++world) {
    CATCH_INFO(world << " ranks");
    auto rings = make_rings(world, options());
    uint64_t round = 0;
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{1000}, big}) {
      CATCH_INFO(bytes << " bytes");
      gather_and_check(rings, ++round, bytes, weights_of(world));
    }
    if (world > 1) {
      // A rank of weight 0 (a joiner observing its first round) still has its message gathered.
      auto w = weights_of(world);
      w[1] = 0.0;
      gather_and_check(rings, ++round, 1000, w);
      CATCH_CHECK(rings[0]->bytes_sent() > (world - 1) * big);
    }
    // Nobody contributing: every rank says the total weight is 0 (the caller decides; client sampling keeps
    // theta), and the ring carries on afterwards.
    ++round;
    const auto message = message_of(0, 100, round);
    const auto codes = on_every_rank(
        world, [&](size_t r) { rings[r]->allgather(round, message.data(), message.size(), 0.0); });
    for (auto c : codes) CATCH_CHECK(c == errc::none);
    for (const auto& ring : rings) CATCH_CHECK(ring->last_total_weight() == 0.0);
    gather_and_check(rings, ++round, 1000, weights_of(world));
  }
}

CATCH_TEST_CASE("ring allgather and allreduce interleave on one ring and share one (round, fragment) order",
                "[integration][comm]") {
  const size_t world = 3, n = 5000;
  auto rings = make_rings(world, options());
  for (uint64_t round = 1; round <= 3; ++round) {
    CATCH_INFO("round " << round);
    std::vector<std::vector<float>> data(world);
    for (size_t r = 0; r < world; ++r)
      for (size_t i = 0; i < n; ++i)
        data[r].push_back(static_cast<float>(r + 1) + static_cast<float>(i % 13));
    const auto codes = on_every_rank(world, [&](size_t r) { rings[r]->allreduce(round, data[r].data(), n); });
    for (auto c : codes) CATCH_CHECK(c == errc::none);
    CATCH_CHECK(data[0] == data[1]);
    CATCH_CHECK(data[1] == data[2]);
    CATCH_CHECK(std::fabs(data[0][7] - (2.0f + 7.0f)) < 1e-6f);  // the mean of 1, 2, 3 plus 7
    CATCH_CHECK(rings[0]->last_total_weight() == 3.0);
    gather_and_check(rings, round, 777, weights_of(world), 1);
  }
  // A key that does not follow the last call's is refused before anything is sent, by either collective.
  const auto message = message_of(0, 10, 9);
  float x = 0;
  for (const auto& [round, fragment] : std::vector<std::pair<uint64_t, uint32_t>>{{3, 1}, {3, 0}, {2, 5}}) {
    CATCH_INFO("round " << round << " fragment " << fragment);
    try {
      rings[0]->allgather(round, message.data(), message.size(), 1.0, fragment);
      CATCH_FAIL("a stale allgather ran");
    } catch (const lw_error& e) {
      CATCH_CHECK(e.code() == errc::stale_round);
    }
    try {
      rings[0]->allreduce(round, &x, 1, 1.0, fragment);
      CATCH_FAIL("a stale allreduce ran");
    } catch (const lw_error& e) {
      CATCH_CHECK(e.code() == errc::stale_round);
    }
  }
  // The refused calls claimed no key: the next round runs on every rank.
  gather_and_check(rings, 4, 3000, weights_of(world));
}

CATCH_TEST_CASE("ring allgather drops forged frames, counts each, and still gathers every message",
                "[integration][comm]") {
  const size_t world = 3, bytes = 20000;  // 5 chunks per message
  std::mutex mu;
  std::vector<std::string> reports;
  auto on_reject = [&](const std::string& peer, const std::string& reason) {
    std::lock_guard<std::mutex> lk(mu);
    reports.push_back(reason + " | " + peer);
  };
  const auto m = test::make_members(world);
  std::vector<std::unique_ptr<ring_allreduce>> rings;
  for (size_t r = 0; r < world; ++r)
    rings.push_back(std::make_unique<ring_allreduce>(static_cast<int>(r), m.endpoints, options(),
                                                     r == 1 ? on_reject : ring_allreduce::reject_callback{}));

  // Rank 1's first expected chunk (segment 0 from rank 0, step 0, chunk 0), forged four ways.
  chunk_header h;
  h.cluster_id = cluster;
  h.round = 1;
  h.phase = ring_phase::all_gather;
  h.sender = 0;
  h.world_size = world;
  h.dtype = wire_dtype::sparse;
  h.total_elements = bytes;
  h.element_count = 4096;
  h.byte_count = 4096;
  h.weight = 0.5;
  const std::vector<std::byte> payload(4096, std::byte{2});
  h.checksum = runtime::crc32c(payload.data(), payload.size()) ^ 0x55;
  auto with = [&](auto&& mutate) {
    chunk_header x = h;
    mutate(x);
    return build_chunk_header(x);
  };
  const std::vector<std::vector<std::vector<std::byte>>> forged = {
      {build_chunk_header(h), payload},  // bad_checksum (wrong_step if read after the real chunk)
      {with([](chunk_header& x) { x.total_elements += 1; }), payload},       // bad_size: another message size
      {with([](chunk_header& x) { x.dtype = wire_dtype::fp32; }), payload},  // bad_dtype
      {build_chunk_header(h), std::vector<std::byte>(100)},                  // truncated payload
  };
  zmq::context_t ctx(1);
  zmq::socket_t push(ctx, zmq::socket_type::push);
  push.set(zmq::sockopt::linger, 0);
  push.connect(m.endpoints[1]);
  for (const auto& f : forged) test::send_frames(push, f);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // in rank 1's queue before the ring starts

  gather_and_check(rings, 1, bytes, weights_of(world));
  gather_and_check(rings, 2, bytes, weights_of(world));
  CATCH_CHECK(rings[1]->rejected_frames() >= forged.size());
  CATCH_CHECK(rings[0]->rejected_frames() == 0);
  CATCH_CHECK(rings[2]->rejected_frames() == 0);
  std::string text;
  {
    std::lock_guard<std::mutex> lk(mu);
    for (const auto& line : reports) text += "\n" + line;
  }
  CATCH_INFO(text);
  for (const char* reason : {"bad_size", "bad_dtype", "truncated"})
    CATCH_CHECK(text.find("\n" + std::string(reason) + ":") != std::string::npos);
  CATCH_CHECK(
      (text.find("\nbad_checksum:") != std::string::npos || text.find("\nwrong_step:") != std::string::npos));
}

CATCH_TEST_CASE("elastic ring: an allgather stalled by a dead member is redone among the survivors",
                "[integration][comm]") {
  const size_t bytes = 10000;
  const auto m = test::make_members(3);
  std::vector<std::unique_ptr<elastic_ring>> rings;
  for (uint32_t r = 0; r < 3; ++r)
    rings.push_back(std::make_unique<elastic_ring>(test::view_of(m, {0, 1, 2}, 1, r), options()));
  const auto w = weights_of(3);

  // Round 1 with all three.
  {
    std::vector<std::vector<std::byte>> messages;
    for (size_t r = 0; r < 3; ++r) messages.push_back(message_of(r, bytes, 1));
    std::vector<gathered> got(3);
    const auto codes =
        on_every_rank(3, [&](size_t r) { got[r] = rings[r]->allgather(1, messages[r].data(), bytes, w[r]); });
    const auto want = expect_of(messages, w);
    for (size_t r = 0; r < 3; ++r) {
      CATCH_CHECK(codes[r] == errc::none);
      check_gather(got[r], want);
      CATCH_CHECK(rings[r]->committed() == reduce_key{1, 0});
      CATCH_CHECK(rings[r]->last_total_weight() == want.total);
    }
  }

  // Round 2: n2 never calls (it "died"); n0 and n1 stall until the fence.
  std::vector<std::vector<std::byte>> messages{message_of(0, bytes, 2), message_of(1, bytes, 2)};
  std::vector<std::future<gathered>> calls;
  for (size_t r = 0; r < 2; ++r)
    calls.push_back(std::async(std::launch::async,
                               [&, r] { return rings[r]->allgather(2, messages[r].data(), bytes, w[r]); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CATCH_CHECK(calls[0].wait_for(std::chrono::seconds(0)) == std::future_status::timeout);
  rings[2].reset();
  for (size_t r = 0; r < 2; ++r) rings[r]->fence(2);
  for (size_t r = 0; r < 2; ++r) {
    const auto a = test::poll([&] { return rings[r]->fence_report(); });
    CATCH_REQUIRE(a.has_value());
    CATCH_CHECK(a->pending == reduce_key{2, 0});
    CATCH_CHECK_FALSE(a->have_result);
  }
  // The coordinator keeps round 1, so round 2 is gathered again among n0 and n1.
  for (uint32_t r = 0; r < 2; ++r) rings[r]->enter(test::view_of(m, {0, 1}, 2, r), reduce_key{1, 0});
  const auto want = expect_of(messages, {w[0], w[1]});
  for (size_t r = 0; r < 2; ++r) {
    CATCH_REQUIRE(calls[r].wait_for(std::chrono::seconds(20)) == std::future_status::ready);
    check_gather(calls[r].get(), want);  // rethrows a failure
    CATCH_CHECK(rings[r]->committed() == reduce_key{2, 0});
    CATCH_CHECK(rings[r]->world_size() == 2);
    CATCH_CHECK(rings[r]->last_total_weight() == want.total);
  }
}
