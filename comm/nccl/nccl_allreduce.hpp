#pragma once
// NCCL backend of the pseudo-gradient average for GPU nodes: ncclAllReduce with ncclAvg on device buffers.
// Built only when CUDA and NCCL are found (LONGWAVE_WITH_NCCL); torch-free.
#include <cstddef>
#include <functional>
#include <string>

#include "comm/codec.hpp"

namespace longwave::comm {

/// One rank of an NCCL communicator. The unique id is created by rank 0 (unique_id()) and handed to every
/// rank out of band (through the coordinator).
class nccl_allreduce {
 public:
  /// A new communicator id, hex-encoded. Throws lw_error(peer_lost) if NCCL fails.
  static std::string unique_id();
  /// NCCL's version number, e.g. 22809 for 2.28.9.
  static int version();
  /// Joins the communicator on CUDA device `device`. Throws lw_error naming the NCCL/CUDA error. With
  /// `init_poll` the communicator is non-blocking (ncclConfig_t blocking = 0): while the members join, it is
  /// called about every millisecond, and an exception from it aborts the communicator and is rethrown (a
  /// fence need not wait for a member that died); every later call then waits for NCCL's enqueue itself.
  nccl_allreduce(int rank, int world, const std::string& unique_id_hex, int device,
                 const std::function<void()>& init_poll = {});
  ~nccl_allreduce();
  nccl_allreduce(const nccl_allreduce&) = delete;
  nccl_allreduce& operator=(const nccl_allreduce&) = delete;
  /// In-place average of n fp32 values in device memory across all ranks; returns when the stream is done.
  void average(float* device_data, size_t n);
  /// In-place sum of n values of `dtype` (fp32, fp16 or bf16: NCCL's float32, float16 and bfloat16) in
  /// device memory across all ranks. While it waits for the stream it calls `poll` about every millisecond;
  /// an exception from poll (a deadline, a cancel) aborts the communicator (ncclCommAbort) and is rethrown,
  /// and so is an NCCL asynchronous error (peer_lost). After an abort every call throws peer_lost.
  /// int8 throws invalid_config.
  void sum(void* device_data, size_t n, wire_dtype dtype, const std::function<void()>& poll);

 private:
  void abort();
  /// A non-blocking communicator: waits until its operation in progress (the init, an enqueue) is done,
  /// calling poll meanwhile.
  void wait_ready(const std::function<void()>& poll, const char* what);
  /// Calls poll (an exception aborts the communicator and is rethrown), then sleeps a millisecond.
  void poll_or_abort(const std::function<void()>& poll);

  void* comm_ = nullptr;    // ncclComm_t
  void* stream_ = nullptr;  // cudaStream_t
  bool aborted_ = false;
  bool nonblocking_ = false;
};

}  // namespace longwave::comm
