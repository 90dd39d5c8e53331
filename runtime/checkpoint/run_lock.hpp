#pragma once
// One run per out_dir (and per checkpoint.dir): an advisory lock (flock) on <out_dir>/.longwave.lock holding
// the owner's PID. The kernel releases it when the process dies, however it dies.
#include <string>
#include <utility>

#include "runtime/errors/errors.hpp"

namespace longwave::runtime {

/// The lock's file inside the directory it locks.
inline constexpr const char* lock_file_name = ".longwave.lock";

/// Another live process holds the lock (the CLI exits 4).
class run_lock_busy : public lw_error {
 public:
  run_lock_busy(const std::string& what, std::string holder)
      : lw_error(errc::io_error, what), holder_(std::move(holder)) {}
  /// The holder's PID as its lock file says ("unknown" when it says none).
  const std::string& holder() const { return holder_; }

 private:
  std::string holder_;
};

/// The lock file cannot be made in the directory (no permission, a read-only or pseudo filesystem): no file
/// of the run could be, so the setting that chose it is at fault.
class run_lock_unwritable : public lw_error {
 public:
  using lw_error::lw_error;
};

/// Held for the lifetime of the object. Not copyable.
class run_lock {
 public:
  /// Takes the lock of `dir` (which must exist). Throws run_lock_busy naming the holder's PID and the setting
  /// `key` that chose dir when another process holds it, run_lock_unwritable (io_error) with the system error
  /// when the lock file cannot be opened, lw_error(io_error) when it cannot be locked.
  explicit run_lock(const std::string& dir, const std::string& key = "run.out_dir");
  ~run_lock();
  run_lock(const run_lock&) = delete;
  run_lock& operator=(const run_lock&) = delete;

  /// The lock file's path.
  const std::string& path() const { return path_; }

  /// "" while the path still names the file this lock holds; else what happened (the directory was deleted
  /// or moved, or the file replaced): another run may have taken the directory since.
  std::string lost() const;

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace longwave::runtime
