#pragma once
// What /proc says of a child process: a supervisor tells a stopped child (SIGSTOP, Ctrl-Z) from a slow one.
#include <sys/types.h>

namespace longwave::runtime {

/// Whether `pid` is stopped by a signal or traced (state T or t in /proc/PID/stat); false when it cannot be
/// read (no /proc, or the process is gone).
bool is_stopped(pid_t pid);

/// Whether `pid` has exited: no such process, or one its parent has not reaped yet (a zombie).
bool has_exited(pid_t pid);

}  // namespace longwave::runtime
