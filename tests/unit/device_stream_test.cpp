// models::device_stream, device_event and host_stage (issue 38's overlap): the ordering a GPU node relies
// on. Here on the CPU, whose side streams are host threads that a test can hold at a gate; scripts/gpu-check
// runs the cases without a gate on CUDA (LW_TEST_DEVICE=cuda).
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "models/device_stream.hpp"
#include "models/host_stage.hpp"
#include "tests/support/stream_gate.hpp"

using namespace longwave::models;
using longwave::test::gate;

namespace {

/// LW_TEST_DEVICE (scripts/gpu-check: cuda), else the CPU.
c10::Device device_under_test() {
  const char* d = std::getenv("LW_TEST_DEVICE");
  if (d == nullptr || std::string(d).empty() || std::string(d) == "cpu") return c10::Device(c10::kCPU);
  const c10::Device dev(d);
  return dev.has_index() ? dev : c10::Device(c10::kCUDA, 0);
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && at::equal(a, b);
}

at::Tensor values(int64_t n, const c10::Device& d, double seed) {
  return at::arange(n, at::dtype(at::kFloat)).mul_(0.25).add_(seed).to(d);
}

}  // namespace

CATCH_TEST_CASE("a CPU side stream runs its work in order, and its event is done only after that work",
                "[models][stream]") {
  const c10::Device cpu(c10::kCPU);
  auto side = device_stream::side(cpu);
  device_event e(cpu);
  CATCH_CHECK(e.query());  // never recorded: done
  e.synchronize();
  gate g;
  g.hold(*side);
  std::vector<int> order;
  side->run([&] { order.push_back(1); });
  side->run([&] { order.push_back(2); });
  e.record(*side);
  CATCH_CHECK(!e.query());  // held behind the gate: the work before the marker has not run
  g.open();
  e.synchronize();
  CATCH_CHECK(e.query());
  CATCH_CHECK(order == std::vector<int>{1, 2});

  // The compute stream of the CPU is inline: recorded there, an event is done at once.
  auto compute = device_stream::compute(cpu);
  bool ran = false;
  compute->run([&] { ran = true; });
  device_event inline_done(cpu);
  inline_done.record(*compute);
  CATCH_CHECK(ran);
  CATCH_CHECK(inline_done.query());
}

CATCH_TEST_CASE("an error on a CPU side stream reaches whoever waits for the stream, and its later work",
                "[models][stream]") {
  const c10::Device cpu(c10::kCPU);
  auto side = device_stream::side(cpu);
  bool later_ran = false;
  side->run([] { throw std::runtime_error("the copy failed"); });
  device_event e(cpu);
  e.record(*side);
  CATCH_CHECK_THROWS_WITH(e.synchronize(), "the copy failed");
  CATCH_CHECK_THROWS_WITH(side->run([&] { later_ran = true; }), "the copy failed");
  device_event again(cpu);
  again.record(*side);
  CATCH_CHECK_THROWS_WITH(again.synchronize(), "the copy failed");
  CATCH_CHECK(!later_ran);
}

CATCH_TEST_CASE("a staged copy is its source bit for bit, and is done only once the copy ran",
                "[models][stream][stage]") {
  const auto device = device_under_test();
  CATCH_INFO("device " << device);
  host_stage stage(device);
  const auto src = values(1 << 20, device, 0.5);
  gate g;
  if (device.is_cpu()) g.hold(stage.side());
  auto s = stage.stage(src);
  if (device.is_cpu()) {
    CATCH_CHECK(!s.done->query());  // the side stream is held: a reader must wait
    g.open();
  }
  s.done->synchronize();
  CATCH_CHECK(s.host.device().is_cpu());
  CATCH_CHECK(same_bits(s.host, src.cpu()));
  if (device.is_cuda()) CATCH_CHECK(s.host.is_pinned());
  // The stage kept the source until its copy was done; a caller that waited lets it go at once.
  CATCH_CHECK(src.use_count() == 2);
  stage.release_sources();
  CATCH_CHECK(src.use_count() == 1);
  CATCH_CHECK_THROWS_AS(stage.stage(src.to(at::kDouble)), std::invalid_argument);
}

CATCH_TEST_CASE("a fence keeps the source's next write behind its copy (the copy is wrong without it)",
                "[models][stream][stage]") {
  const auto device = device_under_test();
  CATCH_INFO("device " << device);
  auto src = values(device.is_cuda() ? (64 << 20) : (1 << 20), device, 1.5);
  const auto before = src.cpu().clone();
  if (device.is_cpu()) {
    // The compute stream is a host thread too, so that its write can run ahead of a copy held at a gate.
    auto compute = device_stream::side(device);
    host_stage stage(device, compute);
    gate g;
    g.hold(stage.side());
    auto s = stage.stage(src);
    stage.fence(src);
    compute->run([&] { src.fill_(7); });
    device_event written(device);
    written.record(*compute);
    // Either the fence holds the write back (the compute thread waits), or, without it, the write is done.
    while (!compute->waiting() && !written.query()) std::this_thread::yield();
    g.open();
    written.synchronize();
    s.done->synchronize();
    CATCH_CHECK(same_bits(s.host, before));
    CATCH_CHECK(same_bits(src, at::full_like(src, 7)));
  } else {
    // On a GPU the write is queued at once; without the fence it runs while the 256 MiB copy reads.
    host_stage stage(device);
    auto s = stage.stage(src);
    stage.fence(src);
    src.fill_(7);
    s.done->synchronize();
    CATCH_CHECK(same_bits(s.host, before));
    CATCH_CHECK(same_bits(src.cpu(), at::full({src.numel()}, 7.0F)));
  }
}

CATCH_TEST_CASE(
    "a fence waits for its own source's copies only: another source's copy in flight holds nothing",
    "[models][stream][stage]") {
  // A worker's state leaves while its next round runs: the round's writes to delta_dev_ (fenced) must not
  // wait for it, and an Adam moment's next update (fenced on it) must. The CPU's compute stream is a host
  // thread here, as above.
  const auto device = device_under_test();
  if (!device.is_cpu()) return;  // a CUDA stream cannot be held at a gate; the fence's order is tested above
  auto compute = device_stream::side(device);
  host_stage stage(device, compute);
  auto delta = values(1 << 16, device, 0.5), moment = values(1 << 16, device, 2.5);
  auto d = stage.stage(delta);
  d.done->synchronize();  // the pseudo-gradient's copy, waited for
  gate g;
  g.hold(stage.side());
  auto c = stage.stage(moment);  // the state's copy, held in flight
  stage.fence(delta);
  compute->run([&] { delta.fill_(7); });
  device_event written(device);
  written.record(*compute);
  while (!compute->waiting() && !written.query()) std::this_thread::yield();
  CATCH_CHECK(written.query());  // the write ran, the copy still held
  CATCH_CHECK_FALSE(c.done->query());
  // A fence on the moment does hold the compute stream.
  stage.fence(moment);
  compute->run([&] { moment.fill_(7); });
  written.record(*compute);
  while (!compute->waiting() && !written.query()) std::this_thread::yield();
  CATCH_CHECK(compute->waiting());
  g.open();
  written.synchronize();
  c.done->synchronize();
  CATCH_CHECK(same_bits(c.host, values(1 << 16, device, 2.5)));
}

CATCH_TEST_CASE("a host buffer is reused once its reader lets it go, and never while it is held",
                "[models][stream][stage]") {
  const auto device = device_under_test();
  CATCH_INFO("device " << device);
  host_stage stage(device);
  const auto a = values(4096, device, 1), b = values(4096, device, 2), c = values(1024, device, 3);
  auto first = stage.stage(a);
  first.done->synchronize();
  auto view = first.host.narrow(0, 10, 100);  // a view holds the buffer too
  first.host = at::Tensor();
  auto second = stage.stage(b);
  second.done->synchronize();
  CATCH_CHECK(stage.buffers() == 2);
  CATCH_CHECK(same_bits(view, a.cpu().narrow(0, 10, 100)));  // not overwritten
  view = at::Tensor();
  second.host = at::Tensor();
  auto third = stage.stage(c);  // a smaller copy takes a free larger buffer
  third.done->synchronize();
  CATCH_CHECK(stage.buffers() == 2);
  CATCH_CHECK(same_bits(third.host, c.cpu()));
}
