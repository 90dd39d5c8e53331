#pragma once
// The "nccl" comm.backend: the collective interface over nccl_allreduce, for nodes with a GPU. The
// communicator's buffers live on the host, so each call copies them to the device and back.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "comm/collective.hpp"

namespace longwave::comm {

class nccl_allreduce;

/// Settings of an NCCL collective; every rank must use the same dtype.
struct nccl_collective_options {
  /// Element type NCCL sums in: fp32, fp16 or bf16 (NCCL's float32, float16, bfloat16). int8 has no NCCL
  /// reduction and is refused. Unlike the ring, fp16/bf16 also accumulate in that type.
  wire_dtype dtype = wire_dtype::fp32;
  /// CUDA device of this rank (pick a node's GPU with CUDA_VISIBLE_DEVICES).
  int device = 0;
  /// A call that has not finished after this long aborts the communicator and throws deadline_missed.
  std::chrono::milliseconds timeout{30000};
  /// A call that has run this long while the coordinator declares a node lost aborts with peer_lost.
  std::chrono::milliseconds stall_after{10000};
  /// Set: the communicator is non-blocking, and this is called while its members join (an exception from it
  /// abandons the join: a fence); joining longer than `timeout` throws deadline_missed. Unset: a blocking
  /// join (ncclCommInitRank).
  std::function<void()> init_poll;
};

/// One rank of an NCCL communicator behind the collective interface. Weighted mean: every rank first sums
/// the weights (one fp32 value), then sums data * (weight / total) in the wire dtype. NCCL gives every rank
/// the same bits for the same inputs in practice (ring and tree algorithms reduce in a fixed order), but,
/// unlike the ring backend, it does not promise it.
class nccl_collective final : public collective {
 public:
  /// Joins the communicator whose unique id (hex, nccl_allreduce::unique_id()) every rank was given. Throws
  /// lw_error(invalid_config) for int8 or a bad id and lw_error(peer_lost) naming the NCCL/CUDA failure.
  nccl_collective(int rank, int world, const std::string& unique_id_hex, nccl_collective_options opts);
  ~nccl_collective() override;
  nccl_collective(const nccl_collective&) = delete;
  nccl_collective& operator=(const nccl_collective&) = delete;

  /// Empty if this process sees a CUDA device; otherwise why not (e.g. "cudaGetDeviceCount: no CUDA-capable
  /// device is detected").
  static std::string device_problem();

  void allreduce(uint64_t round, float* data, size_t n, double weight = 1.0, uint32_t fragment = 0,
                 std::optional<wire_dtype> dtype = std::nullopt) override;
  void cancel() override;
  void peer_declared_lost(const std::string& verdict) override;
  uint64_t completed_round() const override { return completed_round_.load(); }
  double last_total_weight() const override { return total_weight_.load(); }
  /// Estimates: NCCL's ring all-reduce moves 2 (world - 1) / world times the buffer each way.
  uint64_t bytes_sent() const override { return bytes_.load(); }
  uint64_t bytes_received() const override { return bytes_.load(); }
  /// Host time converting to and from fp16/bf16 (0 for fp32).
  double encode_seconds() const override;
  double decode_seconds() const override;
  /// fp16 and bf16 round each value alone, so any piece size quantizes alike: the whole buffer.
  size_t chunk_elements() const override { return SIZE_MAX; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  const char* backend_name() const override { return "nccl"; }

 private:
  void* device_buffer(size_t bytes);
  void check_running(std::chrono::steady_clock::time_point started) const;

  int rank_, world_;
  nccl_collective_options opts_;
  std::unique_ptr<nccl_allreduce> nccl_;
  void* buffer_ = nullptr;  // device memory, grown on demand
  size_t buffer_bytes_ = 0;

  std::mutex call_mu_;                                 // serializes allreduce calls
  std::optional<std::pair<uint64_t, uint32_t>> last_;  // (round, fragment) of the last call; under call_mu_
  std::atomic<bool> cancelled_{false};
  mutable std::mutex verdict_mu_;
  std::string verdict_;  // under verdict_mu_
  std::atomic<uint64_t> completed_round_{0};
  std::atomic<double> total_weight_{0};  // the weights' sum of the last call
  std::atomic<uint64_t> bytes_{0};
  std::atomic<int64_t> encode_ns_{0}, decode_ns_{0};
};

}  // namespace longwave::comm
