// NCCL backend on a real GPU (label gpu: CI compiles and links this, but runs it only where a GPU exists).
#include <cuda_runtime_api.h>
#include <catch2/catch.hpp>

#include <vector>

#include "comm/nccl/nccl_allreduce.hpp"

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
