#include "runtime/process/cores.hpp"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace longwave::runtime {

size_t usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return static_cast<size_t>(CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

thread_budget torch_thread_budget() {
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env != nullptr && *env != '\0') {
    size_t n = 0;
    const char* end = env + std::strlen(env);
    const auto [at, ec] = std::from_chars(env, end, n);
    // "4" caps it; a list ("4,2": nested levels) caps it at its first; anything else is left to OpenMP.
    if (ec == std::errc() && n > 0 && (at == end || *at == ',')) return {n, true};
  }
  return {usable_cores(), false};
}

}  // namespace longwave::runtime
