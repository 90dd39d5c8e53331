// glibc's mallopt: fixed thresholds instead of the dynamic ones.
#include "runtime/memory/allocator.hpp"

// <cstddef> pulls in <features.h> on glibc, which defines __GLIBC__: test it only after a libc header.
#include <cstddef>

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

}  // namespace longwave::runtime
