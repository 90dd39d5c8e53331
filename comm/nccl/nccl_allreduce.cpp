// NCCL all-reduce (average) on a private CUDA stream; every NCCL/CUDA failure becomes an lw_error.
#include "comm/nccl/nccl_allreduce.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "runtime/errors/errors.hpp"

namespace longwave::comm {

namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    throw lw_error(errc::peer_lost, std::string("nccl: ") + what + ": " + ncclGetErrorString(r));
}

void check_cuda(cudaError_t r, const char* what) {
  if (r != cudaSuccess)
    throw lw_error(errc::peer_lost, std::string("cuda: ") + what + ": " + cudaGetErrorString(r));
}

}  // namespace

std::string nccl_allreduce::unique_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  std::string hex;
  char buf[3];
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    std::snprintf(buf, sizeof(buf), "%02x", static_cast<unsigned char>(id.internal[i]));
    hex += buf;
  }
  return hex;
}

int nccl_allreduce::version() {
  int v = 0;
  check_nccl(ncclGetVersion(&v), "ncclGetVersion");
  return v;
}

nccl_allreduce::nccl_allreduce(int rank, int world, const std::string& unique_id_hex, int device,
                               const std::function<void()>& init_poll) {
  ncclUniqueId id;
  if (unique_id_hex.size() != 2 * sizeof(id.internal))
    throw lw_error(errc::invalid_config, "nccl: unique id must be " +
                                             std::to_string(2 * sizeof(id.internal)) + " hex digits, got " +
                                             std::to_string(unique_id_hex.size()));
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    unsigned v = 0;
    if (std::sscanf(unique_id_hex.c_str() + 2 * i, "%2x", &v) != 1)
      throw lw_error(errc::invalid_config, "nccl: unique id is not hex");
    id.internal[i] = static_cast<char>(v);
  }
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  stream_ = stream;
  ncclComm_t comm = nullptr;
  if (!init_poll) {
    check_nccl(ncclCommInitRank(&comm, world, id, rank), "ncclCommInitRank");
    comm_ = comm;
    return;
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  nonblocking_ = true;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, world, id, rank, &config);
  comm_ = comm;
  if (r != ncclSuccess && r != ncclInProgress) {
    abort();
    check_nccl(r, "ncclCommInitRankConfig");
  }
  try {
    wait_ready(init_poll, "ncclCommInitRankConfig");
  } catch (...) {
    cudaStreamDestroy(stream);  // no destructor runs for a constructor that throws
    throw;
  }
}

nccl_allreduce::~nccl_allreduce() {
  // An abort freed it already. A non-blocking communicator's destroy may itself be in progress; its stream is
  // idle here (every call waited for it), so an abort frees it at once.
  if (comm_ && !aborted_) {
    if (nonblocking_)
      ncclCommAbort(static_cast<ncclComm_t>(comm_));
    else
      ncclCommDestroy(static_cast<ncclComm_t>(comm_));
  }
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void nccl_allreduce::poll_or_abort(const std::function<void()>& poll) {
  try {
    if (poll) poll();
  } catch (...) {
    abort();
    throw;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void nccl_allreduce::wait_ready(const std::function<void()>& poll, const char* what) {
  auto comm = static_cast<ncclComm_t>(comm_);
  for (;;) {
    ncclResult_t state = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError");
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      abort();
      check_nccl(state, what);
    }
    poll_or_abort(poll);
  }
}

void nccl_allreduce::average(float* device_data, size_t n) {
  auto stream = static_cast<cudaStream_t>(stream_);
  const ncclResult_t r = ncclAllReduce(device_data, device_data, n, ncclFloat32, ncclAvg,
                                       static_cast<ncclComm_t>(comm_), stream);
  if (nonblocking_ && r == ncclInProgress)
    wait_ready({}, "ncclAllReduce");  // enqueued only once NCCL says so
  else
    check_nccl(r, "ncclAllReduce");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

void nccl_allreduce::abort() {
  if (aborted_ || !comm_) return;
  aborted_ = true;
  ncclCommAbort(static_cast<ncclComm_t>(comm_));
}

void nccl_allreduce::sum(void* device_data, size_t n, wire_dtype dtype, const std::function<void()>& poll) {
  if (aborted_) throw lw_error(errc::peer_lost, "nccl: the communicator was aborted by an earlier call");
  ncclDataType_t type = ncclFloat32;
  switch (dtype) {
    case wire_dtype::fp32: type = ncclFloat32; break;
    case wire_dtype::fp16: type = ncclFloat16; break;
    case wire_dtype::bf16: type = ncclBfloat16; break;
    default:
      throw lw_error(errc::invalid_config,
                     std::string("nccl: no NCCL type for wire dtype ") + config::to_string(dtype));
  }
  auto comm = static_cast<ncclComm_t>(comm_);
  auto stream = static_cast<cudaStream_t>(stream_);
  const ncclResult_t r = ncclAllReduce(device_data, device_data, n, type, ncclSum, comm, stream);
  // A non-blocking communicator may answer before the kernel is on the stream: a stream query would then
  // find it idle too soon.
  if (nonblocking_ && r == ncclInProgress)
    wait_ready(poll, "ncclAllReduce");
  else
    check_nccl(r, "ncclAllReduce");
  // Poll instead of cudaStreamSynchronize, so that a deadline, a cancel or a peer's failure can abort the
  // communicator instead of hanging this thread in NCCL forever.
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) {
      abort();
      check_cuda(q, "cudaStreamQuery");
    }
    ncclResult_t async = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError");
    if (async != ncclSuccess && async != ncclInProgress) {
      abort();
      check_nccl(async, "ncclAllReduce (asynchronous error)");
    }
    poll_or_abort(poll);
  }
}

}  // namespace longwave::comm
