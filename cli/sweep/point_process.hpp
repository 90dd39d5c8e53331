#pragma once
// A sweep's point as a child process (`longwave run BASE --set ...`, its output in the point's log.txt), what
// its log says, and the locks of the folders a sweep runs in: its out_dir's, and a point's run's.
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>

#include "cli/sweep/runner.hpp"
#include "cli/sweep/sweep_file.hpp"

namespace longwave::cli::sweep {

/// The time now as a folder name may hold it: 20261203T141536Z.
std::string utc_stamp();

/// The last non-empty line of a log, and the last progress line's "round ... | step ..." part.
std::pair<std::string, std::string> log_tail(const std::string& path);

/// The command that runs p: `longwave run BASE --set ...`; threads > 0 adds train.threads, fresh adds
/// --fresh.
std::vector<std::string> point_command(const sweep_spec& s, const sweep_point& p, const sweep_options& o,
                                       int64_t threads, bool fresh);

/// Starts point_command(...) for p with its output appended to out_dir/points/<id>/log.txt (a
/// dated header with the command first), in its own process group, stopped with SIGTERM if the sweep dies.
/// Throws std::runtime_error when it cannot.
pid_t start_point(const sweep_spec& s, const sweep_point& p, const sweep_options& o, int64_t threads,
                  bool fresh);

/// `w` as one word of a POSIX shell command line: as it is when it holds nothing the shell reads, else in
/// single quotes (a quote inside as '\'').
std::string shell_word(const std::string& w);

/// out_dir/sweep.lock, held (flock, this PID inside) while the sweep runs: its descriptor, or -1 when another
/// sweep holds it and -2 when it cannot be opened, with *why said.
int lock_out_dir(const std::string& out_dir, std::string* why);

/// The PID in `dir`'s run lock (.longwave.lock) when another process holds it (a point's run left running or
/// stopped by an earlier sweep that died), else "".
std::string folder_in_use(const std::string& dir);

}  // namespace longwave::cli::sweep
