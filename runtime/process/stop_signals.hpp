#pragma once
// The stop signals of a process that supervises others (`longwave sweep`, `launch`): Ctrl-C, SIGTERM and
// SIGHUP are counted for its loop, which stops its children at the first and kills them at the second.

#include <atomic>

namespace longwave::runtime {

/// From now on each SIGINT or SIGTERM adds one to `count`; SIGHUP adds one once (a closed terminal may send
/// it twice: a stop, never a kill), as `longwave run` takes it. An ignored SIGHUP (nohup) stays ignored.
void count_stop_signals(std::atomic<int>& count);

/// The three signals back to what they did before count_stop_signals.
void uncount_stop_signals();

}  // namespace longwave::runtime
