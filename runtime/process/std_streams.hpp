#pragma once
// The standard streams of a command-line process: descriptors 0-2 held open, and what went to stdout
// checked before a success is reported.

namespace longwave::runtime {

/// Opens /dev/null on each of descriptors 0, 1 and 2 that is closed (`longwave run >&-`), so that no file
/// this process opens later (a lock file, a checkpoint) takes that number and receives the log lines.
/// Returns which it opened (bit `fd`).
int hold_standard_descriptors();

/// Closes again the descriptors that hold_standard_descriptors opened (`held`), before an exec: the next
/// program then finds the streams as this one was given them.
void release_standard_descriptors(int held);

/// Whether hold_standard_descriptors found stdout closed (what is written to it goes to /dev/null).
bool stdout_was_closed();

/// `code`, or 1 when `code` is 0 but stdout could not take everything written to it (a full disk, a closed
/// descriptor): then one line on stderr says so. Call before exiting.
int checked_stdout(int code);

}  // namespace longwave::runtime
