#pragma once
// Prometheus scrape endpoint: serves a prometheus-cpp registry over HTTP with cpp-httplib, because
// prometheus-cpp's civetweb Exposer cannot start threads in a process that has libtorch and OpenBLAS loaded.
#include <atomic>
#include <memory>
#include <string>
#include <thread>

namespace httplib {
class Server;
}
namespace prometheus {
class Registry;
}

namespace longwave::runtime {

/// An HTTP server (127.0.0.1 unless configured) answering GET /metrics with the registry in the Prometheus
/// text format. Idle or slow clients cannot keep a scrape out: four connections are served at once, a
/// request must start within 1 s (of connecting or of the previous response) and arrive whole within 2 s of
/// its first byte, and a connection waiting for bytes is closed at once when another connection is queued.
/// Throws what metrics_server would when `address:port` is held by another process or the address is not
/// this machine's (lw_error invalid_config): a run checks it before preparing its data. Port 0 or a free
/// port: nothing.
void check_metrics_port_free(const std::string& address, int port);

class metrics_server {
 public:
  /// Binds address:port (port 0 = any free port; address an IPv4 address, 127.0.0.1 by default) and serves
  /// GET /metrics with prometheus::TextSerializer().Serialize(registry->Collect()), content type "text/plain;
  /// version=0.0.4". GET / returns a one-line hint. The socket does not use SO_REUSEPORT, so a port already
  /// in use is an error. Throws lw_error(io_error, "metrics: cannot bind <address>:<port>: ...; set
  /// metrics.port to a free port or 0") if binding fails and lw_error(invalid_config) if port is outside
  /// 0..65535 or address is not an IPv4 address.
  metrics_server(std::shared_ptr<prometheus::Registry> registry, int port,
                 const std::string& address = "127.0.0.1");
  /// Stops accepting, finishes open requests and joins the server thread.
  ~metrics_server();
  metrics_server(const metrics_server&) = delete;
  metrics_server& operator=(const metrics_server&) = delete;

  /// The bound port (the one chosen by the OS when constructed with port 0).
  int port() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> listen_done_{false};
  int port_ = 0;
  std::string address_;
};

}  // namespace longwave::runtime
