// `longwave launch CLUSTER.toml`: the coordinator and every node as local child processes, their output
// prefixed and merged, Ctrl-C forwarded to all of them. Each role writes to its own file under out_dir/logs,
// which launch follows: a role that outlives launch (killed) still has its last lines kept.
#include "cli/launch.hpp"

#include <fcntl.h>
#include <fmt/format.h>
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
#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include <filesystem>
#include <fstream>

#include "cli/report/format.hpp"
#include "cli/report/records.hpp"
#include "config/cluster_config.hpp"
#include "config/config_loader.hpp"
#include "models/data/dataset_prep.hpp"
#include "models/model_spec.hpp"
#include "runtime/checkpoint/run_lock.hpp"
#include "runtime/files/directory.hpp"
#include "runtime/memory/allocator.hpp"
#include "runtime/process/port_check.hpp"
#include "runtime/process/stop_signals.hpp"

namespace longwave::cli {

namespace {

std::atomic<int> g_launch_signals{0};  // Ctrl-C, SIGTERM, SIGHUP (runtime::count_stop_signals)

struct child {
  std::string name;
  bool is_node = true;
  bool is_observer = false;  // Prometheus: its output goes to a log file; it never stops the cluster
  pid_t pid = -1;
  int out_fd = -1;  // launch's reading end of the role's log file (not for Prometheus)
  std::string log_path;
  std::string pending;  // a partial line
  bool running = false;
  int code = -1;  // exit code once it ended (128 + signal if killed)
};

void print_line(const child& c, size_t width, const std::string& line) {
  std::printf("[%-*s] %s\n", static_cast<int>(width), c.name.c_str(), line.c_str());
  std::fflush(stdout);
}

/// Starts a role with its output appended to c.log_path; launch reads what it adds from the current end.
void start(child& c, const std::vector<std::string>& args) {
  const int log_fd = open(c.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) throw std::runtime_error("cannot write " + c.log_path + ": " + std::strerror(errno));
  if (!c.is_observer) {
    c.out_fd = open(c.log_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (c.out_fd < 0 || lseek(c.out_fd, 0, SEEK_END) < 0)
      throw std::runtime_error("cannot read " + c.log_path + ": " + std::strerror(errno));
  }
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);                     // Ctrl-C reaches the children through launch only (once, in order)
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // and they stop (with a checkpoint) if launch itself dies
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::fprintf(stderr, "cannot start %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  close(log_fd);
  c.pid = pid;
  c.running = true;
}

/// Prints the complete lines the role has added to its log; once it has ended (`last`), the rest too, and
/// stops following the file.
void drain(child& c, size_t width, bool last = false) {
  char buf[4096];
  ssize_t n;
  while ((n = read(c.out_fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n < 0) continue;
    c.pending.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = c.pending.find('\n')) != std::string::npos) {
      print_line(c, width, c.pending.substr(0, nl));
      c.pending.erase(0, nl + 1);
    }
  }
  if (!last) return;
  if (!c.pending.empty()) print_line(c, width, c.pending);
  c.pending.clear();
  close(c.out_fd);
  c.out_fd = -1;
}

void signal_all(std::vector<child>& children, int sig, bool nodes_only = false) {
  for (auto& c : children)
    if (c.running && !c.is_observer && (!nodes_only || c.is_node)) kill(c.pid, sig);
}

/// Where Prometheus reaches a role's /metrics: its address, or loopback for a wildcard bind.
std::string scrape_host(const std::string& address) {
  return address == "0.0.0.0" ? "127.0.0.1" : address;
}

/// Writes prometheus.yml for the cluster: one job, one target per role, each labelled with its node name
/// (the coordinator as "coordinator"). Returns "" or what is wrong.
std::string write_prometheus_config(const config::cluster_spec& spec, const observe_options& o,
                                    const std::filesystem::path& path, size_t* targets) {
  std::vector<std::pair<std::string, int64_t>> roles = {
      {"coordinator", config::coordinator_metrics_port(spec)}};
  for (size_t i = 0; i < spec.nodes.size(); ++i)
    roles.emplace_back(spec.nodes[i].name, config::node_config(spec, i).metrics.port);
  if (!spec.train.metrics.enabled) return "[metrics] enabled = false: there is nothing to scrape";
  for (const auto& [name, port] : roles) {
    if (port == 0)
      return "the metrics port of " + name +
             " is 0 (picked at start), so Prometheus cannot be told where to scrape; set [metrics] port "
             "(and [[nodes]] metrics_port) to fixed ports";
    if (port == o.port)
      return fmt::format("--observe-port {} is the metrics port of {}; pick another for Prometheus", o.port,
                         name);
  }
  // The ring and control ports bind later, once launch has started Prometheus: it would take one first.
  std::vector<std::pair<std::string, std::string>> endpoints;  // (role, tcp://HOST:PORT)
  for (const auto& c : spec.coordinators) endpoints.emplace_back("the coordinator's control", c);
  for (const auto& n : spec.nodes) endpoints.emplace_back("node " + n.name + "'s ring", n.endpoint);
  for (const auto& [role, endpoint] : endpoints) {
    const auto [host, port] = config::host_port(endpoint);
    if ((host == "127.0.0.1" || host == "0.0.0.0") && port == o.port)
      return fmt::format("--observe-port {} is {} port ({}); pick another for Prometheus", o.port, role,
                         endpoint);
  }
  if (const int err = runtime::bind_error("127.0.0.1", o.port))
    return fmt::format(
        "--observe-port {}: 127.0.0.1:{} cannot be bound: {}{}", o.port, o.port, std::strerror(err),
        err == EADDRINUSE ? " (another Prometheus, or this cluster's launch already running?)" : "");
  if (const auto problem = runtime::make_directories(path.parent_path().string()); !problem.empty())
    return path.parent_path().string() + ": " + problem;
  std::ofstream out(path, std::ios::trunc);
  out << "# Written by `longwave launch --observe` for cluster '" << spec.id << "'.\n"
      << "global:\n  scrape_interval: " << o.scrape_interval
      << "\n  evaluation_interval: " << o.scrape_interval
      << "\nscrape_configs:\n  - job_name: longwave\n    honor_labels: true  # keep each series' own node "
         "label\n"
      << "    static_configs:\n";
  const auto host = scrape_host(spec.train.metrics.address);
  for (const auto& [name, port] : roles)
    out << "      - targets: ['" << host << ":" << port << "']\n        labels: {node: '" << name << "'}\n";
  out.close();
  if (!out) return "cannot write " + path.string();
  *targets = roles.size();
  return {};
}

/// The nodes launch starts train in this machine's memory together: each checks its own estimate against the
/// machine's memory (a GPU node's host side too), so a sum past it would end in the OOM killer after
/// start-up. "" or what is wrong.
std::string nodes_memory_problem(const config::cluster_spec& spec) {
  const int64_t machine = runtime::physical_memory_bytes();
  if (machine <= 0 || spec.nodes.size() < 2) return "";
  double need = 0;
  for (size_t i = 0; i < spec.nodes.size(); ++i) {
    const auto cfg = config::node_config(spec, i);
    const auto model = models::spec_of(cfg.model, models::data::config_vocab(cfg));
    need += models::process_memory_bytes(model, cfg.train.batch_size,
                                         cfg.model.dtype == config::model_dtype::bf16, cfg.train.workers);
  }
  if (need <= static_cast<double>(machine)) return "";
  constexpr double mib = 1 << 20;
  return fmt::format(
      "launch: the memory estimate of the {} nodes it starts on this machine is {:.1f} MiB together, more "
      "than its {:.1f} MiB of memory; start some nodes on other machines (longwave node), or lower "
      "train.batch_size or train.workers, or use a smaller model",
      spec.nodes.size(), need / mib, static_cast<double>(machine) / mib);
}

/// The coordinator and every node, each with its command line (overrides passed on, --fresh to the nodes).
void add_roles(const std::string& exe, const std::string& cluster_path, const config::cluster_spec& spec,
               const std::vector<std::string>& overrides, bool fresh, std::vector<child>& children,
               std::vector<std::vector<std::string>>& args) {
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
}

/// --observe: writes prometheus.yml and adds Prometheus as the last child, its output to prometheus.log
/// beside it. Returns 0, or 2 after saying why it cannot.
int add_observer(const config::cluster_spec& spec, const observe_options& observe,
                 std::vector<child>& children, std::vector<std::vector<std::string>>& args) {
  if (access(observe.prometheus.c_str(), X_OK) != 0) {
    std::fprintf(stderr,
                 "launch: --observe needs Prometheus at %s (Debian package prometheus; scripts/setup "
                 "installs it)\n",
                 observe.prometheus.c_str());
    return 2;
  }
  const auto dir = std::filesystem::path(spec.train.run.out_dir) / "prometheus";
  const auto yml = dir / "prometheus.yml";
  size_t targets = 0;
  if (const auto problem = write_prometheus_config(spec, observe, yml, &targets); !problem.empty()) {
    std::fprintf(stderr, "launch: --observe: %s\n", problem.c_str());
    return 2;
  }
  child c;
  c.log_path = (dir / "prometheus.log").string();
  c.name = "prometheus";
  c.is_node = false;
  c.is_observer = true;
  children.push_back(std::move(c));
  args.push_back({observe.prometheus, "--config.file=" + yml.string(),
                  "--storage.tsdb.path=" + (dir / "data").string(),
                  "--web.listen-address=127.0.0.1:" + std::to_string(observe.port)});
  std::printf(
      "observe: Prometheus at http://127.0.0.1:%d (scraping %zu targets every %s; config %s, log %s)\n",
      observe.port, targets, observe.scrape_interval.c_str(), yml.c_str(), children.back().log_path.c_str());
  return 0;
}

/// Each role's log: out_dir/logs/<role>.log, appended to with a line that marks this launch. The folder's
/// lock, held until launch ends, keeps a second launch of the cluster from following the same files. Returns
/// 0, or after saying why: 2 when they cannot be written, 4 when another launch holds them.
int open_role_logs(const std::string& out_dir, std::vector<child>& children,
                   std::optional<runtime::run_lock>& lock) {
  const auto dir = std::filesystem::path(out_dir) / "logs";
  if (const auto problem = runtime::make_directories(dir.string()); !problem.empty()) {
    std::fprintf(stderr, "launch: the roles' logs: %s: %s\n", dir.c_str(), problem.c_str());
    return 2;
  }
  try {
    lock.emplace(dir.string(), "run.out_dir");
  } catch (const runtime::run_lock_busy& e) {
    std::fprintf(stderr,
                 "launch: another launch of a cluster with run.out_dir %s is running (pid %s); stop it first "
                 "(longwave stop CLUSTER.toml --wait), or choose another run.out_dir\n",
                 out_dir.c_str(), e.holder().c_str());
    return 4;  // as a run whose out_dir another holds
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch: the roles' logs: %s\n", e.what());
    return 2;
  }
  const auto stamp = report::utc_text(static_cast<double>(std::time(nullptr)));
  for (auto& c : children) {
    if (c.is_observer) continue;
    c.log_path = (dir / (c.name + ".log")).string();
    std::ofstream out(c.log_path, std::ios::app);
    out << "---- longwave launch, " << stamp << " ----\n";
    if (!out.flush()) {
      std::fprintf(stderr, "launch: cannot write %s: %s\n", c.log_path.c_str(), std::strerror(errno));
      return 2;
    }
  }
  std::printf("launch: each role's output is also kept in %s/<role>.log\n", dir.c_str());
  return 0;
}

/// What the supervising loop has seen and done so far.
struct launch_state {
  int handled_signals = 0;
  bool stopping = false;      // launch asked the roles to stop
  bool end_read = false;      // the coordinator ended first and its end record was read
  bool before_start = false;  // that record: stopped before training; launch stopped the starting nodes
  int first_failure = 0;
  int first_node_failure = 0;  // a node's comes first: the coordinator then fails for want of nodes
  std::chrono::steady_clock::time_point nodes_done_at = std::chrono::steady_clock::time_point::max();
};

/// Waits 100 ms and prints what the roles wrote meanwhile (a file is always readable: no poll).
void pump_output(std::vector<child>& children, size_t width) {
  usleep(100 * 1000);
  for (auto& c : children)
    if (c.out_fd >= 0) drain(c, width);
}

/// A new Ctrl-C: the first asks every role to stop, a later one kills them. Returns the signals so far.
int forward_signals(std::vector<child>& children, launch_state& st) {
  const int sigs = g_launch_signals.load();
  if (sigs > st.handled_signals) {
    st.handled_signals = sigs;
    if (sigs == 1) {
      std::printf(
          "launch: interrupt: stopping every role; each node saves a checkpoint (Ctrl-C again to kill)\n");
      signal_all(children, SIGINT);
      st.stopping = true;
    } else {
      std::printf("launch: second interrupt: killing every role\n");
      signal_all(children, SIGKILL);
    }
    std::fflush(stdout);
  }
  return sigs;
}

/// Collects a child that ended: its exit code, its last output; a failed role stops the others (unless
/// launch is stopping them already), an ended Prometheus is only reported.
void on_child_exit(std::vector<child>& children, child& c, int status, size_t width, launch_state& st,
                   int sigs) {
  c.running = false;
  c.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (c.out_fd >= 0) drain(c, width, true);
  if (c.is_observer) {
    if (!st.stopping && sigs == 0)
      std::printf("launch: Prometheus ended with exit code %d (see %s); training goes on\n", c.code,
                  c.log_path.c_str());
    std::fflush(stdout);
    return;
  }
  // A role killed by a signal (the OOM killer, kill -9) is a runtime failure: launch's own code is 1.
  if (c.code != 0 && c.code != 130) {
    const int code = WIFSIGNALED(status) ? 1 : c.code;
    if (st.first_failure == 0) st.first_failure = code;
    if (c.is_node && st.first_node_failure == 0) st.first_node_failure = code;
  }
  if (c.code != 0 && !st.stopping && sigs == 0) {
    const std::string how = WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status)) + " (" +
                                                      strsignal(WTERMSIG(status)) + ")"
                                                : "exit code " + std::to_string(c.code);
    std::printf("launch: %s %s ended with %s; stopping the others\n", c.is_node ? "node" : "the",
                c.name.c_str(), how.c_str());
    std::fflush(stdout);
    signal_all(children, SIGINT);
    st.stopping = true;
  }
}

/// Stops Prometheus once the cluster is done (its data stays in the run directory).
void stop_observer(std::vector<child>& children, const std::string& out_dir) {
  for (auto& c : children)
    if (c.is_observer && c.running) {
      kill(c.pid, SIGTERM);
      int status = 0;
      waitpid(c.pid, &status, 0);
      c.running = false;
      c.code = 0;
      std::printf("observe: Prometheus stopped; its data is in %s/prometheus/data\n", out_dir.c_str());
    }
}

/// Whether the coordinator's end record (RUN_DIR/coordinator.jsonl) says the cluster was stopped before it
/// began training.
bool stopped_before_start(const std::string& out_dir) {
  report::node_metrics c;
  if (!report::read_metrics_file(std::filesystem::path(out_dir) / "coordinator.jsonl", c).empty())
    return false;
  return !c.ends.empty() && report::text(c.ends.back(), "outcome") == "stopped_before_start";
}

/// The coordinator ended while nodes run. Stopped before training (`longwave stop` right after the launch),
/// a node that had not said hello yet would wait for it until join_timeout_s: launch stops them.
void after_coordinator(std::vector<child>& children, const std::string& out_dir, launch_state& st) {
  st.end_read = true;
  if (children[0].code != 0 || st.stopping || !stopped_before_start(out_dir)) return;
  std::printf(
      "launch: the cluster was stopped before it began training; stopping the nodes still starting\n");
  std::fflush(stdout);
  signal_all(children, SIGINT, /*nodes_only=*/true);
  st.stopping = true;
  st.before_start = true;
}

/// Runs the started children until every role has ended: output, Ctrl-C, exits, the coordinator's stop.
void supervise(std::vector<child>& children, size_t width, const std::string& out_dir, launch_state& st) {
  for (;;) {
    pump_output(children, width);
    const int sigs = forward_signals(children, st);
    bool nodes_running = false, any_running = false;
    for (auto& c : children) {
      int status = 0;
      if (c.running && waitpid(c.pid, &status, WNOHANG) == c.pid) {
        on_child_exit(children, c, status, width, st, sigs);
        if (c.is_observer) continue;
      }
      if (!c.is_observer) any_running = any_running || c.running || c.out_fd >= 0;
      nodes_running = nodes_running || (c.is_node && c.running);
    }
    if (!any_running) {
      stop_observer(children, out_dir);
      return;
    }
    if (nodes_running && !children[0].running && !st.end_read) after_coordinator(children, out_dir, st);
    // The coordinator ends by itself once every node said bye; give it 10 s, then stop it.
    if (!nodes_running) {
      const auto now = std::chrono::steady_clock::now();
      if (st.nodes_done_at == std::chrono::steady_clock::time_point::max()) st.nodes_done_at = now;
      if (now - st.nodes_done_at > std::chrono::seconds(10) && children[0].running) {
        kill(children[0].pid, SIGINT);
        st.nodes_done_at = now;
      }
    }
  }
}

/// Prints every role's exit code; returns launch's own: 130 after Ctrl-C, else the first node's failure
/// when the coordinator's own code says no more (0, 1, 130), else the first failure (1 for a role killed by
/// a signal), else the first non-zero role (not a starting node launch stopped: 130). A config every node
/// refuses after its welcome exits 2 from each node, and the coordinator, whose nodes all failed, often ends
/// first with 1: the cause is the nodes'.
int exit_code(const std::vector<child>& children, const launch_state& st) {
  std::string summary;
  for (const auto& c : children) summary += " " + c.name + "=" + std::to_string(c.code);
  std::printf("launch: exit codes:%s\n", summary.c_str());
  std::fflush(stdout);
  if (st.handled_signals > 0) return 130;
  const int coordinator = children[0].code;
  if (st.first_node_failure != 0 && (coordinator <= 1 || coordinator == 130)) return st.first_node_failure;
  if (st.first_failure != 0) return st.first_failure;
  for (const auto& c : children)
    if (c.code != 0 && !c.is_observer && !(st.before_start && c.is_node && c.code == 130)) return c.code;
  return 0;
}

}  // namespace

int launch(const std::string& exe, const std::string& cluster_path, const std::vector<std::string>& overrides,
           bool fresh, const observe_options& observe) {
  config::cluster_spec spec;
  try {
    spec = config::load_cluster_file(cluster_path, overrides);
  } catch (const config::config_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  if (const auto why = nodes_memory_problem(spec); !why.empty()) {
    std::fprintf(stderr, "%s\n", why.c_str());
    return 2;
  }
  std::vector<child> children;
  std::vector<std::vector<std::string>> args;
  add_roles(exe, cluster_path, spec, overrides, fresh, children, args);
  if (observe.enabled)
    if (const int code = add_observer(spec, observe, children, args); code != 0) return code;
  std::optional<runtime::run_lock> logs_lock;
  if (const int code = open_role_logs(spec.train.run.out_dir, children, logs_lock); code != 0) return code;
  size_t width = 0;
  for (const auto& c : children) width = std::max(width, c.name.size());

  std::printf("launch: cluster '%s': coordinator on %s and %zu nodes (%ld workers); Ctrl-C stops them all\n",
              spec.id.c_str(), spec.coordinator.c_str(), spec.nodes.size(), spec.train.train.workers);
  std::fflush(stdout);
  g_launch_signals = 0;
  runtime::count_stop_signals(g_launch_signals);
  try {
    for (size_t i = 0; i < children.size(); ++i) start(children[i], args[i]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch: %s\n", e.what());
    signal_all(children, SIGKILL);
    for (auto& c : children)
      if (c.is_observer && c.running) kill(c.pid, SIGKILL);
    return 1;
  }
  launch_state st;
  supervise(children, width, spec.train.run.out_dir, st);
  return exit_code(children, st);
}

}  // namespace longwave::cli
