// A sweep's point as a child process, and the locks of the folders it runs in (cli/sweep/point_process.hpp).
#include "cli/sweep/point_process.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "cli/report/format.hpp"

namespace longwave::cli::sweep {

namespace fs = std::filesystem;

std::string utc_stamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::pair<std::string, std::string> log_tail(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::streamoff>(in.tellg());
  in.seekg(std::max<std::streamoff>(0, size - 8192));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string last, progress;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    last = line;
    if (const auto r = line.find("round "), st = line.find("| step ");
        r != std::string::npos && st != std::string::npos)
      progress = line.substr(
          r, line.find(" |", st + 2) == std::string::npos ? std::string::npos : line.find(" |", st + 2) - r);
  }
  return {last, progress};
}

std::vector<std::string> point_command(const sweep_spec& s, const sweep_point& p, const sweep_options& o,
                                       int64_t threads, bool fresh) {
  std::vector<std::string> args = {o.exe, "run", s.base};
  for (const auto& ov : p.overrides) args.insert(args.end(), {"--set", ov});
  if (threads > 0) args.insert(args.end(), {"--set", fmt::format("train.threads={}", threads)});
  if (fresh) args.push_back("--fresh");
  return args;
}

pid_t start_point(const sweep_spec& s, const sweep_point& p, const sweep_options& o, int64_t threads,
                  bool fresh) {
  std::error_code ec;
  fs::create_directories(p.out_dir, ec);
  if (ec) throw std::runtime_error(fmt::format("cannot make {}: {}", p.out_dir, ec.message()));
  const auto args = point_command(s, p, o, threads, fresh);
  const std::string log = (fs::path(p.out_dir) / "log.txt").string();
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot write {}: {}", log, std::strerror(errno)));
  std::string header =
      fmt::format("=== longwave sweep, {}:", report::utc_text(static_cast<double>(std::time(nullptr))));
  for (const auto& a : args) header += " " + a;
  header += "\n";
  (void)!write(fd, header.data(), header.size());
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);                     // the terminal's Ctrl-C reaches the sweep only, which forwards it
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // a point stops (with its checkpoint) if the sweep dies
    if (getppid() != parent) _exit(130);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    execv(argv[0], argv.data());
    const char msg[] = "sweep: cannot start the longwave binary\n";
    (void)!write(fd, msg, sizeof msg - 1);
    _exit(127);
  }
  close(fd);
  return pid;
}

std::string shell_word(const std::string& w) {
  const bool plain = !w.empty() && std::all_of(w.begin(), w.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) ||
           (c != '\0' && std::strchr("_./=:,+-@%", c) != nullptr);
  });
  if (plain) return w;
  std::string out = "'";
  for (const char c : w) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

namespace {

/// The first line of a lock file: the PID its holder wrote.
std::string holder_pid(int fd) {
  char buf[32] = {};
  (void)!pread(fd, buf, sizeof buf - 1, 0);
  return std::string(buf).substr(0, std::string(buf).find('\n'));
}

}  // namespace

int lock_out_dir(const std::string& out_dir, std::string* why) {
  const std::string path = (fs::path(out_dir) / "sweep.lock").string();
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    *why = fmt::format("cannot open {}: {}", path, std::strerror(errno));
    return -2;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    *why = fmt::format("{} is in use by another sweep (pid {}); wait for it or stop it", out_dir,
                       holder_pid(fd));
    close(fd);
    return -1;
  }
  const std::string pid = std::to_string(getpid()) + "\n";
  (void)!ftruncate(fd, 0);
  (void)!pwrite(fd, pid.data(), pid.size(), 0);
  return fd;
}

std::string folder_in_use(const std::string& dir) {
  const int fd = open((fs::path(dir) / ".longwave.lock").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string pid;
  if (flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    pid = holder_pid(fd);
    if (pid.empty()) pid = "?";
  }
  close(fd);
  return pid;
}

}  // namespace longwave::cli::sweep
