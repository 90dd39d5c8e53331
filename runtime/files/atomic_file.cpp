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
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fmt::format("{}: cannot write: {}", tmp, std::strerror(errno));
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return failed(tmp, tmp + ": cannot write", err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return failed(tmp, tmp + ": cannot write", err);
  }
  if (::close(fd) != 0) return failed(tmp, tmp + ": cannot write", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return failed(tmp, path + ": cannot rename " + tmp + " over it", errno);
  return {};
}

}  // namespace longwave::runtime
