// The metrics HTTP endpoint: cpp-httplib on a thread of its own, serializing the registry per scrape.
#include "runtime/metrics/metrics_server.hpp"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "runtime/errors/errors.hpp"
#include "runtime/process/port_check.hpp"

namespace longwave::runtime {

namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// Connections served at once; the others wait in httplib's queue.
constexpr size_t n_workers = 4;
// A connection (new, or kept alive after a response) is closed when the next request has not started by then.
constexpr auto idle_limit = std::chrono::seconds(1);
// A whole request must arrive within this of its first byte. httplib's read timeout restarts on every
// byte, so without this a client trickling one byte a second keeps a worker forever (slowloris).
constexpr auto request_limit = std::chrono::seconds(2);
// How long one send may block (httplib sets it on each accepted socket as SO_SNDTIMEO).
constexpr auto write_limit = std::chrono::seconds(5);
// How often a waiting connection checks whether it should give way or the server is stopping.
constexpr int poll_slice_ms = 20;

// httplib's thread pool, counting the accepted connections that no worker has taken yet.
class counting_pool : public httplib::ThreadPool {
 public:
  counting_pool(size_t n, std::atomic<int>& n_queued) : httplib::ThreadPool(n), n_queued_(n_queued) {}
  void enqueue(std::function<void()> fn) override {
    ++n_queued_;
    httplib::ThreadPool::enqueue([&n = n_queued_, fn = std::move(fn)] {
      --n;
      fn();
    });
  }

 private:
  std::atomic<int>& n_queued_;
};

// One connection's socket as httplib reads requests from it, under idle_limit and request_limit. While
// no byte is waiting, it gives up as soon as another connection is queued or the server stops: idle and
// slow connections then cost the queue almost nothing, so a scrape behind them is answered at once.
class guarded_stream : public httplib::Stream {
 public:
  guarded_stream(socket_t sock, std::function<bool()> give_way)
      : sock_(sock), give_way_(std::move(give_way)) {}

  // Starts waiting for the next request on this connection.
  void next_request() {
    in_request_ = false;
    deadline_ = steady_clock::now() + idle_limit;
  }

  bool is_readable() const override { return pos_ < end_ || poll_for(POLLIN, 0); }
  bool is_writable() const override {
    return poll_for(POLLOUT, static_cast<int>(milliseconds(write_limit).count()));
  }
  // Whether a read gave up (deadline, give way): the connection is then closed, not kept alive.
  bool gave_up() const { return gave_up_; }

  ssize_t read(char* ptr, size_t size) override {
    if (pos_ == end_) {
      if (!wait_readable()) {
        gave_up_ = true;
        return -1;
      }
      const ssize_t n = ::recv(sock_, buf_.data(), buf_.size(), 0);
      if (n <= 0) return n;
      pos_ = 0;
      end_ = static_cast<size_t>(n);
      if (!in_request_) {
        in_request_ = true;
        deadline_ = steady_clock::now() + request_limit;
      }
    }
    const size_t n = std::min(size, end_ - pos_);
    std::memcpy(ptr, buf_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    // SO_SNDTIMEO (httplib's write timeout, set on accept) bounds a blocked send.
    return ::send(sock_, ptr, size, MSG_NOSIGNAL);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { name_of(::getpeername, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { name_of(::getsockname, ip, port); }
  socket_t socket() const override { return sock_; }

 private:
  bool poll_for(short events, int timeout_ms) const {
    pollfd p{sock_, events, 0};
    return ::poll(&p, 1, timeout_ms) > 0;
  }

  // Waits for a byte (or the peer closing) until the deadline. It looks once without waiting before it gives
  // way, so a request already there (a scrape that was queued) is always read.
  bool wait_readable() {
    for (int slice_ms = 0;; slice_ms = poll_slice_ms) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline_ - steady_clock::now()).count();
      if (left <= 0) return false;
      if (poll_for(POLLIN, static_cast<int>(std::min<long long>(left, slice_ms)))) return true;
      if (give_way_()) return false;
    }
  }

  template <class GetName>
  void name_of(GetName get, std::string& ip, int& port) const {
    sockaddr_in addr{};
    socklen_t len = sizeof addr;
    std::array<char, INET_ADDRSTRLEN> text{};
    if (get(sock_, reinterpret_cast<sockaddr*>(&addr), &len) == 0 && addr.sin_family == AF_INET &&
        ::inet_ntop(AF_INET, &addr.sin_addr, text.data(), text.size()) != nullptr) {
      ip = text.data();
      port = ntohs(addr.sin_port);
    }
  }

  socket_t sock_;
  std::function<bool()> give_way_;
  std::array<char, 4096> buf_{};
  size_t pos_ = 0;
  size_t end_ = 0;
  bool in_request_ = false;
  bool gave_up_ = false;
  steady_clock::time_point deadline_;
};

// httplib's server with its per-connection loop replaced: the same keep-alive requests, read through a
// guarded_stream, on a counting_pool of n_workers.
class guarded_server : public httplib::Server {
 public:
  guarded_server() {
    new_task_queue = [this] { return new counting_pool(n_workers, n_queued_); };
  }

  // httplib listens with a backlog of 5, which overflows when a few hundred connections arrive at once, and
  // a dropped handshake delays the client by a second or more; Linux lets listen() raise it on a bound
  // socket.
  void widen_backlog() { ::listen(svr_sock_, SOMAXCONN); }

 private:
  bool process_and_close_socket(socket_t sock) override {
    guarded_stream strm(sock, [this] { return n_queued_ > 0 || svr_sock_ == INVALID_SOCKET; });
    bool ok = true;
    for (size_t n = 1; ok && n <= keep_alive_max_count_; ++n) {
      strm.next_request();
      bool closed = false;
      ok = process_request(strm, n == keep_alive_max_count_, closed, nullptr);
      if (closed || strm.gave_up()) break;
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
  }

  std::atomic<int> n_queued_{0};
};

/// Binding address:port failed with err (0: not known why).
[[noreturn]] void throw_bind_error(const std::string& address, int port, int err) {
  const std::string why = err ? std::strerror(err) : "bind failed";
  // A port in use is the config's to change (exit 2), or the same run started twice; an address that is not
  // this machine's is the config's too.
  const bool config = err == EADDRINUSE || err == EADDRNOTAVAIL;
  throw lw_error(config ? errc::invalid_config : errc::io_error,
                 "metrics: cannot bind " + address + ":" + std::to_string(port) + ": " + why +
                     (err == EADDRINUSE      ? " (is this run or cluster already running?); if not, set "
                                               "metrics.port (a cluster file's metrics_port) to a free port or 0"
                      : err == EADDRNOTAVAIL ? " (no interface of this machine has that address); set "
                                               "metrics.address to one of its addresses, or 127.0.0.1"
                                             : "; set metrics.port to a free port or 0"));
}

}  // namespace

void check_metrics_port_free(const std::string& address, int port) {
  if (port <= 0 || port > 65535) return;  // any port, or one the server refuses by itself
  const int err = runtime::bind_error(address, port);
  if (err == EADDRINUSE || err == EADDRNOTAVAIL) throw_bind_error(address, port, err);
}

metrics_server::metrics_server(std::shared_ptr<prometheus::Registry> registry, int port,
                               const std::string& address)
    : registry_(std::move(registry)), server_(std::make_unique<guarded_server>()), address_(address) {
  LW_ASSERT(registry_ != nullptr, "metrics_server needs a registry");
  if (port < 0 || port > 65535)
    throw lw_error(errc::invalid_config, "metrics: port " + std::to_string(port) +
                                             " is out of range; set metrics.port to 0..65535");
  in_addr probe{};
  if (::inet_pton(AF_INET, address_.c_str(), &probe) != 1)
    throw lw_error(
        errc::invalid_config,
        "metrics: address '" + address_ + "' is not an IPv4 address; set metrics.address to e.g. 127.0.0.1");
  const char* host = address_.c_str();

  // httplib's default sets SO_REUSEPORT, which would let a second process bind the same port and share
  // scrapes.
  server_->set_socket_options([](socket_t s) {
    int yes = 1;
    ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // Timeouts while reading a request are guarded_stream's (idle_limit, request_limit); httplib sets these on
  // each accepted socket as SO_RCVTIMEO and SO_SNDTIMEO.
  server_->set_read_timeout(request_limit);
  server_->set_write_timeout(write_limit);

  auto reg = registry_;
  server_->Get("/metrics", [reg](const httplib::Request&, httplib::Response& res) {
    try {
      res.set_content(prometheus::TextSerializer().Serialize(reg->Collect()), "text/plain; version=0.0.4");
    } catch (const std::exception& e) {
      res.status = 500;
      res.set_content(std::string("metrics: cannot collect: ") + e.what() + "\n", "text/plain");
    }
  });
  server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("Longwave metrics: GET /metrics (Prometheus text format)\n", "text/plain");
  });

  bool bound = false;
  if (port == 0) {
    port_ = server_->bind_to_any_port(host);
    bound = port_ > 0;
  } else {
    port_ = port;
    bound = server_->bind_to_port(host, port);
  }
  // httplib says only that binding failed
  if (!bound) throw_bind_error(address_, port, runtime::bind_error(address_, port));
  static_cast<guarded_server&>(*server_).widen_backlog();

  thread_ = std::thread([this] {
    server_->listen_after_bind();
    listen_done_ = true;
  });
  // stop() is a no-op until the accept loop runs, so wait for it before anyone may call the destructor.
  while (!server_->is_running() && !listen_done_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!server_->is_running()) {
    thread_.join();
    throw lw_error(errc::io_error, "metrics: the server on " + std::string(host) + ":" +
                                       std::to_string(port_) + " stopped right after it started");
  }
}

metrics_server::~metrics_server() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

int metrics_server::port() const {
  return port_;
}

}  // namespace longwave::runtime
