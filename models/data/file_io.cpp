// Whole-file reads and crash-safe whole-file writes (temp file, fsync, rename) for the data pipeline.
#include "models/data/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "runtime/errors/errors.hpp"

namespace longwave::models::data {

namespace fs = std::filesystem;

std::string read_file(const std::string& path, const char* what,
                      const std::function<void(std::string_view, uint64_t)>& each_chunk) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    throw lw_error(errc::io_error, fmt::format("cannot read {} '{}': it is a directory", what, path));
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw lw_error(errc::io_error, fmt::format("cannot open {} '{}': {}", what, path, std::strerror(errno)));
  }
  const std::unique_ptr<int, void (*)(int*)> closer(&fd, [](int* f) { ::close(*f); });
  // A regular file is read up to the size it reports: /proc's files say 0 and some never end (a probe read
  // /proc/self/pagemap until memory ran out).
  struct stat st {};
  const bool sized = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const size_t left =
        sized ? static_cast<size_t>(st.st_size) - std::min(out.size(), static_cast<size_t>(st.st_size))
              : sizeof buf;
    const size_t want = std::min(sizeof buf, left);
    if (want == 0) break;
    ssize_t n = ::read(fd, buf, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw lw_error(errc::io_error,
                     fmt::format("cannot read {} '{}': {}", what, path, std::strerror(errno)));
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (each_chunk)
      each_chunk(std::string_view(buf, static_cast<size_t>(n)),
                 sized ? static_cast<uint64_t>(st.st_size) : 0);
  }
  return out;
}

namespace {

[[noreturn]] void write_failed(const std::string& path, const std::string& tmp, const char* step, int err) {
  ::unlink(tmp.c_str());
  throw lw_error(errc::io_error,
                 fmt::format("cannot write '{}': {} failed: {}", path, step, std::strerror(err)));
}

}  // namespace

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& parts) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) write_failed(path, tmp, "open", errno);
  for (std::string_view part : parts) {
    const char* p = part.data();
    size_t left = part.size();
    while (left > 0) {
      ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int err = errno;
        ::close(fd);
        write_failed(path, tmp, "write", err);
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    write_failed(path, tmp, "fsync", err);
  }
  if (::close(fd) != 0) write_failed(path, tmp, "close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) write_failed(path, tmp, "rename", errno);
  // Make the rename itself durable; a failure here only weakens durability, so it is not an error.
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace longwave::models::data
