#pragma once
// Process-wide malloc settings for a node that streams large buffers.
#include <cstddef>
#include <cstdint>

namespace longwave::runtime {

/// Keeps freed blocks of up to 32 MiB inside malloc's arenas instead of returning them to the kernel.
/// The ring allocates and frees a chunk-sized buffer (1 MiB by default) per frame in two threads. With
/// glibc's defaults, free() hands those blocks back (madvise on a thread arena's heap) and the next frames
/// fault fresh pages in: 2,000-56,000 faults and up to 1.4 extra CPU seconds per rank and fp32 all-reduce of
/// 64M values in a 4-rank ring (bench/RESULTS.md). The cost is resident memory kept for reuse: the demo's
/// peak RSS went from about 0.9 to 1.06 GB. Call at the start of main, before threads start. Idempotent.
/// Returns whether the settings took effect: false on C libraries without mallopt.
bool keep_freed_buffers();

/// Hands the free blocks that keep_freed_buffers keeps back to the kernel (glibc's malloc_trim): those in
/// every arena's bins and the main arena's free top. A thread arena's free top is never returned with these
/// settings: glibc trims it only beyond M_TRIM_THRESHOLD, and a thread arena's heap is at most 64 MiB. For
/// rare events after which the working set changes, such as a membership change: the state served to a
/// joiner and the last epoch's ring threads freed their buffers in arenas that later threads may not
/// reuse, and without it a node's resident memory climbs over a run's first joins (bench/RESULTS.md, the
/// churn soak). Returns how far this process's resident memory fell meanwhile (other threads run on, so it
/// is approximate; 0 where unsupported).
size_t release_freed_memory();

/// This process's resident memory in bytes (/proc/self/statm; 0 where unreadable).
size_t resident_bytes();

/// Bytes of physical memory of this machine (sysconf), or 0 if it cannot be told.
int64_t physical_memory_bytes();

}  // namespace longwave::runtime
