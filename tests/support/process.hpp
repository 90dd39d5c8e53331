#pragma once
// Test helpers: start the real longwave binary as a child process, wait with a deadline, signal it, and
// read files it writes.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/clock/clock.hpp"

namespace longwave::test {

/// Every child spawn() started (pid, in a process group of its own?): a test that fails (a REQUIRE throws)
/// before it reaps them would leave its endless cluster running into the next tests, slowing them down.
inline std::vector<std::pair<pid_t, bool>>& spawned_children() {
  static std::vector<std::pair<pid_t, bool>> children;
  return children;
}

/// When each test case ends, its children still running are SIGKILLed (their group, if they have one) and
/// reaped. waitpid answers only for this process's own unreaped children, so a pid the test already reaped is
/// never signalled.
struct reap_leftover_children : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    for (const auto& [pid, group] : spawned_children()) {
      if (waitpid(pid, nullptr, WNOHANG) != 0) continue;  // reaped, or not ours
      kill(group ? -pid : pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    spawned_children().clear();
    TestEventListenerBase::testCaseEnded(stats);
  }
};
CATCH_REGISTER_LISTENER(reap_leftover_children)

/// The model of the tests about mechanics (membership, kills, resumes, security), not about quality: the
/// tiny preset narrowed to 0.10M parameters, 6x less compute per step (0.016 against 0.095 s at batch 4 x 64,
/// one thread), so the suite fits CI's time. Lines of a [model] table.
inline const char* mechanics_model = "dim = 64\nlayers = 2\nheads = 2\nkv_heads = 2\nffn_hidden = 128\n";

/// mechanics_model as command-line overrides: "--set", "model.dim=64", ...
inline std::vector<std::string> mechanics_model_sets() {
  std::vector<std::string> args;
  std::istringstream in(mechanics_model);
  for (std::string key, eq, value; in >> key >> eq >> value;)
    args.insert(args.end(), {"--set", "model." + key + "=" + value});
  return args;
}

/// Path of the longwave binary (LW_BINARY from ctest, else the build tree default).
inline std::string binary() {
  if (const char* b = std::getenv("LW_BINARY"); b && *b) return b;
  throw std::runtime_error("LW_BINARY is not set (run the tests through ctest)");
}

/// A fresh, empty scratch directory.
inline std::string scratch_dir(const std::string& name) {
  auto d =
      std::filesystem::temp_directory_path() / ("longwave-test-" + name + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

/// How many times `needle` occurs in `text` (overlapping ones too).
inline size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

/// A child process whose stdout and stderr go to one log file.
struct child {
  pid_t pid = -1;
  std::string log;
};

/// Starts args with stdout and stderr on out_fd; with own_group, in a process group of its own (pgid = pid),
/// so that the test can signal it and all its children at once. `env` ("NAME=VALUE" each) is added to the
/// test's own environment, replacing a variable of the same name.
inline child spawn_on(const std::vector<std::string>& args, int out_fd, bool own_group = false,
                      const std::vector<std::string>& env = {}) {
  // The child's environment is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> vars(env);
  for (char** e = environ; *e; ++e) {
    const std::string var(*e);
    const auto name = var.substr(0, var.find('=') + 1);
    if (std::none_of(env.begin(), env.end(), [&](const std::string& v) { return v.rfind(name, 0) == 0; }))
      vars.push_back(var);
  }
  std::vector<char*> envp;
  for (auto& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  child c;
  c.pid = fork();
  if (c.pid == 0) {
    if (own_group) setpgid(0, 0);
    // The stop signals as a terminal's process gets them, however the test was started: nohup ignores
    // SIGHUP, and an ignored signal stays ignored across exec (the hangup tests then saw no hangup).
    for (const int sig : {SIGHUP, SIGINT, SIGTERM}) signal(sig, SIG_DFL);
    dup2(out_fd, 1);
    dup2(out_fd, 2);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  if (own_group && c.pid > 0) setpgid(c.pid, c.pid);  // also here, so the group exists before any kill
  if (c.pid > 0) spawned_children().emplace_back(c.pid, own_group);
  return c;
}

/// Starts args with output to log_path (emptied first; see spawn_on for own_group and env).
inline child spawn(const std::vector<std::string>& args, const std::string& log_path, bool own_group = false,
                   const std::vector<std::string>& env = {}) {
  // Emptied here, before fork: a test that waits for a line in the log of a process started again into the
  // same file must not find the earlier process's line before the child has opened it.
  const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  auto c = spawn_on(args, fd, own_group, env);
  if (fd >= 0) close(fd);
  c.log = log_path;
  return c;
}

/// Starts args with its output into a pipe; returns the child and the pipe's read end, which the caller
/// reads and closes (a `longwave run ... | head` whose head ends).
inline std::pair<child, int> spawn_piped(const std::vector<std::string>& args) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return {child{}, -1};
  auto c = spawn_on(args, fds[1]);
  close(fds[1]);
  return {c, fds[0]};
}

using longwave::runtime::seconds_since;

/// The processes whose parent is `parent`, with their command lines (each /proc/PID/stat names its parent).
inline std::vector<std::pair<pid_t, std::string>> children_of(pid_t parent) {
  std::vector<std::pair<pid_t, std::string>> found;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto stat = read_text(e.path().string() + "/stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    pid_t ppid = -1;
    rest >> state >> ppid;
    auto cmdline = read_text(e.path().string() + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (ppid == parent) found.emplace_back(static_cast<pid_t>(std::stol(pid)), cmdline);
  }
  return found;
}

/// Exit code (128+signal if killed), or -1 if it did not end within the deadline (then it is killed).
inline int wait_exit(const child& c, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    pid_t r = waitpid(c.pid, &status, WNOHANG);
    if (r == c.pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(c.pid, SIGKILL);
  waitpid(c.pid, nullptr, 0);
  return -1;
}

/// Runs to completion; returns the exit code and the combined output.
inline std::pair<int, std::string> run(const std::vector<std::string>& args, const std::string& log_path,
                                       double timeout_s = 600) {
  auto c = spawn(args, log_path);
  const int code = wait_exit(c, timeout_s);
  return {code, read_text(log_path)};
}

/// Makes DIR/keys (the cluster's pair and n0..n9's, listed or not) and returns the [security] section that
/// names it: test clusters run with CURVE, the default. The keys are made once per build of the binary by
/// `longwave keys new` (CURVE key generation) into a cache in the temporary directory, then copied with their
/// modes; each test changes only its own copy.
inline std::string curve_keys(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path bin = binary();
  const auto stamp = std::to_string(
      std::hash<std::string>{}(bin.string() + " " + std::to_string(fs::file_size(bin)) + " " +
                               std::to_string(fs::last_write_time(bin).time_since_epoch().count())));
  const auto cache = fs::temp_directory_path() / ("longwave-test-keys-" + stamp);
  if (!fs::exists(cache / "keys" / "cluster.secret")) {
    // Made aside and renamed into place, so a test running beside this one sees all of it or none.
    const auto made = cache.string() + ".tmp" + std::to_string(::getpid());
    fs::remove_all(made);
    fs::create_directories(made);
    const auto [code, out] = run(
        {bin.string(), "keys", "new", "--out", made + "/keys", "--nodes", "n0,n1,n2,n3,n4,n5,n6,n7,n8,n9"},
        made + "/keys.log", 60);
    if (code != 0) throw std::runtime_error("longwave keys new failed: " + out);
    std::error_code ec;
    fs::rename(made, cache, ec);  // fails when another test made it first: theirs is as good
    if (ec) fs::remove_all(made);
  }
  fs::copy(cache / "keys", dir + "/keys", fs::copy_options::recursive);
  return "\n[security]\nkeys = \"" + dir + "/keys\"\n";
}

/// Waits until `pred()` holds, polling every poll_ms; false on timeout.
template <class Pred>
bool wait_until(Pred pred, double timeout_s, int poll_ms = 50) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
  return false;
}

/// Waits until the file at `path` (a log) holds `text`; false on timeout.
inline bool wait_for_text(const std::string& path, const std::string& text, double timeout_s) {
  return wait_until([&] { return read_text(path).find(text) != std::string::npos; }, timeout_s);
}

/// Whether nothing listens on 127.0.0.1:port (a bind with SO_REUSEADDR, as ZeroMQ's and the HTTP servers'
/// listeners use, succeeds).
inline bool port_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

/// Reserves `port` for this process among the test processes of the machine (ctest runs two at once): an
/// exclusive flock on /tmp/longwave-test-ports/PORT, held until the process exits (the kernel drops it then,
/// however it ends). Without it two test processes could draw the same free port before either bound it.
inline bool reserve_port(int port) {
  const std::string dir = "/tmp/longwave-test-ports";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const int fd = ::open((dir + "/" + std::to_string(port)).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return true;  // no place for locks: the draw alone decides, as before
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return false;
  }
  return true;  // fd stays open (and locked) for the life of the process
}

/// A TCP port on 127.0.0.1 that is free now and was not handed out before to this or another running test
/// process (reserve_port). Ports come from below the kernel's ephemeral range, so no outgoing connection
/// (ZeroMQ's, Prometheus's) can take one between this call and the bind of the process it is meant for;
/// bind(port 0) drew from that range and, on a busy machine, sometimes twice the same port.
inline int free_port() {
  static std::set<int> handed_out;
  static std::mt19937 draw{std::random_device{}()};
  int lo = 20000, hi = 32000;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) {
    int first = 0, last = 0;
    if (range >> first >> last) {
      lo = std::max(1024, first - 12000), hi = first;
      if (hi - lo < 1000) lo = last + 1, hi = std::min(65536, last + 12001);
    }
  }
  const int span = hi - lo;
  const int start = std::uniform_int_distribution<int>(0, span - 1)(draw);
  for (int i = 0; i < span; ++i) {
    const int port = lo + (start + i) % span;
    if (handed_out.count(port)) continue;
    if (!port_free(port) || !reserve_port(port)) continue;
    handed_out.insert(port);
    return port;
  }
  throw std::runtime_error("free_port: no free port in " + std::to_string(lo) + "-" + std::to_string(hi));
}

/// A listening TCP socket on a loopback port the kernel chose, held until destroyed: a port in use.
struct held_port {
  int fd = -1;
  int port = 0;
  held_port() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 1) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      throw std::runtime_error("held_port: cannot listen on a loopback port");
    port = ntohs(addr.sin_port);
  }
  held_port(const held_port&) = delete;
  held_port& operator=(const held_port&) = delete;
  ~held_port() { ::close(fd); }
};

/// Lines of a loss trace (step \t round \t loss) as (step, loss) pairs.
inline std::vector<std::pair<long, double>> read_trace(const std::string& path) {
  std::vector<std::pair<long, double>> out;
  std::ifstream in(path);
  long step, round;
  double loss;
  while (in >> step >> round >> loss) out.emplace_back(step, loss);
  return out;
}

}  // namespace longwave::test
