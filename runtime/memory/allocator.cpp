// glibc's mallopt: fixed thresholds instead of the dynamic ones.
#include "runtime/memory/allocator.hpp"

// <cstddef> pulls in <features.h> on glibc, which defines __GLIBC__: test it only after a libc header.
#include <cstddef>

#include <unistd.h>

#include <fstream>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace longwave::runtime {

bool keep_freed_buffers() {
#if defined(__GLIBC__)
  // Setting either value also turns off glibc's dynamic adjustment of both. mallopt returns 1 on success.
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 256 << 20) == 1;
  return mmap_ok && trim_ok;
#else
  return false;
#endif
}

size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages_total = 0, pages_resident = 0;
  if (!(statm >> pages_total >> pages_resident)) return 0;
  return pages_resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

size_t release_freed_memory() {
#if defined(__GLIBC__)
  const size_t before = resident_bytes();
  malloc_trim(0);
  const size_t after = resident_bytes();
  return before > after ? before - after : 0;
#else
  return 0;
#endif
}

int64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<int64_t>(pages) * page;
}

}  // namespace longwave::runtime
