#pragma once
// The stop signals of a process that supervises others (`longwave sweep`, `launch`): Ctrl-C, SIGTERM and
// SIGHUP are counted for its loop, which stops its children at the first and kills them at the second. And
// the signals that meet a process whose work has ended: they keep the exit code it decided.

#include <atomic>

namespace longwave::runtime {

/// From now on each SIGINT or SIGTERM adds one to `count`; SIGHUP adds one once (a closed terminal may send
/// it twice: a stop, never a kill), as `longwave run` takes it. An ignored SIGHUP (nohup) stays ignored.
void count_stop_signals(std::atomic<int>& count);

/// The three signals back to what they did before count_stop_signals.
void uncount_stop_signals();

/// The handler that ends the process at once (_Exit) with the code last given to keep_exit_code: for a
/// signal that meets a run or role that has ended (the default action would say 130 or "killed by a signal").
using signal_handler = void (*)(int);
signal_handler late_signal();
void keep_exit_code(int code);

/// The process ends with `code`: keep_exit_code, and SIGINT and SIGTERM (unless ignored) go to late_signal()
/// (a failed node that `launch` stops keeps its failure). Returns code. Tests: LONGWAVE_FAULT_SLOW_EXIT_S
/// holds the process that long first, for a late signal to meet.
int end_with(int code);

}  // namespace longwave::runtime
