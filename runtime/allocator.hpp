#pragma once
// Process-wide malloc settings for a node that streams large buffers.

namespace longwave::runtime {

/// Keeps freed blocks of up to 32 MiB inside malloc's arenas instead of returning them to the kernel.
/// The ring allocates and frees a chunk-sized buffer (1 MiB by default) per frame in two threads, and glibc's
/// defaults (a threshold that moves with the sizes freed, trimming above twice it) make many of those
/// allocations fresh pages that the kernel must fault in and zero: about 3% of all CPU time in a 4-rank ring
/// on 2 cores (bench/RESULTS.md). Call at the start of main, before threads start. Idempotent. Returns
/// whether the settings took effect: false on C libraries without mallopt.
bool keep_freed_buffers();

}  // namespace longwave::runtime
