// The communicator through comm::collective: a test double sees exactly what the communicator asks of any
// backend, and two communicators on a loopback ring average their nodes' contributions by worker count.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "actors/communicator.hpp"
#include "comm/collective.hpp"
#include "comm/ring_allreduce.hpp"
#include "comm/sparse_error_feedback.hpp"
#include "comm/sparse_sum.hpp"
#include "runtime/messages/interfaces.hpp"
#include "tests/support/process.hpp"

using namespace longwave;
using comm::wire_dtype;

namespace {

struct lw_config : caf::actor_system_config {
  lw_config() { add_message_types<caf::id_block::longwave>(); }
};

/// A collective that records each call and doubles the data (so a test sees its result come back).
class recording_collective final : public comm::collective {
 public:
  /// total: what last_total_weight() says (NaN: this backend does not say, as the base class).
  explicit recording_collective(size_t chunk = 3, double total = std::nan(""))
      : chunk_(chunk), total_(total) {}

  struct call {
    uint64_t round;
    uint32_t fragment;
    double weight;
    std::optional<wire_dtype> dtype;
    size_t n;
  };

  void allreduce(uint64_t round, float* data, size_t n, double weight, uint32_t fragment,
                 std::optional<wire_dtype> dtype) override {
    std::lock_guard<std::mutex> lk(mu_);
    calls_.push_back({round, fragment, weight, dtype, n});
    for (size_t i = 0; i < n; ++i) data[i] *= 2;
    bytes_ += 4 * n;
    completed_ = round;
  }
  void cancel() override {}
  void peer_declared_lost(const std::string&) override {}
  uint64_t completed_round() const override { return completed_; }
  uint64_t bytes_sent() const override { return bytes_; }
  uint64_t bytes_received() const override { return bytes_; }
  double encode_seconds() const override { return 0; }
  double decode_seconds() const override { return 0; }
  size_t chunk_elements() const override { return chunk_; }
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  const char* backend_name() const override { return "recording"; }
  double last_total_weight() const override { return total_; }

  std::vector<call> calls() const {
    std::lock_guard<std::mutex> lk(mu_);
    return calls_;
  }

 private:
  size_t chunk_;
  double total_;
  mutable std::mutex mu_;
  std::vector<call> calls_;
  uint64_t bytes_ = 0, completed_ = 0;
};

/// The communicator's answer to (reduce, {(round, part), parts, exact}).
at::Tensor reduce(caf::actor_system& sys, const runtime::communicator_actor& communicator, uint64_t round,
                  uint32_t part, std::vector<at::Tensor> parts, bool exact = false) {
  caf::scoped_actor self{sys};
  at::Tensor out;
  self->request(communicator, std::chrono::seconds(30), runtime::reduce_atom_v,
                runtime::reduce_request{{round, part}, std::move(parts), exact})
      .receive([&](runtime::reduced& r) { out = std::move(r.avg); },
               [&](caf::error& e) { throw std::runtime_error("reduce failed: " + caf::to_string(e)); });
  return out;
}

std::vector<at::Tensor> filled(std::vector<float> values, int64_t n) {
  std::vector<at::Tensor> parts;
  for (float v : values) parts.push_back(at::full({n}, v, at::kFloat));
  return parts;
}

}  // namespace

CATCH_TEST_CASE("The communicator hands any collective the round, fragment, worker weight and wire dtype",
                "[integration][communicator]") {
  lw_config cfg;
  caf::actor_system sys{cfg};
  auto coll = std::make_shared<recording_collective>();
  actors::communicator_options o;
  o.collective = coll;
  o.reduction.dtype = wire_dtype::bf16;
  auto communicator = actors::spawn_communicator(sys, o);

  // Two workers: local mean 2, then the collective's result (doubled).
  auto a = reduce(sys, communicator, 1, 0, filled({1, 3}, 5));
  CATCH_CHECK(at::equal(a, at::full({5}, 4.0f)));
  // Parameters (exact): fp32 on the wire whatever comm.dtype is.
  auto b = reduce(sys, communicator, 2, 7, filled({1, 1, 4}, 2), true);
  CATCH_CHECK(at::equal(b, at::full({2}, 4.0f)));
  const auto calls = coll->calls();
  CATCH_REQUIRE(calls.size() == 2);
  CATCH_CHECK(calls[0].round == 1);
  CATCH_CHECK(calls[0].fragment == 0);
  CATCH_CHECK(calls[0].weight == 2.0);
  CATCH_CHECK(calls[0].dtype == wire_dtype::bf16);
  CATCH_CHECK(calls[0].n == 5);
  CATCH_CHECK(calls[1].round == 2);
  CATCH_CHECK(calls[1].fragment == 7);
  CATCH_CHECK(calls[1].weight == 3.0);
  CATCH_CHECK(calls[1].dtype == wire_dtype::fp32);
  caf::anon_send_exit(communicator, caf::exit_reason::user_shutdown);
}

CATCH_TEST_CASE(
    "In one process int8 and fp16 round the workers' mean in the ring's chunks, as one node would",
    "[integration][communicator]") {
  lw_config cfg;
  caf::actor_system sys{cfg};
  const auto x = at::linspace(-1.0, 1.0, 1000, at::kFloat), y = at::sin(at::arange(1000, at::kFloat));
  const auto exact_mean = (x + y) / 2;
  for (auto dt : {wire_dtype::int8, wire_dtype::fp16}) {
    CATCH_INFO(config::to_string(dt));
    actors::communicator_options o;
    o.reduction.dtype = dt;
    o.local.chunk_bytes = 256;  // several chunks, each with its own int8 scale
    auto communicator = actors::spawn_communicator(sys, o);
    const auto got = reduce(sys, communicator, 1, 0, {x.clone(), y.clone()});
    // The mean in fp32, then through the codec chunk by chunk, as a ring of one rank does.
    comm::ring_options ro;
    ro.dtype = dt;
    ro.chunk_bytes = 256;
    const size_t chunk = comm::elements_per_chunk(ro);
    CATCH_REQUIRE(chunk < 1000);
    auto coded = [&](at::Tensor t, size_t piece) {
      t = t.clone();
      float* p = t.data_ptr<float>();
      for (size_t off = 0; off < 1000; off += piece) {
        const size_t m = std::min<size_t>(piece, 1000 - off);
        std::vector<std::byte> wire(comm::encoded_size(dt, m));
        comm::encode(dt, p + off, m, wire.data());
        CATCH_REQUIRE(comm::decode(dt, wire.data(), wire.size(), m, p + off));
      }
      return t;
    };
    CATCH_CHECK(at::equal(got, coded(exact_mean, chunk)));
    if (dt == wire_dtype::int8) CATCH_CHECK_FALSE(at::equal(got, coded(exact_mean, 1000)));  // chunks count
    CATCH_CHECK_FALSE(at::equal(got, exact_mean));                      // it was rounded ...
    CATCH_CHECK((got - exact_mean).abs().max().item<float>() < 0.01f);  // ... a little
    // Parameters (exact) and a tensor held elsewhere are not touched.
    const auto held = x.clone();
    const auto p = reduce(sys, communicator, 2, 1, {held}, true);
    CATCH_CHECK(at::equal(p, x));
    const auto held_delta = y.clone();
    (void)reduce(sys, communicator, 3, 0, {held_delta});
    CATCH_CHECK(at::equal(held_delta, y));
    // Labels must increase, in one process as on a ring.
    CATCH_CHECK_THROWS_WITH(reduce(sys, communicator, 3, 0, {y.clone()}),
                            Catch::Contains("does not follow round 3"));
    caf::anon_send_exit(communicator, caf::exit_reason::user_shutdown);
  }
}

CATCH_TEST_CASE(
    "The workers' mean taken where they are leaves through one staged copy, bit for bit the host's",
    "[integration][communicator][stage]") {
  // On the CPU with stage_mean the GPU's way runs: the mean where the parts are, one copy through a stage.
  // LW_TEST_DEVICE (scripts/gpu-check: cuda) puts the parts on that device.
  const char* env = std::getenv("LW_TEST_DEVICE");
  const c10::Device device(env != nullptr && *env != '\0' ? env : "cpu");
  const int64_t n = 4099;
  std::vector<at::Tensor> parts;
  for (int m = 0; m < 3; ++m)
    parts.push_back(at::sin(at::arange(n, at::kFloat) * (0.3f + 0.17f * m)).to(device));
  const auto host_mean =
      ((parts[0] + parts[1] + parts[2]) / 3.0).cpu();  // the host path's ops, in rank order
  std::unique_ptr<models::host_stage> stage;
  auto kept = parts;  // the test's own handles: the parts are not written
  auto mean = actors::staged_mean(stage, parts);
  CATCH_REQUIRE(stage);
  CATCH_CHECK(at::equal(mean, host_mean));
  CATCH_CHECK(stage->buffers() == 1);
  for (size_t m = 0; m < 3; ++m) {
    CATCH_CHECK(kept[m].use_count() == 2);  // kept and parts: staged_mean let its copies go
    CATCH_CHECK(mean.data_ptr() != kept[m].data_ptr());
  }
  const void* buffer = mean.data_ptr();
  mean = at::Tensor();  // let go: the next mean reuses the buffer
  auto again = actors::staged_mean(stage, {parts[2], parts[0]});
  CATCH_CHECK(again.data_ptr() == buffer);
  CATCH_CHECK(at::equal(again, ((parts[2] + parts[0]) / 2.0).cpu()));
  CATCH_CHECK(at::equal(actors::staged_mean(stage, {parts[1]}), parts[1].cpu()));  // one worker: its own

  // Through the actor: the same bits, and the collective still weighs the node by its three workers.
  lw_config cfg;
  caf::actor_system sys{cfg};
  std::vector<at::Tensor> outs;
  for (const bool staged : {false, true}) {
    auto coll = std::make_shared<recording_collective>();
    actors::communicator_options o;
    o.collective = coll;
    o.stage_mean = staged;
    auto communicator = actors::spawn_communicator(sys, o);
    std::vector<at::Tensor> copies;
    for (const auto& p : parts) copies.push_back(p.cpu().clone());
    outs.push_back(reduce(sys, communicator, 1, 0, std::move(copies)));
    const auto calls = coll->calls();
    CATCH_REQUIRE(calls.size() == 1);
    CATCH_CHECK(calls[0].weight == 3.0);
    caf::anon_send_exit(communicator, caf::exit_reason::user_shutdown);
  }
  const auto cpu_mean = (parts[0].cpu() + parts[1].cpu() + parts[2].cpu()) / 3.0;
  CATCH_CHECK(at::equal(outs[0], cpu_mean * 2));  // the recording collective doubles
  CATCH_CHECK(at::equal(outs[1], outs[0]));
}

CATCH_TEST_CASE("Every node of weight 0: the communicator refuses it unless client sampling allows nothing",
                "[integration][communicator]") {
  lw_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  // What a communicator over a collective whose total weight is `total` answers: "empty", "average", or its
  // error.
  auto answer_of = [&](double total) {
    actors::communicator_options o;
    o.collective = std::make_shared<recording_collective>(3, total);
    auto communicator = actors::spawn_communicator(sys, o);
    return [&, communicator](uint64_t round, double weight, bool empty_ok) {
      std::string out;
      runtime::reduce_request req{{round, 0}, filled({0}, 4), false, weight, empty_ok};
      self->request(communicator, std::chrono::seconds(30), runtime::reduce_atom_v, std::move(req))
          .receive([&](runtime::reduced& r) { out = r.empty ? "empty" : "average"; },
                   [&](caf::error& e) { out = caf::to_string(e); });
      return out;
    };
  };
  auto answer = answer_of(0.0);
  CATCH_CHECK(answer(1, 0.0, false).find("round 1: every node contributed weight 0") != std::string::npos);
  CATCH_CHECK(answer(2, 0.0, true) == "empty");
  CATCH_CHECK(answer(3, 1.0, true) == "average");  // this node's weight counts: not empty
  // A backend that does not say its total: a node of weight 0 (a joiner observing) only relays.
  CATCH_CHECK(answer_of(std::nan(""))(1, 0.0, false) == "average");
}

CATCH_TEST_CASE("In one process the sparse codec codes the workers' mean once, with one residual per part",
                "[integration][communicator]") {
  lw_config cfg;
  caf::actor_system sys{cfg};
  const int64_t n = 3000;
  const auto x = at::sin(at::arange(n, at::kFloat) * 0.37f), y = at::cos(at::arange(n, at::kFloat) * 0.11f);
  actors::communicator_options o;
  o.reduction.dtype = wire_dtype::sparse;
  o.reduction.sparse.chunk = 512;
  o.reduction.sparse.density = 0.05;
  o.reduction.ef_decay = 0.9f;
  auto communicator = actors::spawn_communicator(sys, o);
  // What one node does: error feedback encodes the mean, the all-gather of one message decodes it.
  comm::sparse_error_feedback ef(static_cast<size_t>(n), 0.9f);
  auto node = [&](const at::Tensor& mean) {
    comm::gathered g;
    g.bytes = comm::sparse_encoded_size(static_cast<size_t>(n), o.reduction.sparse);
    g.weights = {2.0};
    g.messages.resize(g.bytes);
    const auto m = mean.contiguous();
    CATCH_REQUIRE(
        ef.encode(m.data_ptr<float>(), static_cast<size_t>(n), 0, g.messages.data(), o.reduction.sparse));
    auto out = at::empty({n}, at::kFloat);
    CATCH_REQUIRE(
        comm::sparse_mean(g, static_cast<size_t>(n), o.reduction.sparse, false, out.data_ptr<float>()));
    return out;
  };
  for (uint64_t round = 1; round <= 3; ++round) {  // the residual carries over
    const auto got = reduce(sys, communicator, round, 0, {x.clone(), y.clone()});
    CATCH_CHECK(at::equal(got, node((x + y) / 2)));
    CATCH_CHECK(at::count_nonzero(got).item<int64_t>() < n / 10);
  }
  // One residual, under the part's label, and it is the node's.
  caf::scoped_actor self{sys};
  runtime::residual_map residuals;
  self->request(communicator, std::chrono::seconds(30), runtime::state_atom_v)
      .receive([&](runtime::residual_map& r) { residuals = std::move(r); },
               [&](caf::error& e) { CATCH_FAIL(caf::to_string(e)); });
  CATCH_REQUIRE(residuals.size() == 1);
  CATCH_REQUIRE(residuals.count(0) == 1);
  const auto& r = ef.residual();
  CATCH_CHECK(at::equal(residuals.at(0), at::from_blob(const_cast<float*>(r.data()), {n}, at::kFloat)));
  // A checkpoint of the older one-process path (a residual per worker, keys above 16 bits) loads without
  // them: error feedback starts afresh.
  runtime::residual_map old{{0u | (1u << 16), at::ones({n})}, {1u << 16 | 1u, at::ones({n})}};
  self->request(communicator, std::chrono::seconds(30), runtime::load_atom_v, old)
      .receive([](bool ok) { CATCH_CHECK(ok); }, [&](caf::error& e) { CATCH_FAIL(caf::to_string(e)); });
  self->request(communicator, std::chrono::seconds(30), runtime::state_atom_v)
      .receive([&](runtime::residual_map& r) { CATCH_CHECK(r.empty()); },
               [&](caf::error& e) { CATCH_FAIL(caf::to_string(e)); });
  caf::anon_send_exit(communicator, caf::exit_reason::user_shutdown);
}

CATCH_TEST_CASE("Error feedback quantizes in the collective's chunks, also when a chunk is the whole buffer",
                "[integration][communicator]") {
  lw_config cfg;
  caf::actor_system sys{cfg};
  // bf16 keeps 8 significant bits: 1 + 2^-10 is sent as 1 until the carried residual tips it to 1 + 2^-7,
  // so over the rounds what was sent adds up to what was meant.
  const float x = 1.0f + 1.0f / 1024;
  const int rounds = 8;
  // 3: the ring's int8 chunks (a short last one); SIZE_MAX: NCCL, which has no chunks.
  for (size_t chunk : {size_t{3}, SIZE_MAX}) {
    CATCH_INFO("chunk " << chunk);
    actors::communicator_options o;
    o.collective = std::make_shared<recording_collective>(chunk);
    o.reduction.dtype = wire_dtype::bf16;
    o.reduction.error_feedback = true;
    auto communicator = actors::spawn_communicator(sys, o);
    double sent = 0;
    for (int r = 1; r <= rounds; ++r) {
      auto out = reduce(sys, communicator, static_cast<uint64_t>(r), 0, filled({x}, 7)) / 2;  // undo double
      CATCH_CHECK(at::equal(out, at::full({7}, out[0].item<float>())));
      sent += out[0].item<float>();
    }
    CATCH_CHECK(std::abs(sent - rounds * static_cast<double>(x)) <= 1.0 / 128);
    CATCH_CHECK(sent != rounds * 1.0);  // without the residual every round would send exactly 1
    caf::anon_send_exit(communicator, caf::exit_reason::user_shutdown);
  }
}

CATCH_TEST_CASE("Two communicators on a loopback ring get the worker-weighted mean through the interface",
                "[integration][communicator]") {
  lw_config cfg;
  caf::actor_system sys{cfg};
  const int p0 = test::free_port();
  const int p1 = test::free_port();
  const std::vector<std::string> eps{"tcp://127.0.0.1:" + std::to_string(p0),
                                     "tcp://127.0.0.1:" + std::to_string(p1)};
  comm::ring_options ro;
  ro.timeout = std::chrono::milliseconds(20000);
  std::vector<std::shared_ptr<comm::collective>> rings;
  std::vector<runtime::communicator_actor> communicators;
  for (int r = 0; r < 2; ++r) {
    rings.push_back(std::make_shared<comm::ring_allreduce>(r, eps, ro));
    actors::communicator_options o;
    o.collective = rings.back();
    communicators.push_back(actors::spawn_communicator(sys, o));
  }
  // Node 0 has two workers (mean 2, weight 2), node 1 one (5, weight 1): (2 * 2 + 5) / 3 = 3 on both.
  const int64_t n = 100000;  // several chunks
  at::Tensor out0, out1;
  std::thread t1([&] { out1 = reduce(sys, communicators[1], 1, 0, filled({5}, n)); });
  out0 = reduce(sys, communicators[0], 1, 0, filled({1, 3}, n));
  t1.join();
  CATCH_CHECK(at::equal(out0, at::full({n}, 3.0f)));
  CATCH_CHECK(at::equal(out0, out1));
  for (const auto& ring : rings) {
    CATCH_CHECK(ring->completed_round() == 1);
    CATCH_CHECK(ring->bytes_sent() > 0);
    CATCH_CHECK(std::string(ring->backend_name()) == "ring");
  }
  for (auto& c : communicators) caf::anon_send_exit(c, caf::exit_reason::user_shutdown);
}
