// `longwave launch CLUSTER.toml`: the coordinator and every node as local child processes, their output
// prefixed and merged, Ctrl-C forwarded to all of them.
#include "actors/cli/launch.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "config/cluster_config.hpp"
#include "config/config_loader.hpp"

namespace longwave::cli {

namespace {

std::atomic<int> g_launch_signals{0};

void on_launch_signal(int) {
  g_launch_signals.fetch_add(1);
}

struct child {
  std::string name;
  bool is_node = true;
  pid_t pid = -1;
  int out_fd = -1;
  std::string pending;  // a partial line
  bool running = false;
  int code = -1;  // exit code once it ended (128 + signal if killed)
};

void print_line(const child& c, size_t width, const std::string& line) {
  std::printf("[%-*s] %s\n", static_cast<int>(width), c.name.c_str(), line.c_str());
  std::fflush(stdout);
}

void start(child& c, const std::vector<std::string>& args) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);                     // Ctrl-C reaches the children through launch only (once, in order)
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // and they stop (with a checkpoint) if launch itself dies
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::fprintf(stderr, "cannot start %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  c.pid = pid;
  c.out_fd = fds[0];
  c.running = true;
}

/// Reads what the child wrote; prints complete lines. Closes the pipe at EOF.
void drain(child& c, size_t width) {
  char buf[4096];
  for (;;) {
    const ssize_t n = read(c.out_fd, buf, sizeof buf);
    if (n > 0) {
      c.pending.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = c.pending.find('\n')) != std::string::npos) {
        print_line(c, width, c.pending.substr(0, nl));
        c.pending.erase(0, nl + 1);
      }
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (!c.pending.empty()) print_line(c, width, c.pending);
    c.pending.clear();
    close(c.out_fd);
    c.out_fd = -1;
    return;
  }
}

void signal_all(std::vector<child>& children, int sig, bool nodes_only = false) {
  for (auto& c : children)
    if (c.running && (!nodes_only || c.is_node)) kill(c.pid, sig);
}

}  // namespace

int launch(const std::string& exe, const std::string& cluster_path, const std::vector<std::string>& overrides,
           bool fresh) {
  config::cluster_spec spec;
  try {
    spec = config::load_cluster_file(cluster_path, overrides);
  } catch (const config::config_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  std::vector<child> children;
  std::vector<std::vector<std::string>> args;
  auto role = [](std::string name, bool is_node) {
    child c;
    c.name = std::move(name);
    c.is_node = is_node;
    return c;
  };
  children.push_back(role("coordinator", false));
  args.push_back({exe, "coordinator", cluster_path});
  for (const auto& n : spec.nodes) {
    children.push_back(role(n.name, true));
    args.push_back({exe, "node", cluster_path, "--node", n.name});
    if (fresh) args.back().push_back("--fresh");
  }
  for (size_t i = 0; i < children.size(); ++i)
    for (const auto& ov : overrides) {
      args[i].push_back("--set");
      args[i].push_back(ov);
    }
  size_t width = 0;
  for (const auto& c : children) width = std::max(width, c.name.size());

  std::printf("launch: cluster '%s': coordinator on %s and %zu nodes (%ld workers); Ctrl-C stops them all\n",
              spec.id.c_str(), spec.coordinator.c_str(), spec.nodes.size(), spec.train.train.workers);
  std::fflush(stdout);
  g_launch_signals = 0;
  struct sigaction sa {};
  sa.sa_handler = on_launch_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  try {
    for (size_t i = 0; i < children.size(); ++i) start(children[i], args[i]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch: %s\n", e.what());
    signal_all(children, SIGKILL);
    return 1;
  }

  int handled_signals = 0;
  bool stopping = false;  // launch asked the roles to stop
  int first_failure = 0;
  auto nodes_done_at = std::chrono::steady_clock::time_point::max();
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<size_t> which;
    for (size_t i = 0; i < children.size(); ++i)
      if (children[i].out_fd >= 0) {
        fds.push_back({children[i].out_fd, POLLIN, 0});
        which.push_back(i);
      }
    if (!fds.empty())
      poll(fds.data(), fds.size(), 200);
    else
      usleep(100 * 1000);
    for (size_t k = 0; k < fds.size(); ++k)
      if (fds[k].revents) drain(children[which[k]], width);

    const int sigs = g_launch_signals.load();
    if (sigs > handled_signals) {
      handled_signals = sigs;
      if (sigs == 1) {
        std::printf(
            "launch: interrupt: stopping every role; each node saves a checkpoint (Ctrl-C again to kill)\n");
        signal_all(children, SIGINT);
        stopping = true;
      } else {
        std::printf("launch: second interrupt: killing every role\n");
        signal_all(children, SIGKILL);
      }
      std::fflush(stdout);
    }

    bool nodes_running = false, any_running = false;
    for (auto& c : children) {
      if (c.running) {
        int status = 0;
        if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
          c.running = false;
          c.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          if (c.out_fd >= 0) drain(c, width);
          if (c.code != 0 && c.code != 130 && first_failure == 0) first_failure = c.code;
          if (c.code != 0 && !stopping && sigs == 0) {
            std::printf("launch: %s %s ended with exit code %d; stopping the others\n",
                        c.is_node ? "node" : "the", c.name.c_str(), c.code);
            std::fflush(stdout);
            signal_all(children, SIGINT);
            stopping = true;
          }
        }
      }
      any_running = any_running || c.running || c.out_fd >= 0;
      nodes_running = nodes_running || (c.is_node && c.running);
    }
    if (!any_running) break;
    // The coordinator ends by itself once every node said bye; give it 10 s, then stop it.
    if (!nodes_running) {
      const auto now = std::chrono::steady_clock::now();
      if (nodes_done_at == std::chrono::steady_clock::time_point::max()) nodes_done_at = now;
      if (now - nodes_done_at > std::chrono::seconds(10) && children[0].running) {
        kill(children[0].pid, SIGINT);
        nodes_done_at = now;
      }
    }
  }
  std::string summary;
  for (const auto& c : children) summary += " " + c.name + "=" + std::to_string(c.code);
  std::printf("launch: exit codes:%s\n", summary.c_str());
  std::fflush(stdout);
  if (handled_signals > 0) return 130;
  if (first_failure != 0) return first_failure;
  for (const auto& c : children)
    if (c.code != 0) return c.code;
  return 0;
}

}  // namespace longwave::cli
