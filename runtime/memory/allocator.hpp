#pragma once
// Process-wide malloc settings for a node that streams large buffers.

namespace longwave::runtime {

/// Keeps freed blocks of up to 32 MiB inside malloc's arenas instead of returning them to the kernel.
/// The ring allocates and frees a chunk-sized buffer (1 MiB by default) per frame in two threads. With
/// glibc's defaults, free() hands those blocks back (madvise on a thread arena's heap) and the next frames
/// fault fresh pages in: 2,000-56,000 faults and up to 1.4 extra CPU seconds per rank and fp32 all-reduce of
/// 64M values in a 4-rank ring (bench/RESULTS.md). The cost is resident memory kept for reuse: the demo's
/// peak RSS went from about 0.9 to 1.06 GB. Call at the start of main, before threads start. Idempotent.
/// Returns whether the settings took effect: false on C libraries without mallopt.
bool keep_freed_buffers();

}  // namespace longwave::runtime
