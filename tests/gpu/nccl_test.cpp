// NCCL backend on a real GPU, alone and behind comm::collective (label gpu: CI compiles and links this, but
// runs it only where a GPU exists).
#include <cuda_runtime_api.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/codec.hpp"
#include "comm/deferred_collective.hpp"
#include "comm/elastic_ring.hpp"
#include "comm/nccl/nccl_allreduce.hpp"
#include "comm/nccl/nccl_collective.hpp"
#include "runtime/errors/errors.hpp"

using longwave::comm::nccl_allreduce;

CATCH_TEST_CASE("a one-rank NCCL average leaves the device buffer unchanged", "[gpu][comm]") {
  int devices = 0;
  CATCH_REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  CATCH_REQUIRE(devices > 0);
  CATCH_CHECK(nccl_allreduce::version() >= 20000);
  nccl_allreduce ar(0, 1, nccl_allreduce::unique_id(), 0);
  std::vector<float> host{1.5f, -2.0f, 3.25f};
  float* dev = nullptr;
  CATCH_REQUIRE(cudaMalloc(reinterpret_cast<void**>(&dev), host.size() * sizeof(float)) == cudaSuccess);
  cudaMemcpy(dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
  ar.average(dev, host.size());
  std::vector<float> back(host.size());
  cudaMemcpy(back.data(), dev, back.size() * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(dev);
  CATCH_CHECK(back == host);
}

CATCH_TEST_CASE("the NCCL collective averages host buffers through the collective interface", "[gpu][comm]") {
  using longwave::errc;
  using longwave::lw_error;
  using longwave::comm::wire_dtype;
  int devices = 0;
  CATCH_REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  CATCH_REQUIRE(devices > 0);
  CATCH_CHECK(longwave::comm::nccl_collective::device_problem().empty());
  longwave::comm::nccl_collective_options o;
  o.dtype = wire_dtype::bf16;
  auto nccl = std::make_unique<longwave::comm::nccl_collective>(0, 1, nccl_allreduce::unique_id(), o);
  longwave::comm::collective& c = *nccl;
  CATCH_CHECK(std::string(c.backend_name()) == "nccl");
  CATCH_CHECK(c.world_size() == 1);

  // One rank: the weighted mean is the data itself, exact in fp32.
  std::vector<float> x{1.5f, -2.0f, 3.25f, 1.0f + 1.0f / 1024};
  auto y = x;
  c.allreduce(1, y.data(), y.size(), 3.0, 0, wire_dtype::fp32);
  CATCH_CHECK(y == x);
  CATCH_CHECK(c.completed_round() == 1);
  CATCH_CHECK(c.last_total_weight() == 3.0);  // what client sampling counts its live workers by
  // bf16 (the configured dtype): rounded once, as the codec rounds.
  y = x;
  c.allreduce(2, y.data(), y.size(), 1.0, 0);
  std::vector<std::byte> wire(longwave::comm::encoded_size(wire_dtype::bf16, x.size()));
  longwave::comm::encode(wire_dtype::bf16, x.data(), x.size(), wire.data());
  std::vector<float> rounded(x.size());
  CATCH_REQUIRE(longwave::comm::decode(wire_dtype::bf16, wire.data(), wire.size(), x.size(), rounded.data()));
  CATCH_CHECK(y == rounded);
  CATCH_CHECK(c.encode_seconds() >= 0);

  // What it refuses: int8, an older round, and every call after cancel().
  auto code_of = [&](auto&& call) {
    try {
      call();
    } catch (const lw_error& e) {
      return e.code();
    }
    return errc::none;
  };
  CATCH_CHECK(code_of([&] { c.allreduce(3, y.data(), y.size(), 1.0, 0, wire_dtype::int8); }) ==
              errc::invalid_config);
  CATCH_CHECK(code_of([&] { c.allreduce(2, y.data(), y.size()); }) == errc::stale_round);
  // Weight 0 relays, as on the ring; a round in which every rank relays has no mean: zeros, total weight 0.
  CATCH_CHECK(code_of([&] { c.allreduce(4, y.data(), y.size(), 0.0); }) == errc::none);
  CATCH_CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == 0.0f; }));
  CATCH_CHECK(c.last_total_weight() == 0.0);
  CATCH_CHECK(c.completed_round() == 4);
  CATCH_CHECK(code_of([&] { c.allreduce(5, y.data(), y.size(), -1.0); }) == errc::invalid_config);
  c.cancel();
  CATCH_CHECK(code_of([&] { c.allreduce(9, y.data(), y.size()); }) == errc::cancelled);

  o.dtype = wire_dtype::int8;
  CATCH_CHECK(code_of([&] { longwave::comm::nccl_collective(0, 1, nccl_allreduce::unique_id(), o); }) ==
              errc::invalid_config);
}

CATCH_TEST_CASE("two NCCL ranks on two GPUs get the worker-weighted mean, and a rank of weight 0 relays",
                "[gpu][comm]") {
  int devices = 0;
  CATCH_REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  if (devices < 2) {
    std::cout << "LONGWAVE_TEST_SKIPPED: needs 2 GPUs, found " << devices << "\n";
    return;
  }
  const auto id = nccl_allreduce::unique_id();
  std::vector<std::vector<float>> data{std::vector<float>(1000, 2.0f), std::vector<float>(1000, 5.0f)};
  std::vector<std::string> errors(2);
  std::vector<std::vector<float>> relayed(2);
  std::vector<double> totals(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        longwave::comm::nccl_collective_options o;
        o.device = r;
        longwave::comm::nccl_collective c(r, 2, id, o);
        c.allreduce(1, data[r].data(), data[r].size(), r == 0 ? 2.0 : 1.0);  // (2 * 2 + 5) / 3 = 3
        // Rank 1 relays (weight 0: a joiner's observed round): the mean is rank 0's data.
        relayed[r] = std::vector<float>(1000, r == 0 ? 7.0f : 11.0f);
        c.allreduce(2, relayed[r].data(), relayed[r].size(), r == 0 ? 2.0 : 0.0);
        totals[r] = c.last_total_weight();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  CATCH_CHECK(errors[0].empty());
  CATCH_CHECK(errors[1].empty());
  CATCH_CHECK(data[0] == std::vector<float>(1000, 3.0f));
  CATCH_CHECK(data[0] == data[1]);
  CATCH_CHECK(relayed[0] == std::vector<float>(1000, 7.0f));
  CATCH_CHECK(relayed[1] == relayed[0]);
  CATCH_CHECK(totals == std::vector<double>{2.0, 2.0});
}

CATCH_TEST_CASE(
    "an NCCL node goes through epochs: a fence aborts its communicator, the next epoch makes a "
    "new one from a new id (one rank)",
    "[gpu][comm]") {
  using namespace longwave::comm;
  // One GPU holds one rank of a communicator: two ranks on it are refused by NCCL, so this is what runs here.
  auto keys = std::make_shared<epoch_keys>();
  int made = 0;
  auto factory = [&](const epoch_view& v) -> std::shared_ptr<collective> {
    ++made;
    keys->put(v.epoch, nccl_allreduce::unique_id());  // rank 0's id: one rank has nobody to hand it to
    return std::make_shared<deferred_collective>(
        0, 1, v.epoch, "nccl", SIZE_MAX, keys,
        [](const std::string& id, const std::function<void()>& abandon) {
          nccl_collective_options o;
          o.init_poll = abandon;  // non-blocking, as a later epoch's communicator in a node
          return std::make_shared<nccl_collective>(0, 1, id, o);
        },
        std::chrono::seconds(60));
  };
  elastic_ring node(epoch_view{1, 0, {"n0"}, {"-"}, {}}, factory, std::chrono::seconds(20));
  CATCH_CHECK(std::string(node.backend_name()) == "nccl");
  const std::vector<float> x{1.5f, -2.0f, 3.25f};
  auto y = x;
  node.allreduce(1, y.data(), y.size());
  CATCH_CHECK(y == x);
  node.fence(2);  // epoch 1's communicator is cancelled: NCCL aborts it
  auto call = std::async(std::launch::async, [&] { node.allreduce(2, y.data(), y.size()); });  // parks
  std::optional<fence_state> report;
  for (int i = 0; i < 1000 && !report; ++i) {
    report = node.fence_report();
    if (!report) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CATCH_REQUIRE(report.has_value());
  CATCH_CHECK(report->committed == reduce_key{1, 0});
  node.enter(epoch_view{2, 0, {"n0"}, {"-"}, {}}, reduce_key{1, 0});
  CATCH_REQUIRE(call.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  call.get();
  CATCH_CHECK(y == x);
  CATCH_CHECK(node.committed() == reduce_key{2, 0});
  CATCH_CHECK(node.epoch() == 2);
  CATCH_CHECK(made == 2);
}
