#include "runtime/files/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace longwave::runtime {

namespace {

std::string failed(const std::string& tmp, const std::string& what, int err) {
  ::unlink(tmp.c_str());
  return fmt::format("{}: {}", what, std::strerror(err));
}

}  // namespace

std::string write_atomically(const std::string& path, std::string_view text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);  // less the umask
  if (fd < 0) {
    const int err = errno;
    return fmt::format("{}: cannot write: {}", tmp, std::strerror(err));
  }
  int err = 0;
  for (size_t done = 0; done < text.size() && err == 0;) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n > 0)
      done += static_cast<size_t>(n);
    else if (n == 0)
      err = EIO;  // no progress: never loop on it
    else if (errno != EINTR)
      err = errno;
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) return failed(tmp, tmp + ": cannot write", err);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    return failed(tmp, path + ": cannot rename " + tmp + " over it", err);
  }
  // The rename itself reaches the disk with the directory.
  const std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/') + 1);
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

}  // namespace longwave::runtime
