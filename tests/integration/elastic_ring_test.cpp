// The elastic ring on real ZeroMQ sockets on loopback, every member a thread of this process and the test
// playing the coordinator: a fence parks a call that a dead member stalls, the next epoch redoes it among
// the survivors from the kept input, a call that held no result is never kept, a removed member's call
// fails with the coordinator's words, a ring failure without a fence is reported with its suspect, and every
// member learns every other's note from the calls' confirmations. The same machinery with a collective made
// per epoch at its first call from a key rank 0 makes (NCCL's way), a ring standing in for NCCL, notes
// included.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/deferred_collective.hpp"
#include "comm/elastic_ring.hpp"
#include "runtime/errors/errors.hpp"
#include "tests/support/ring_members.hpp"

using namespace longwave;
using namespace longwave::comm;

namespace {

using test::make_members;
using test::poll;
using test::view_of;

ring_options options() {
  return test::ring_test_options(0xe1a5);
}

/// Rank r's input: n values that differ per rank.
std::vector<float> input_of(size_t r, size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i)
    x[i] = static_cast<float>((r + 1) * 0.25 + static_cast<double>(i % 97) * 1e-3);
  return x;
}

/// Every ring's all-reduce of `round` at once, each on its own thread, with equal weights.
void allreduce_all(std::vector<std::unique_ptr<elastic_ring>>& rings, std::vector<std::vector<float>>& data,
                   uint64_t round, size_t n) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < data.size(); ++r)
    threads.emplace_back([&, r] { rings[r]->allreduce(round, data[r].data(), n); });
  for (auto& t : threads) t.join();
}

}  // namespace

CATCH_TEST_CASE("elastic ring: a call stalled by a dead member is redone among the survivors after a fence",
                "[elastic]") {
  const size_t n = 10000;
  const auto m = make_members(3);
  std::vector<std::unique_ptr<elastic_ring>> rings;
  for (uint32_t r = 0; r < 3; ++r)
    rings.push_back(std::make_unique<elastic_ring>(view_of(m, {0, 1, 2}, 1, r), options()));
  CATCH_CHECK(rings[0]->last_members().empty());  // before any call

  // Round 1 with all three: the mean, the same bits everywhere.
  {
    std::vector<std::vector<float>> data;
    for (size_t r = 0; r < 3; ++r) data.push_back(input_of(r, n));
    allreduce_all(rings, data, 1, n);
    for (size_t i = 0; i < n; i += 997)
      CATCH_CHECK(std::fabs(data[0][i] - (input_of(0, n)[i] + input_of(1, n)[i] + input_of(2, n)[i]) / 3) <
                  1e-6);
    CATCH_CHECK(data[0] == data[1]);
    CATCH_CHECK(data[1] == data[2]);
    for (auto& r : rings) CATCH_CHECK(r->committed() == reduce_key{1, 0});
    for (auto& r : rings) CATCH_CHECK(r->last_members() == std::vector<std::string>{"n0", "n1", "n2"});
  }

  // Round 2: n2 never calls (it "died"); n0 and n1 stall until the fence.
  std::vector<std::vector<float>> data{input_of(0, n), input_of(1, n)};
  std::vector<std::future<void>> calls;
  for (size_t r = 0; r < 2; ++r)
    calls.push_back(std::async(std::launch::async, [&, r] { rings[r]->allreduce(2, data[r].data(), n); }));
  // Both calls are in flight (however late their threads start), and stay so: n2 never calls.
  for (size_t r = 0; r < 2; ++r) CATCH_REQUIRE(poll([&] { return rings[r]->pending(); }).has_value());
  CATCH_CHECK(calls[0].wait_for(std::chrono::milliseconds(300)) == std::future_status::timeout);
  rings[2].reset();
  for (size_t r = 0; r < 2; ++r) rings[r]->fence(2);
  std::vector<comm::fence_state> acks;
  for (size_t r = 0; r < 2; ++r) {
    const auto a = poll([&] { return rings[r]->fence_report(); });
    CATCH_REQUIRE(a.has_value());
    acks.push_back(*a);
  }
  for (const auto& a : acks) {
    CATCH_CHECK(a.epoch == 2);
    CATCH_CHECK(a.committed == reduce_key{1, 0});
    CATCH_CHECK(a.has_pending);
    CATCH_CHECK(a.pending == reduce_key{2, 0});
    CATCH_CHECK_FALSE(a.have_result);  // nobody can hold a result the dead member never contributed to
  }
  CATCH_CHECK_FALSE(rings[0]->fence_report().has_value());  // once per fence
  // The coordinator keeps round 1 (everyone applied it) and so round 2 is redone among n0 and n1.
  for (uint32_t r = 0; r < 2; ++r) rings[r]->enter(view_of(m, {0, 1}, 2, r), reduce_key{1, 0});
  for (auto& c : calls) CATCH_CHECK(c.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  for (auto& c : calls) c.get();  // rethrows a failure
  for (size_t i = 0; i < n; i += 997)
    CATCH_CHECK(std::fabs(data[0][i] - (input_of(0, n)[i] + input_of(1, n)[i]) / 2) < 1e-6);
  CATCH_CHECK(data[0] == data[1]);
  for (size_t r = 0; r < 2; ++r) {
    CATCH_CHECK(rings[r]->epoch() == 2);
    CATCH_CHECK(rings[r]->world_size() == 2);
    CATCH_CHECK(rings[r]->committed() == reduce_key{2, 0});
    // The redone call's average holds the survivors' contributions only.
    CATCH_CHECK(rings[r]->last_members() == std::vector<std::string>{"n0", "n1"});
  }

  // And the next round runs in epoch 2 without further ado.
  allreduce_all(rings, data, 3, n);
  CATCH_CHECK(rings[0]->completed_round() == 3);
}

CATCH_TEST_CASE("elastic ring: rank0_weight takes the next epoch's rank 0's input when rank 0 died first",
                "[elastic]") {
  // A cluster's fresh theta_0 is rank 0's alone. n0 dies before the call: with fixed weights (n1 and n2
  // gave 0) the redone call had no weight in any epoch, and the cluster could not start.
  const size_t n = 5000;
  const auto m = make_members(3);
  std::vector<std::unique_ptr<elastic_ring>> rings;
  for (uint32_t r = 0; r < 3; ++r)
    rings.push_back(std::make_unique<elastic_ring>(view_of(m, {0, 1, 2}, 1, r), options()));
  std::vector<std::vector<float>> data{input_of(0, n), input_of(1, n), input_of(2, n)};
  std::vector<std::future<void>> calls;
  for (size_t r = 1; r < 3; ++r)
    calls.push_back(std::async(std::launch::async,
                               [&, r] { rings[r]->allreduce(0, data[r].data(), n, rank0_weight, 1); }));
  for (size_t r = 1; r < 3; ++r) CATCH_REQUIRE(poll([&] { return rings[r]->pending(); }).has_value());
  rings[0].reset();
  for (size_t r = 1; r < 3; ++r) rings[r]->fence(2);
  for (size_t r = 1; r < 3; ++r) CATCH_REQUIRE(poll([&] { return rings[r]->fence_report(); }).has_value());
  for (uint32_t r = 1; r < 3; ++r) rings[r]->enter(view_of(m, {1, 2}, 2, r - 1), reduce_key{});
  for (auto& c : calls) CATCH_CHECK(c.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  for (auto& c : calls) c.get();           // rethrows a failure
  CATCH_CHECK(data[1] == input_of(1, n));  // n1, rank 0 of epoch 2: its own input, exactly
  CATCH_CHECK(data[2] == input_of(1, n));
  CATCH_CHECK(rings[2]->last_total_weight() == 1.0);
}

CATCH_TEST_CASE("elastic ring: a removed member's call fails with the coordinator's words", "[elastic]") {
  const auto m = make_members(2);
  elastic_ring a(view_of(m, {0, 1}, 1, 0), options());
  std::vector<float> x(100, 1.0f);
  auto call = std::async(std::launch::async, [&] { a.allreduce(1, x.data(), x.size()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  a.fence(2);
  CATCH_REQUIRE(poll([&] { return a.fence_report(); }).has_value());
  a.evict("the coordinator says: this node was removed from the cluster (quorum lost)");
  CATCH_REQUIRE(call.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
  try {
    call.get();
    CATCH_FAIL("the parked call returned");
  } catch (const lw_error& e) {
    CATCH_CHECK(e.code() == errc::peer_lost);
    CATCH_CHECK(std::string(e.what()).find("quorum lost") != std::string::npos);
  }
  // Every later call fails the same way.
  CATCH_CHECK_THROWS_AS(a.allreduce(2, x.data(), x.size()), lw_error);
}

CATCH_TEST_CASE(
    "elastic ring: a neighbour that dies mid-call is reported as the suspect, then a fence heals it",
    "[elastic]") {
  const size_t n = 200000;
  const auto m = make_members(2);
  auto a = std::make_unique<elastic_ring>(view_of(m, {0, 1}, 1, 0), options());
  auto b = std::make_unique<elastic_ring>(view_of(m, {0, 1}, 1, 1), options());
  std::vector<float> x = input_of(0, n), y = input_of(1, n);
  // n1 does not take part; n0's call sends to it, and n1 goes away: n0's ring loses its next rank.
  const auto before = std::chrono::steady_clock::now();
  auto call = std::async(std::launch::async, [&] { a->allreduce(1, x.data(), n); });
  CATCH_REQUIRE(poll([&] { return a->pending(); }).has_value());  // the call is in flight
  std::this_thread::sleep_for(std::chrono::seconds(1));  // its attempt has begun (a few instructions on)
  const auto gone = std::chrono::steady_clock::now();
  b.reset();
  const auto failure = poll([&] { return a->take_failure(); });
  CATCH_REQUIRE(failure.has_value());
  CATCH_CHECK(failure->epoch == 1);
  CATCH_CHECK(failure->suspect == "n1");
  // The ring stalled when the call began, before its neighbour went, not when the failure was seen.
  CATCH_CHECK(failure->began >= before);
  CATCH_CHECK(failure->began < gone);
  CATCH_CHECK_FALSE(a->take_failure().has_value());  // reported once
  // The coordinator removes n1: n0 alone redoes the call (decode(encode(x)) = x in fp32).
  a->fence(2);
  CATCH_REQUIRE(poll([&] { return a->fence_report(); }).has_value());
  a->enter(view_of(m, {0}, 2, 0), reduce_key{});
  CATCH_REQUIRE(call.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  call.get();
  CATCH_CHECK(x == input_of(0, n));
  CATCH_CHECK(a->committed() == reduce_key{1, 0});
}

CATCH_TEST_CASE(
    "elastic ring: each call's confirmation tells every member every member's note, in rank order",
    "[elastic]") {
  const size_t n = 1000;
  const auto m = make_members(3);
  std::vector<std::unique_ptr<elastic_ring>> rings;
  for (uint32_t r = 0; r < 3; ++r)
    rings.push_back(std::make_unique<elastic_ring>(view_of(m, {0, 1, 2}, 1, r), options()));
  CATCH_CHECK(rings[0]->notes().empty());  // before any call
  // Two rounds: the second's notes replace the first's.
  for (uint64_t round = 1; round <= 2; ++round) {
    for (uint32_t r = 0; r < 3; ++r)
      rings[r]->set_note({static_cast<float>(r + 1), static_cast<float>(0.1 * (r + 1) * round)});
    std::vector<std::vector<float>> data;
    for (size_t r = 0; r < 3; ++r) data.push_back(input_of(r, n));
    std::vector<std::thread> threads;
    for (size_t r = 0; r < 3; ++r)
      threads.emplace_back(
          [&, r] { rings[r]->allreduce(round, data[r].data(), n, static_cast<double>(r + 1)); });
    for (auto& t : threads) t.join();
    for (uint32_t r = 0; r < 3; ++r) {
      const auto notes = rings[r]->notes();
      CATCH_REQUIRE(notes.size() == 3);
      for (size_t k = 0; k < 3; ++k) {
        CATCH_CHECK(notes[k].contributors == Approx(static_cast<double>(k + 1)));
        CATCH_CHECK(notes[k].step_seconds == Approx(0.1 * static_cast<double>((k + 1) * round)));
      }
    }
    // The notes ride on the confirmation: the main call's weights (1, 2, 3) still make the average.
    CATCH_CHECK(rings[0]->last_total_weight() == 6.0);
  }
  // A ring of one member knows only its own note.
  elastic_ring alone(view_of(make_members(1), {0}, 1, 0), options());
  alone.set_note({2, 0.5f});
  std::vector<float> x = input_of(0, n);
  alone.allreduce(1, x.data(), n);
  CATCH_REQUIRE(alone.notes().size() == 1);
  CATCH_CHECK(alone.notes()[0].step_seconds == 0.5f);
}

namespace {

/// NCCL's way through epochs, with a ring in NCCL's place: each epoch's collective is made at its first
/// call from a key that the epoch's rank 0 makes on entering it; the test plays the master that hands the
/// key on to the other members.
struct keyed_epochs {
  test::ring_members m;
  std::vector<std::shared_ptr<epoch_keys>> mailboxes;  // one per member
  std::mutex mu;
  std::map<uint64_t, std::string> sent;  // each epoch's key, as rank 0 sent it

  explicit keyed_epochs(size_t n) : m(make_members(n)) {
    for (size_t i = 0; i < n; ++i) mailboxes.push_back(std::make_shared<epoch_keys>());
  }

  /// Member i's factory.
  elastic_ring::epoch_factory factory(size_t i) {
    return [this, i](const epoch_view& v) -> std::shared_ptr<collective> {
      const std::string key = "communicator of epoch " + std::to_string(v.epoch);
      if (v.rank == 0) {
        mailboxes[i]->put(v.epoch, key);
        const std::lock_guard<std::mutex> lock(mu);
        sent[v.epoch] = key;
      }
      auto make = [v, key](const std::string& got,
                           const std::function<void()>&) -> std::shared_ptr<collective> {
        if (got != key) throw lw_error(errc::peer_lost, "a key of another epoch: " + got);
        auto o = options();
        o.epoch = v.epoch;
        o.names = v.names;
        return std::make_shared<ring_allreduce>(static_cast<int>(v.rank), v.endpoints, o);
      };
      return std::make_shared<deferred_collective>(static_cast<int>(v.rank), static_cast<int>(v.names.size()),
                                                   v.epoch, "keyed", SIZE_MAX, mailboxes[i], make,
                                                   std::chrono::seconds(60));
    };
  }

  /// The master: rank 0's key of `epoch` to the members `to`.
  void hand_on(uint64_t epoch, const std::vector<size_t>& to) {
    const std::lock_guard<std::mutex> lock(mu);
    for (auto i : to) mailboxes[i]->put(epoch, sent.at(epoch));
  }
};

}  // namespace

CATCH_TEST_CASE(
    "elastic collective made per epoch at its first call (NCCL's way): a dead member's call is redone in "
    "the next epoch, whose communicator waits for rank 0's key",
    "[elastic]") {
  const size_t n = 5000;
  keyed_epochs k(3);
  std::vector<std::unique_ptr<elastic_ring>> rings;
  for (uint32_t r = 0; r < 3; ++r)
    rings.push_back(std::make_unique<elastic_ring>(view_of(k.m, {0, 1, 2}, 1, r), k.factory(r),
                                                   std::chrono::seconds(20)));
  CATCH_CHECK(std::string(rings[1]->backend_name()) == "keyed");
  k.hand_on(1, {1, 2});
  std::vector<std::vector<float>> data;
  for (size_t r = 0; r < 3; ++r) data.push_back(input_of(r, n));
  allreduce_all(rings, data, 1, n);
  CATCH_CHECK(data[0] == data[2]);
  for (auto& r : rings) CATCH_CHECK(r->committed() == reduce_key{1, 0});

  // Round 2 without n2 (dead): the fence abandons the calls, epoch 2's communicator is made among n0 and n1.
  data = {input_of(0, n), input_of(1, n)};
  for (uint32_t r = 0; r < 2; ++r)
    rings[r]->set_note({static_cast<float>(r + 1), 0.5f * static_cast<float>(r + 1)});
  std::vector<std::future<void>> calls;
  for (size_t r = 0; r < 2; ++r)
    calls.push_back(std::async(std::launch::async, [&, r] { rings[r]->allreduce(2, data[r].data(), n); }));
  rings[2].reset();
  for (size_t r = 0; r < 2; ++r) rings[r]->fence(2);
  for (size_t r = 0; r < 2; ++r) CATCH_REQUIRE(poll([&] { return rings[r]->fence_report(); }).has_value());
  for (uint32_t r = 0; r < 2; ++r) rings[r]->enter(view_of(k.m, {0, 1}, 2, r), reduce_key{1, 0});
  {
    const std::lock_guard<std::mutex> lock(k.mu);
    CATCH_CHECK(k.sent.count(2) == 1);  // n0, epoch 2's rank 0, made its key on entering
  }
  // n1's redo waits for the key (n0's waits for n1 in the ring): neither call can end before it comes.
  CATCH_CHECK(calls[0].wait_for(std::chrono::seconds(0)) == std::future_status::timeout);
  CATCH_CHECK(calls[1].wait_for(std::chrono::seconds(0)) == std::future_status::timeout);
  k.hand_on(2, {1});
  for (auto& c : calls) CATCH_REQUIRE(c.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  for (auto& c : calls) c.get();
  for (size_t i = 0; i < n; i += 499)
    CATCH_CHECK(std::fabs(data[0][i] - (input_of(0, n)[i] + input_of(1, n)[i]) / 2) < 1e-6);
  CATCH_CHECK(data[0] == data[1]);
  for (size_t r = 0; r < 2; ++r) {
    CATCH_CHECK(rings[r]->committed() == reduce_key{2, 0});
    CATCH_CHECK(rings[r]->last_members() == std::vector<std::string>{"n0", "n1"});
    // The notes (adaptive steps) ride on the new epoch's confirmation, as on the ring.
    const auto notes = rings[r]->notes();
    CATCH_REQUIRE(notes.size() == 2);
    for (size_t j = 0; j < 2; ++j) {
      CATCH_CHECK(notes[j].contributors == Approx(static_cast<double>(j + 1)));
      CATCH_CHECK(notes[j].step_seconds == Approx(0.5 * static_cast<double>(j + 1)));
    }
  }
}

CATCH_TEST_CASE(
    "a collective made at its first call: a cancel ends the wait for its key, and a key that "
    "never comes fails the call naming the epoch",
    "[elastic]") {
  auto keys = std::make_shared<epoch_keys>();
  int made = 0;
  auto make = [&made](const std::string&, const std::function<void()>&) -> std::shared_ptr<collective> {
    ++made;
    return nullptr;
  };
  std::vector<float> x(16, 1.0f);
  deferred_collective waiting(1, 2, 7, "keyed", SIZE_MAX, keys, make, std::chrono::seconds(600));
  auto call = std::async(std::launch::async, [&] { waiting.allreduce(1, x.data(), x.size()); });
  waiting.cancel();
  CATCH_CHECK_THROWS_MATCHES(
      call.get(), lw_error,
      Catch::Matchers::Predicate<lw_error>([](const lw_error& e) { return e.code() == errc::cancelled; }));
  deferred_collective never(1, 2, 8, "keyed", SIZE_MAX, keys, make, std::chrono::milliseconds(100));
  keys->put(7, "an older epoch's key");
  try {
    never.allreduce(1, x.data(), x.size());
    CATCH_FAIL("the call went on without its key");
  } catch (const lw_error& e) {
    CATCH_CHECK(e.code() == errc::peer_lost);
    CATCH_CHECK_THAT(e.what(), Catch::Matchers::Contains("epoch 8"));
  }
  CATCH_CHECK(made == 0);
  CATCH_CHECK_FALSE(never.made());
  CATCH_CHECK(never.bytes_sent() == 0);
}
