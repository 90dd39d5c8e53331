// The standard streams of a command-line process (runtime/process/std_streams.hpp).
#include "runtime/process/std_streams.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace longwave::runtime {

namespace {
bool stdout_closed = false;
}  // namespace

int hold_standard_descriptors() {
  int held = 0;
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    // open() takes the lowest free number: this one, as the lower ones are open by now.
    const int got = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (got == fd)
      held |= 1 << fd;
    else if (got >= 0)
      ::close(got);
  }
  stdout_closed = (held & 2) != 0;
  return held;
}

void release_standard_descriptors(int held) {
  for (int fd = 0; fd <= 2; ++fd)
    if (held & (1 << fd)) ::close(fd);
}

bool stdout_was_closed() {
  return stdout_closed;
}

int checked_stdout(int code) {
  errno = 0;
  const bool failed = std::fflush(stdout) != 0 || std::ferror(stdout);
  if (!failed || code != 0) return code;
  std::fprintf(stderr, "longwave: cannot write to standard output: %s\n",
               errno != 0 ? std::strerror(errno) : "a write failed");
  return 1;
}

}  // namespace longwave::runtime
