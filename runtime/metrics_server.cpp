// The metrics HTTP endpoint: cpp-httplib on a thread of its own, serializing the registry per scrape.
#include "runtime/metrics_server.hpp"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "runtime/errors.hpp"

namespace longwave::runtime {

namespace {

// httplib reports only that binding failed; bind once more ourselves to learn why.
std::string why_bind_fails(const std::string& address, int port) {
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return std::strerror(errno);
  int yes = 1;
  ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, address.c_str(), &addr.sin_addr);
  std::string reason = "bind failed";
  if (::bind(s, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    reason = std::strerror(errno);
  } else if (::listen(s, 1) != 0) {
    reason = std::strerror(errno);
  }
  ::close(s);
  return reason;
}

}  // namespace

metrics_server::metrics_server(std::shared_ptr<prometheus::Registry> registry, int port,
                               const std::string& address)
    : registry_(std::move(registry)), server_(std::make_unique<httplib::Server>()), address_(address) {
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

  // Two threads are plenty for a scrape endpoint (httplib's default is at least 8).
  server_->new_task_queue = [] { return new httplib::ThreadPool(2); };
  // httplib's default sets SO_REUSEPORT, which would let a second process bind the same port and share
  // scrapes.
  server_->set_socket_options([](socket_t s) {
    int yes = 1;
    ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // Short keep-alive so that the destructor does not wait long on an idle scraper connection.
  server_->set_keep_alive_timeout(1);
  server_->set_read_timeout(5);
  server_->set_write_timeout(5);

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
  if (!bound)
    throw lw_error(errc::io_error, "metrics: cannot bind " + std::string(host) + ":" + std::to_string(port) +
                                       ": " + why_bind_fails(address_, port) +
                                       "; set metrics.port to a free port or 0");

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
