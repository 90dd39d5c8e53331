// The out_dir and checkpoint.dir locks: flock(LOCK_EX | LOCK_NB), then the PID written into the file for the
// refusal message.
#include "runtime/checkpoint/run_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "runtime/errors/errors.hpp"

namespace longwave::runtime {

namespace {

std::string read_holder(int fd) {
  char buf[32] = {};
  const auto n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid.empty() ? std::string("unknown") : pid;
}

}  // namespace

run_lock::run_lock(const std::string& dir, const std::string& key) : path_(dir + "/" + lock_file_name) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw run_lock_unwritable(errc::io_error,
                              "cannot open the lock file " + path_ + ": " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = read_holder(fd_);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      throw run_lock_busy(key + " " + dir + " is in use by another longwave run (pid " + holder +
                              "); wait for it to end, or choose another " + key,
                          holder);
    throw lw_error(errc::io_error, "cannot lock " + path_ + ": " + std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    // The lock holds without the PID; a second run then names the holder "unknown".
  }
}

run_lock::~run_lock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

std::string run_lock::lost() const {
  struct stat held = {};
  struct stat named = {};
  if (fd_ < 0 || ::fstat(fd_, &held) != 0) return "";
  if (::stat(path_.c_str(), &named) != 0) {
    // Only a missing name is a lost lock; an I/O error (EIO, ESTALE) is the write's to report.
    if (errno != ENOENT && errno != ENOTDIR) return "";
    return "the lock file " + path_ + " is gone (" + std::strerror(errno) +
           "): was the directory deleted or moved?";
  }
  if (held.st_dev != named.st_dev || held.st_ino != named.st_ino)
    return "the lock file " + path_ +
           " is another file now: was the directory deleted or moved and made again?";
  return "";
}

}  // namespace longwave::runtime
