// The "nccl" backend: host buffer -> (scaled, encoded) device buffer -> ncclAllReduce(sum) -> host.
#include "comm/nccl/nccl_collective.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "comm/nccl/nccl_allreduce.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::comm {

namespace {

void check_cuda(cudaError_t r, const char* what) {
  if (r != cudaSuccess)
    throw lw_error(errc::peer_lost, std::string("cuda: ") + what + ": " + cudaGetErrorString(r));
}

void refuse_int8(wire_dtype dt) {
  if (dt != wire_dtype::fp32 && dt != wire_dtype::fp16 && dt != wire_dtype::bf16)
    throw lw_error(errc::invalid_config, std::string("comm.backend = \"nccl\" cannot send comm.dtype = \"") +
                                             config::to_string(dt) +
                                             "\" (NCCL reduces fp32, fp16 and bf16 only); use comm.dtype = "
                                             "\"fp32\", \"fp16\" or \"bf16\", or comm.backend = \"ring\"");
}

int64_t ns_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string nccl_collective::device_problem() {
  int n = 0;
  const cudaError_t r = cudaGetDeviceCount(&n);
  if (r != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(r);
  if (n == 0) return "no CUDA device is visible";
  return {};
}

nccl_collective::nccl_collective(int rank, int world, const std::string& unique_id_hex,
                                 nccl_collective_options opts)
    : rank_(rank), world_(world), opts_(opts) {
  refuse_int8(opts_.dtype);
  if (world < 1 || rank < 0 || rank >= world)
    throw lw_error(errc::invalid_config,
                   "nccl: rank " + std::to_string(rank) + " outside a world of " + std::to_string(world));
  std::function<void()> poll;
  if (opts_.init_poll)
    poll = [this, started = std::chrono::steady_clock::now()] {
      opts_.init_poll();
      if (std::chrono::steady_clock::now() - started > opts_.timeout)
        throw lw_error(errc::deadline_missed,
                       "nccl: the communicator's members did not all join within "
                       "comm.timeout_s (" +
                           std::to_string(opts_.timeout.count() / 1000.0) + " s)");
    };
  nccl_ = std::make_unique<nccl_allreduce>(rank, world, unique_id_hex, opts_.device, poll);
}

nccl_collective::~nccl_collective() {
  if (buffer_) cudaFree(buffer_);
}

void* nccl_collective::device_buffer(size_t bytes) {
  if (bytes <= buffer_bytes_) return buffer_;
  if (buffer_) check_cuda(cudaFree(buffer_), "cudaFree");
  buffer_ = nullptr;
  buffer_bytes_ = 0;
  check_cuda(cudaMalloc(&buffer_, bytes), "cudaMalloc");
  buffer_bytes_ = bytes;
  return buffer_;
}

void nccl_collective::check_running(std::chrono::steady_clock::time_point started) const {
  if (cancelled_.load()) throw lw_error(errc::cancelled, "nccl: all-reduce cancelled (node stopping)");
  const auto waited = std::chrono::steady_clock::now() - started;
  if (waited > opts_.timeout)
    throw lw_error(errc::deadline_missed, "nccl: all-reduce did not finish within comm.timeout_s (" +
                                              std::to_string(opts_.timeout.count() / 1000.0) +
                                              " s); the communicator is aborted");
  if (waited > opts_.stall_after) {
    std::lock_guard<std::mutex> lk(verdict_mu_);
    if (!verdict_.empty()) throw lw_error(errc::peer_lost, "nccl: all-reduce stalled; " + verdict_);
  }
}

void nccl_collective::allreduce(uint64_t round, float* data, size_t n, double weight, uint32_t fragment,
                                std::optional<wire_dtype> dtype) {
  std::lock_guard<std::mutex> call(call_mu_);
  if (cancelled_.load()) throw lw_error(errc::cancelled, "nccl: all-reduce cancelled (node stopping)");
  // As on the ring: weight 0 relays (a joiner's observed round, a node without drawn clients).
  if (!(weight >= 0) || !std::isfinite(weight))
    throw lw_error(errc::invalid_config,
                   fmt::format("nccl: rank {}: weight {} must be finite and >= 0", rank_, weight));
  const std::pair<uint64_t, uint32_t> label{round, fragment};
  if (last_ && label <= *last_)
    throw lw_error(errc::stale_round, "nccl: round " + std::to_string(round) + " fragment " +
                                          std::to_string(fragment) + " is not after the previous call's");
  last_ = label;
  const wire_dtype dt = dtype.value_or(opts_.dtype);
  refuse_int8(dt);
  // The communicator runs on its own thread; the CUDA device is per thread.
  check_cuda(cudaSetDevice(opts_.device), "cudaSetDevice");
  const auto started = std::chrono::steady_clock::now();
  const auto poll = [&] { check_running(started); };

  // The total weight first (worker counts: exact in fp32), so each rank can scale by weight / total and the
  // sum is the mean without overflowing fp16.
  float total = static_cast<float>(weight);
  void* dev = device_buffer(std::max(sizeof(float), encoded_size(dt, n)));
  check_cuda(cudaMemcpy(dev, &total, sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  nccl_->sum(dev, 1, wire_dtype::fp32, poll);
  check_cuda(cudaMemcpy(&total, dev, sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  total_weight_ = total;
  // Every rank weighed 0, as every rank knows: the result is zeros (collective.hpp), and no sum runs.
  const bool empty = !(total > 0);
  if (empty) std::fill(data, data + n, 0.0f);
  const float scale = empty ? 0.0f : static_cast<float>(weight) / total;
  for (size_t i = 0; i < n && !empty; ++i) data[i] *= scale;

  if (n > 0 && !empty) {
    const size_t bytes = encoded_size(dt, n);
    if (dt == wire_dtype::fp32) {
      check_cuda(cudaMemcpy(dev, data, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
      nccl_->sum(dev, n, dt, poll);
      check_cuda(cudaMemcpy(data, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    } else {
      std::vector<std::byte> wire(bytes);
      auto t0 = std::chrono::steady_clock::now();
      encode(dt, data, n, wire.data());
      encode_ns_ += ns_since(t0);
      check_cuda(cudaMemcpy(dev, wire.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
      nccl_->sum(dev, n, dt, poll);
      check_cuda(cudaMemcpy(wire.data(), dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
      t0 = std::chrono::steady_clock::now();
      if (!decode(dt, wire.data(), bytes, n, data))
        throw lw_error(errc::malformed_frame, "nccl: the reduced buffer did not decode");
      decode_ns_ += ns_since(t0);
    }
    bytes_ += 2 * static_cast<uint64_t>(world_ - 1) * bytes / static_cast<uint64_t>(world_);
  }
  {
    std::lock_guard<std::mutex> lk(verdict_mu_);
    verdict_.clear();  // every rank took part
  }
  completed_round_ = round;
}

void nccl_collective::cancel() {
  cancelled_ = true;
}

void nccl_collective::peer_declared_lost(const std::string& verdict) {
  std::lock_guard<std::mutex> lk(verdict_mu_);
  verdict_ = verdict;
}

double nccl_collective::encode_seconds() const {
  return static_cast<double>(encode_ns_.load()) / 1e9;
}

double nccl_collective::decode_seconds() const {
  return static_cast<double>(decode_ns_.load()) / 1e9;
}

}  // namespace longwave::comm
