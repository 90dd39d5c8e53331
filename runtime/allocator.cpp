// glibc's mallopt: fixed thresholds instead of the dynamic ones.
#include "runtime/allocator.hpp"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace longwave::runtime {

void keep_freed_buffers() {
#if defined(__GLIBC__)
  // Setting either value also turns off glibc's dynamic adjustment of both.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

}  // namespace longwave::runtime
