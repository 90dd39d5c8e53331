#pragma once
// CPU time and minor page faults of the whole process, for benches that report them per operation.
#include <sys/resource.h>

namespace longwave::bench {

struct process_usage {
  double cpu_seconds = 0.0;  // user + system, all threads: unlike wall time, barely moved by other tenants
  long minor_faults = 0;     // pages the kernel faulted in for this process

  static process_usage now() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    auto sec = [](const timeval& t) {
      return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
    };
    return {sec(ru.ru_utime) + sec(ru.ru_stime), ru.ru_minflt};
  }
};

}  // namespace longwave::bench
