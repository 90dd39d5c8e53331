// models::inner_trainer at its host boundary (issue 36): what goes in and out is fp32 on the host whatever
// the device, micro-batches add up to the whole batch, and a state written to a checkpoint file and read back
// continues bit for bit. The device here is the CPU; scripts/gpu-check runs the same paths on CUDA, and the
// deferred loss there (LW_TEST_DEVICE=cuda).
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "models/device.hpp"
#include "models/gpt.hpp"
#include "models/inner_trainer.hpp"
#include "runtime/checkpoint/checkpoint_store.hpp"
#include "runtime/checkpoint/snapshot_codec.hpp"
#include "runtime/errors/errors.hpp"
#include "tests/support/stream_gate.hpp"

using namespace longwave;
namespace fs = std::filesystem;

namespace {

const models::model_spec spec = models::preset_spec("tiny", 64, 16);

std::shared_ptr<const std::vector<uint16_t>> tokens() {
  std::vector<uint16_t> t(20000);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>((i * 7 + i / 5) % 64);
  return std::make_shared<const std::vector<uint16_t>>(std::move(t));
}

/// LW_TEST_DEVICE (scripts/gpu-check: cuda), else the CPU; on CUDA deterministic, as train.deterministic.
std::string device_under_test() {
  const char* d = std::getenv("LW_TEST_DEVICE");
  if (d == nullptr || std::string(d).empty() || std::string(d) == "cpu") return "cpu";
  models::use_deterministic_kernels();
  return d;
}

std::unique_ptr<models::inner_trainer> trainer(int64_t micro_batches = 1, const std::string& device = "cpu",
                                               bool stage_delta = false, bool device_delta = false) {
  models::inner_options o;
  o.device = device;
  o.stage_delta = stage_delta;
  o.device_delta = device_delta;
  o.batch_size = 4;
  o.warmup_steps = 2;
  o.total_steps = 20;
  o.micro_batches = micro_batches;
  auto t = std::make_unique<models::inner_trainer>(spec, o, tokens(),
                                                   std::vector<models::data::token_span>{{0, 20000}}, 0, 7);
  t->set_params(models::gpt::init_flat(spec, 7));
  return t;
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && at::equal(a, b);
}

}  // namespace

CATCH_TEST_CASE("a step's loss is read during the next step: the same losses as steps read at once",
                "[models][trainer]") {
  const auto device = device_under_test();  // on CUDA: the pinned batches, their events and the loss copies
  CATCH_INFO("device " << device);
  auto a = trainer(1, device), b = trainer(1, device);
  CATCH_CHECK(!b->take_pending_loss().has_value());  // nothing queued yet
  CATCH_CHECK(!b->step_async().has_value());         // the first step has no step before it
  float expected = a->step();
  for (int i = 1; i < 4; ++i) {
    const auto previous = b->step_async();
    CATCH_REQUIRE(previous.has_value());
    CATCH_CHECK(*previous == expected);  // same data, same arithmetic, bit for bit
    expected = a->step();
  }
  const auto last = b->take_pending_loss();
  CATCH_REQUIRE(last.has_value());
  CATCH_CHECK(*last == expected);
  CATCH_CHECK(!b->take_pending_loss().has_value());  // read once
  CATCH_CHECK(same_bits(a->master().cpu(), b->master().cpu()));
  CATCH_CHECK(b->steps_done() == 4);
}

CATCH_TEST_CASE("a staged pseudo-gradient is theta - master bit for bit, in host buffers reused once let go",
                "[models][trainer][stage]") {
  // On the CPU with stage_delta the GPU's way out runs: a device buffer, a side stream, a host buffer.
  const auto device = device_under_test();
  CATCH_INFO("device " << device);
  auto t = trainer(1, device, /*stage_delta=*/true);
  const auto theta = models::gpt::init_flat(spec, 7);
  t->step();
  auto d1 = t->pseudo_gradient(theta);
  CATCH_CHECK(d1.device().is_cpu());
  CATCH_CHECK(same_bits(d1, theta - t->master().cpu()));
  CATCH_CHECK(d1.abs().max().item<float>() > 0);
  CATCH_CHECK(t->staged_buffers() == 1);
  const auto d1_bits = d1.clone();
  t->step();
  auto d2 = t->pseudo_gradient(theta);  // d1 still held: a second buffer, d1 untouched
  CATCH_CHECK(t->staged_buffers() == 2);
  CATCH_CHECK(same_bits(d1, d1_bits));
  CATCH_CHECK(same_bits(d2, theta - t->master().cpu()));
  CATCH_CHECK(!same_bits(d1, d2));
  d1 = at::Tensor();
  d2 = at::Tensor();
  for (int round = 0; round < 3; ++round) {  // let go each round: no buffer more
    t->step();
    const auto d = t->pseudo_gradient(theta);
    CATCH_CHECK(same_bits(d, theta - t->master().cpu()));
  }
  CATCH_CHECK(t->staged_buffers() == 2);
  auto plain = trainer(1, device);
  (void)plain->pseudo_gradient(theta);
  CATCH_CHECK(plain->staged_buffers() == (device == "cpu" ? 0U : 1U));  // a GPU always stages
}

CATCH_TEST_CASE(
    "a node's pseudo-gradient stays on the device, theta - master bit for bit, never written "
    "while the node's mean holds it",
    "[models][trainer][stage]") {
  const auto device = device_under_test();
  CATCH_INFO("device " << device);
  auto t = trainer(1, device, /*stage_delta=*/true, /*device_delta=*/true);
  const auto theta = models::gpt::init_flat(spec, 7);
  const models::flat_ranges whole{{0, theta.numel()}};
  t->step();
  auto d1 = t->node_delta(theta, whole);
  CATCH_CHECK(d1.device() == t->master().device());  // no copy: the communicator takes the mean there
  CATCH_CHECK(same_bits(d1.cpu(), theta - t->master().cpu()));
  CATCH_CHECK(t->staged_buffers() == 0);
  const auto d1_bits = d1.cpu().clone();
  t->step();
  auto d2 = t->node_delta(theta, whole);  // d1 still held (the mean reads it): another buffer, d1 untouched
  CATCH_CHECK(d2.data_ptr() != d1.data_ptr());
  CATCH_CHECK(same_bits(d1.cpu(), d1_bits));
  CATCH_CHECK(same_bits(d2.cpu(), theta - t->master().cpu()));
  const void* reused = d2.data_ptr();
  d1 = at::Tensor();
  d2 = at::Tensor();
  t->step();
  auto d3 = t->node_delta(theta, whole);  // let go: the same buffer again
  CATCH_CHECK(d3.data_ptr() == reused);
  CATCH_CHECK(same_bits(d3.cpu(), theta - t->master().cpu()));
  // A fragment: its ranges, packed, as pseudo_gradient's. d3 is held: a new buffer of the fragment's size,
  // not the model's.
  const auto ranges = models::fragment_ranges(spec, 2, /*strided=*/false)[1];
  std::vector<at::Tensor> slices;
  for (const auto& [off, len] : ranges) slices.push_back((theta - t->master().cpu()).narrow(0, off, len));
  auto f1 = t->node_delta(theta, ranges);
  CATCH_CHECK(same_bits(f1.cpu(), at::cat(slices)));
  CATCH_CHECK(f1.data_ptr() != d3.data_ptr());
  CATCH_CHECK(f1.storage().nbytes() == static_cast<size_t>(models::range_size(ranges)) * sizeof(float));
  f1 = at::Tensor();
  d3 = at::Tensor();
  // The whole model again, into a buffer too small for it (nobody holds it): a larger one.
  const auto d4 = t->node_delta(theta, whole);
  CATCH_CHECK(d4.storage().nbytes() == static_cast<size_t>(theta.numel()) * sizeof(float));
  CATCH_CHECK(same_bits(d4.cpu(), theta - t->master().cpu()));
  // Without device_delta it is pseudo_gradient's host tensor.
  auto host = trainer(1, device, /*stage_delta=*/true);
  host->step();
  const auto h = host->node_delta(theta, whole);
  CATCH_CHECK(h.device().is_cpu());
  CATCH_CHECK(host->staged_buffers() == 1);
  CATCH_CHECK(same_bits(h, theta - host->master().cpu()));
}

CATCH_TEST_CASE(
    "a staged round uploads its theta once: set_params leaves it on the device for the round's "
    "pseudo-gradient, bit for bit",
    "[models][trainer][stage]") {
  const auto device = device_under_test();
  CATCH_INFO("device " << device);
  for (const bool device_delta : {true, false}) {
    CATCH_INFO("device_delta " << device_delta);
    auto t = trainer(1, device, /*stage_delta=*/true, device_delta);
    const auto theta = models::gpt::init_flat(spec, 3);  // not the trainer's start
    const models::flat_ranges whole{{0, theta.numel()}};
    const auto master = [&] { return t->master().cpu(); };
    const size_t before = t->theta_uploads();
    t->set_params(theta);
    t->step();
    t->step();
    auto d = t->node_delta(theta, whole);
    CATCH_CHECK(t->theta_uploads() == before + 1);
    CATCH_CHECK(same_bits(d.cpu(), theta - master()));
    // The next round while the node's mean still holds d: its theta goes elsewhere, d stays as it was.
    const auto d_bits = d.cpu().clone();
    auto theta2 = theta + 0.01;
    t->set_params(theta2);
    CATCH_CHECK(same_bits(d.cpu(), d_bits));
    // theta2 changed in place since (its version moved): its values now are uploaded.
    t->step();
    theta2.add_(0.5);
    auto d2 = t->node_delta(theta2, whole);
    CATCH_CHECK(t->theta_uploads() == before + 3);
    CATCH_CHECK(same_bits(d2.cpu(), theta2 - master()));
    // Another tensor of the same values: uploaded (which tensor, not its values, says what is there).
    d = d2 = at::Tensor();
    t->set_params(theta);
    t->step();
    const auto copy = theta.clone();
    auto d3 = t->node_delta(copy, whole);
    CATCH_CHECK(t->theta_uploads() == before + 5);
    CATCH_CHECK(same_bits(d3.cpu(), copy - master()));
    // A fragment's ranges: uploaded; and the whole after it too (the fragment overwrote theta's copy).
    d3 = at::Tensor();
    t->set_params(theta);
    t->step();
    const auto ranges = models::fragment_ranges(spec, 2, /*strided=*/false)[1];
    std::vector<at::Tensor> slices;
    for (const auto& [off, len] : ranges) slices.push_back((theta - master()).narrow(0, off, len));
    auto f = t->node_delta(theta, ranges);
    CATCH_CHECK(same_bits(f.cpu(), at::cat(slices)));
    f = at::Tensor();
    auto d4 = t->node_delta(theta, whole);
    CATCH_CHECK(t->theta_uploads() == before + 8);
    CATCH_CHECK(same_bits(d4.cpu(), theta - master()));
  }
}

CATCH_TEST_CASE("a fragment's pseudo-gradient is its ranges of theta - master, packed, staged or not",
                "[models][trainer][stage]") {
  const auto device = device_under_test();
  CATCH_INFO("device " << device);
  const auto theta = models::gpt::init_flat(spec, 7);
  const auto fragments = models::fragment_ranges(spec, 2, /*strided=*/false);
  for (const bool staged : {false, true}) {
    auto t = trainer(1, device, staged);
    t->step();
    const auto whole = theta - t->master().cpu();
    for (const auto& ranges : fragments) {
      std::vector<at::Tensor> slices;
      for (const auto& [off, len] : ranges) slices.push_back(whole.narrow(0, off, len));
      const auto d = t->pseudo_gradient(theta, ranges);
      CATCH_CHECK(d.numel() == models::range_size(ranges));
      CATCH_CHECK(same_bits(d, at::cat(slices)));
    }
    CATCH_CHECK(same_bits(t->pseudo_gradient(theta), whole));
  }
}

CATCH_TEST_CASE("a state taken while a step is queued holds that step and continues bit for bit",
                "[models][trainer]") {
  // On a GPU the queued step is still running when the state is read: the copies wait for it on the
  // compute stream (issue 38: a snapshot is fenced against the GPU work in flight).
  const auto device = device_under_test();
  CATCH_INFO("device " << device);
  auto a = trainer(1, device);
  a->step();
  (void)a->step_async();
  const auto s = a->state();
  CATCH_CHECK(s.adam_steps == 2);
  CATCH_CHECK(a->take_pending_loss().has_value());
  CATCH_CHECK(same_bits(s.master, a->master().cpu()));
  auto b = trainer(1, device);
  b->load_state(s);
  for (int i = 0; i < 3; ++i) CATCH_CHECK(a->step() == b->step());
  CATCH_CHECK(same_bits(a->master().cpu(), b->master().cpu()));
}

CATCH_TEST_CASE(
    "a state copied through the stage is the live state bit for bit, kept as it was while the "
    "trainer steps on, in host buffers reused once let go",
    "[models][trainer][stage]") {
  // A GPU's snapshot (a checkpoint, a cluster's published state) copies the replica through the
  // pseudo-gradient's stage: pinned buffers, reused. The CPU with stage_delta runs the same path.
  const auto device = device_under_test();
  CATCH_INFO("device " << device);
  auto t = trainer(1, device, /*stage_delta=*/true);
  t->step();
  (void)t->step_async();  // queued: the copies wait for it
  auto s = t->state();
  const auto buffers = t->staged_buffers();
  CATCH_CHECK(buffers == 3);
  auto reference = trainer(1, device);
  reference->step();
  reference->step();
  const auto live = reference->state();
  CATCH_CHECK(same_bits(s.master, live.master));
  CATCH_CHECK(same_bits(s.exp_avg, live.exp_avg));
  CATCH_CHECK(same_bits(s.exp_avg_sq, live.exp_avg_sq));
  const auto kept = s.master.clone();
  t->step();  // the snapshot still holds its buffers: they do not change
  CATCH_CHECK(same_bits(s.master, kept));
  CATCH_CHECK(!same_bits(s.master, t->master().cpu()));
  s = t->state();  // taken while the first is still held: three more buffers
  CATCH_CHECK(same_bits(s.master, t->master().cpu()));
  const auto held = t->staged_buffers();
  CATCH_CHECK(held <= 2 * buffers);
  for (int i = 0; i < 3; ++i) {
    s = models::inner_state{};  // let go, then another: the buffers are reused
    t->step();
    s = t->state();
    CATCH_CHECK(same_bits(s.master, t->master().cpu()));
  }
  CATCH_CHECK(t->staged_buffers() == held);
}

CATCH_TEST_CASE(
    "a state copy in flight holds the state it was asked for: the next load goes on, the update waits",
    "[models][trainer][stage]") {
  // A cluster node's worker answers its published state once the copies are done, and runs the next round
  // meanwhile: the round's load writes master at once (the copy reads a clone of it), and the step's update
  // of the Adam moments waits for their copies. On the CPU the side stream is held at a gate, so the load
  // surely comes before the copies, and the step is seen waiting for them.
  const auto device = device_under_test();
  CATCH_INFO("device " << device);
  auto t = trainer(1, device, /*stage_delta=*/true);
  t->step();
  auto reference = trainer(1, device);
  reference->step();
  const auto then = reference->state();
  test::gate g;
  const bool held = device == "cpu";
  CATCH_REQUIRE(t->copy_stream() != nullptr);
  if (held) g.hold(*t->copy_stream());
  auto c = t->state_copy();
  CATCH_CHECK(c.done != nullptr);
  if (held) CATCH_CHECK_FALSE(c.ready());
  t->set_params(models::gpt::init_flat(spec, 99));  // no wait: the gate is shut
  if (held) {
    std::atomic<bool> stepped{false};
    std::thread stepper([&] {
      t->step();
      stepped = true;
    });
    while (!t->compute_stream()->waiting() && !stepped) std::this_thread::yield();
    CATCH_CHECK(t->compute_stream()->waiting());  // the update waits for the moments' copies
    g.open();
    stepper.join();
  } else {
    t->step();
  }
  c.wait();
  CATCH_CHECK(c.ready());
  CATCH_CHECK(c.state.adam_steps == 1);
  CATCH_CHECK(same_bits(c.state.master, then.master));
  CATCH_CHECK(same_bits(c.state.exp_avg, then.exp_avg));
  CATCH_CHECK(same_bits(c.state.exp_avg_sq, then.exp_avg_sq));
  CATCH_CHECK_FALSE(same_bits(c.state.master, t->master().cpu()));
  CATCH_CHECK(t->state().adam_steps == 2);
  // Not staged (the CPU without stage_delta): state()'s copy, ready at once.
  const auto plain = reference->state_copy();
  if (device == "cpu") CATCH_CHECK((plain.done == nullptr && plain.ready()));
  plain.wait();
  CATCH_CHECK(same_bits(plain.state.master, then.master));
}

CATCH_TEST_CASE("the trainer hands out fp32 host tensors: theta - master, the gradient and its state",
                "[models][trainer]") {
  auto t = trainer();
  const auto theta = models::gpt::init_flat(spec, 7);
  for (int i = 0; i < 3; ++i) t->step();
  const auto delta = t->pseudo_gradient(theta);
  CATCH_CHECK(delta.device().is_cpu());
  CATCH_CHECK(delta.scalar_type() == at::kFloat);
  CATCH_CHECK(same_bits(delta, theta - t->master()));
  CATCH_CHECK(delta.abs().max().item<float>() > 0);  // the steps moved the replica
  t->compute_grad();
  CATCH_CHECK(t->grad().device().is_cpu());
  const auto s = t->state();
  for (const auto* x : {&s.master, &s.exp_avg, &s.exp_avg_sq}) {
    CATCH_CHECK(x->device().is_cpu());
    CATCH_CHECK(x->scalar_type() == at::kFloat);
  }
  CATCH_CHECK(s.adam_steps == 3);
}

CATCH_TEST_CASE("micro-batches add up to the whole batch's gradient and loss", "[models][trainer]") {
  auto whole = trainer(1), parts = trainer(2), quarters = trainer(4);
  const float l1 = whole->compute_grad(), l2 = parts->compute_grad(), l4 = quarters->compute_grad();
  CATCH_CHECK(l2 == Approx(l1).epsilon(1e-5));
  CATCH_CHECK(l4 == Approx(l1).epsilon(1e-5));
  const auto g = whole->grad();
  const double scale = g.abs().max().item<double>();
  CATCH_CHECK((parts->grad() - g).abs().max().item<double>() < 1e-5 * scale);
  CATCH_CHECK((quarters->grad() - g).abs().max().item<double>() < 1e-5 * scale);
}

CATCH_TEST_CASE("a trainer's state written to a checkpoint file and read back continues bit for bit",
                "[models][trainer]") {
  const auto dir = fs::temp_directory_path() / ("lw_trainer_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto a = trainer();
  for (int i = 0; i < 5; ++i) a->step();
  runtime::train_snapshot snap;
  snap.round = 1;
  snap.step = 5;
  snap.theta = a->master().clone();
  const auto is = a->state();
  runtime::replica_state r;
  r.master = is.master, r.exp_avg = is.exp_avg, r.exp_avg_sq = is.exp_avg_sq;
  r.adam_steps = is.adam_steps, r.sampler_position = is.sampler_position;
  snap.replicas.push_back(r);
  const runtime::snapshot_shape shape{models::closed_form_param_count(spec), 1, "diloco", "tiny"};
  {
    runtime::checkpoint_store store(dir.string(), 1);
    store.write(runtime::to_checkpoint(snap, shape));
  }
  // Counters a run cannot write (a file edited behind the checksum's back) are refused, naming the blob.
  for (const int which : {0, 1, 2}) {
    auto bent = snap;
    bent.replicas[0].adam_steps = which == 0 ? -5 : r.adam_steps;
    bent.replicas[0].sampler_position = which == 1 ? ~uint64_t{0} : r.sampler_position;  // -1 on disk
    bent.replicas[0].steps_in_round = which == 2 ? -1 : 0;
    CATCH_CHECK_THROWS_WITH(runtime::from_checkpoint(runtime::to_checkpoint(bent, shape), shape),
                            Catch::Matchers::Contains("'replica0/counters' hold a negative count"));
  }
  // And counts no run reaches: 2^62 loaded, then overflowed the tokens a resume derives (a probe).
  for (const int which : {0, 1, 2}) {
    auto bent = snap;
    const int64_t huge = int64_t{1} << 62;
    bent.replicas[0].adam_steps = which == 0 ? huge : r.adam_steps;
    bent.replicas[0].sampler_position = which == 1 ? uint64_t{1} << 62 : r.sampler_position;
    bent.replicas[0].steps_in_round = which == 2 ? huge : 0;
    CATCH_CHECK_THROWS_WITH(runtime::from_checkpoint(runtime::to_checkpoint(bent, shape), shape),
                            Catch::Matchers::Contains("'replica0/counters' hold a count no run reaches"));
  }
  // So are values no run writes (the checkpointer refuses a diverged state), naming the tensor.
  for (const bool in_theta : {true, false}) {
    auto bent = snap;
    bent.theta = snap.theta.clone();
    bent.replicas[0].exp_avg_sq = r.exp_avg_sq.clone();
    (in_theta ? bent.theta : bent.replicas[0].exp_avg_sq)[3] = in_theta ? NAN : INFINITY;
    CATCH_CHECK_THROWS_WITH(
        runtime::from_checkpoint(runtime::to_checkpoint(bent, shape), shape),
        Catch::Matchers::Contains(in_theta ? "'theta' holds NaN or infinite values"
                                           : "'replica0/exp_avg_sq' holds NaN or infinite"));
  }
  auto loaded = runtime::from_checkpoint(*runtime::checkpoint_store(dir.string(), 1).load_latest(), shape);
  const auto& lr = loaded.replicas.at(0);
  auto b = trainer();
  b->load_state({lr.master, lr.exp_avg, lr.exp_avg_sq, lr.adam_steps, lr.sampler_position});
  CATCH_CHECK(same_bits(b->master(), a->master()));
  for (int i = 0; i < 3; ++i) CATCH_CHECK(b->step() == a->step());  // same data, same arithmetic
  CATCH_CHECK(same_bits(b->master(), a->master()));
  fs::remove_all(dir);
}

CATCH_TEST_CASE("an async checkpoint keeps its version and DN buffer, and resumes only under async",
                "[models][trainer][async]") {
  const int64_t n = 6;
  runtime::train_snapshot snap;
  snap.round = 3;
  snap.theta = at::arange(n, at::kFloat);
  snap.momentum = at::full({n}, 0.5f);
  snap.dn_buffer = at::full({n}, -0.25f);
  snap.version = 17;
  const runtime::snapshot_shape async_shape{n, 0, "diloco", "tiny", "async"};
  auto c = runtime::to_checkpoint(snap, async_shape);
  auto back = runtime::from_checkpoint(runtime::checkpoint(c), async_shape);
  CATCH_CHECK(back.version == 17);
  CATCH_CHECK(same_bits(back.dn_buffer, snap.dn_buffer));
  CATCH_CHECK(same_bits(back.momentum, snap.momentum));
  // Under another policy, and the other way round: refused, naming both.
  for (const char* other : {"sync", "delayed"}) {
    const runtime::snapshot_shape shape{n, 0, "diloco", "tiny", other};
    try {
      (void)runtime::from_checkpoint(runtime::checkpoint(c), shape);
      CATCH_FAIL("an async checkpoint resumed under " << other);
    } catch (const longwave::lw_error& e) {
      CATCH_CHECK_THAT(e.what(), Catch::Matchers::Contains("diloco.outer = \"async\", this run is \"" +
                                                           std::string(other) + "\""));
    }
    auto sync = runtime::to_checkpoint(snap, shape);
    CATCH_CHECK_THROWS_WITH(runtime::from_checkpoint(std::move(sync), async_shape),
                            Catch::Matchers::Contains("this run is \"async\""));
  }
}

CATCH_TEST_CASE("a checkpoint keeps how the cluster split its data, and a resume under another split says so",
                "[models][trainer][checkpoint]") {
  runtime::train_snapshot snap;
  snap.round = 2;
  snap.theta = at::zeros({4});
  // Node n1 of 3 nodes of 2 workers: parts 2..3 of 6.
  runtime::snapshot_shape then{4, 0, "diloco", "tiny"};
  then.n_replicas = 2, then.data_parts = 6, then.rank_offset = 2;
  const auto meta = runtime::to_checkpoint(snap, then).meta;
  CATCH_CHECK(runtime::split_change(meta, then).empty());
  // n0 removed from the file: 4 parts, and n1 reads parts 0..1.
  auto now = then;
  now.data_parts = 4, now.rank_offset = 0;
  const auto moved = runtime::split_change(meta, now);
  CATCH_CHECK_THAT(moved,
                   Catch::Matchers::Contains("this node's workers read parts 2..3 of 6 of the training "
                                             "data when the checkpoint was written, and now parts 0..1 "
                                             "of 4"));
  CATCH_CHECK_THAT(moved, Catch::Matchers::Contains("no longer an exact resume"));
  // The same parts at another offset (nodes reordered) also moves the data.
  now.data_parts = 6, now.rank_offset = 4;
  CATCH_CHECK_THAT(runtime::split_change(meta, now), Catch::Matchers::Contains("and now parts 4..5 of 6"));
  // One process alone records its own split; checkpoints of older builds record none and are not judged.
  runtime::snapshot_shape alone{4, 1, "diloco", "tiny"};
  alone.data_parts = 1;
  CATCH_CHECK(runtime::split_change(runtime::to_checkpoint(snap, alone).meta, alone).empty());
  CATCH_CHECK(runtime::split_change(
                  runtime::to_checkpoint(snap, runtime::snapshot_shape{4, 0, "diloco", "tiny"}).meta, now)
                  .empty());
}

CATCH_TEST_CASE("a checkpoint carries its run's tokenizer, and a resume with another is refused naming both",
                "[models][trainer][checkpoint]") {
  runtime::train_snapshot snap;
  snap.round = 2;
  snap.theta = at::zeros({4});
  runtime::snapshot_shape shape{4, 0, "diloco", "tiny"};
  shape.tokenizer = "bpe vocab=300 crc32c=0000abcd";
  shape.tokenizer_text = std::make_shared<const std::string>("longwave-bpe 1\nmerges\n");
  const auto c = runtime::to_checkpoint(snap, shape);
  const auto* blob = c.find("tokenizer");
  CATCH_REQUIRE(blob != nullptr);
  CATCH_CHECK(std::string(static_cast<const char*>(blob->data), blob->size) == *shape.tokenizer_text);
  CATCH_CHECK(runtime::parse_meta(c.meta).at("tokenizer") == shape.tokenizer);
  CATCH_CHECK(runtime::shape_problem(c, shape).empty());
  // Another tokenizer is named before the parameter count it also changes.
  auto other = shape;
  other.tokenizer = "bpe vocab=280 crc32c=1234abcd";
  other.n_params = 5;
  CATCH_CHECK_THAT(runtime::shape_problem(c, other),
                   Catch::Matchers::StartsWith("checkpoint was trained with the tokenizer 'bpe vocab=300 "
                                               "crc32c=0000abcd', this run prepared 'bpe vocab=280"));
  // A run without one (shards with no tokenizer.txt), and an older checkpoint without one, are not judged.
  runtime::snapshot_shape none{4, 0, "diloco", "tiny"};
  CATCH_CHECK(runtime::shape_problem(c, none).empty());
  const auto older = runtime::to_checkpoint(snap, none);
  CATCH_CHECK(older.find("tokenizer") == nullptr);
  CATCH_CHECK(runtime::shape_problem(older, shape).empty());
}
