#pragma once
// How many CPUs this process may use: its affinity (taskset, a container's cpuset), not the machine's count.
#include <cstddef>

namespace longwave::runtime {

/// CPUs this process may run on (sched_getaffinity), else std::thread::hardware_concurrency, at least 1.
size_t usable_cores();

/// The torch threads one process may start in all: OMP_NUM_THREADS when it is a positive integer (the
/// user's or a harness's cap; from_omp_env), else usable_cores(). train.threads = 0 divides it among the
/// workers.
struct thread_budget {
  size_t threads = 1;
  bool from_omp_env = false;
};
thread_budget torch_thread_budget();

}  // namespace longwave::runtime
