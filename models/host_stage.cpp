#include "models/host_stage.hpp"

#include <ATen/ATen.h>

#include <stdexcept>
#include <utility>

namespace longwave::models {

host_stage::host_stage(const c10::Device& device, std::shared_ptr<device_stream> compute,
                       std::shared_ptr<device_stream> side)
    : device_(device),
      compute_(compute ? std::move(compute) : device_stream::compute(device)),
      side_(side ? std::move(side) : device_stream::side(device)),
      written_(device) {}

host_stage::~host_stage() {
  // Host buffers and sources stay valid until their copies are done, whoever else still holds them. A
  // failed copy's error was its waiter's to see; a destructor must not throw it.
  for (auto& b : pool_) {
    if (!b.done) continue;
    try {
      b.done->synchronize();
    } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch)
    }
  }
}

host_stage::buffer& host_stage::free_buffer(int64_t n) {
  buffer* best = nullptr;
  for (auto& b : pool_) {
    const bool unheld = b.host.use_count() == 1 && b.host.storage().use_count() == 1;
    if (!unheld || b.host.numel() < n || (b.done && !b.done->query())) continue;
    if (best == nullptr || b.host.numel() < best->host.numel()) best = &b;
  }
  if (best != nullptr) return *best;
  auto opts = at::dtype(at::kFloat).device(at::kCPU).pinned_memory(device_.is_cuda());
  pool_.push_back({at::empty({n}, opts), at::Tensor(), nullptr});
  return pool_.back();
}

host_stage::staged host_stage::stage(const at::Tensor& src) {
  if (src.device() != device_ || src.scalar_type() != at::kFloat || !src.is_contiguous())
    throw std::invalid_argument("host_stage: the source must be a contiguous fp32 tensor on " +
                                device_.str());
  release_sources();
  auto& b = free_buffer(src.numel());
  auto host = b.host.narrow(0, 0, src.numel()).view(src.sizes());
  auto done = std::make_shared<device_event>(device_);
  b.source = src;
  written_.record(*compute_);  // the copy waits for what the compute stream queued before it
  written_.block(*side_);
  try {
    side_->run([host, src, timer = timer_.get()]() mutable {
      if (timer) timer->start();  // on the side stream: run() made it current
      host.copy_(src, /*non_blocking=*/true);
      if (timer) timer->stop();
    });
    done->record(*side_);
  } catch (...) {
    // The copy may be queued, and b.done is an earlier one's: the buffer and the source are never let go of
    // (a held buffer is never reused).
    lost_.push_back(b.host);
    lost_.push_back(src);
    throw;
  }
  b.done = done;
  return {std::move(host), std::move(done)};
}

void host_stage::time_copies() {
  if (device_.is_cuda() && !timer_) timer_ = std::make_unique<gpu_timer>(device_.index());
}

double host_stage::last_copy_seconds() {
  return timer_ ? timer_->seconds() : -1;
}

void host_stage::release_sources() {
  for (auto& b : pool_)
    if (b.source.defined() && (!b.done || b.done->query())) b.source = at::Tensor();
}

void host_stage::fence(const at::Tensor& written) {
  release_sources();
  if (!written.defined()) return;  // nothing to write: no copy reads it
  for (auto& b : pool_)
    if (b.source.defined() && b.done && b.source.storage().is_alias_of(written.storage()))
      b.done->block(*compute_);
}

}  // namespace longwave::models
