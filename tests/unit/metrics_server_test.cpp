// Tests of runtime/metrics/metrics_server and of the Prometheus text parser the tests use.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/errors/errors.hpp"
#include "runtime/metrics/metrics_server.hpp"
#include "tests/support/prom_text.hpp"

using longwave::errc;
using longwave::lw_error;
using longwave::runtime::metrics_server;
using longwave::test::http_get;
using longwave::test::parse_prom_text;
using longwave::test::prom_value;

namespace {

// A plain TCP connection to 127.0.0.1:port that sends only what it is told to; closed when destroyed.
class raw_connection {
 public:
  explicit raw_connection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return;
    timeval limit{2, 0};  // bounds connect() and send()
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~raw_connection() {
    if (fd_ >= 0) ::close(fd_);
  }
  raw_connection(const raw_connection&) = delete;
  raw_connection& operator=(const raw_connection&) = delete;

  bool connected() const { return fd_ >= 0; }
  // Sends one byte; false once the server has closed the connection (no SIGPIPE).
  bool send_byte(char c) { return fd_ >= 0 && ::send(fd_, &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1; }
  bool send_all(const std::string& s) {
    return fd_ >= 0 && ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
  }
  // Appends what arrives within `limit` to `got`; true once the server has closed the connection.
  bool closed_within(std::chrono::milliseconds limit, std::string& got) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (fd_ >= 0 && std::chrono::steady_clock::now() < until) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 10) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return true;  // EOF, or reset by the server
      got.append(buf, static_cast<size_t>(n));
    }
    return false;
  }

 private:
  int fd_ = -1;
};

std::vector<std::unique_ptr<raw_connection>> open_connections(int port, int n) {
  std::vector<std::unique_ptr<raw_connection>> conns;
  for (int i = 0; i < n; ++i) conns.push_back(std::make_unique<raw_connection>(port));
  return conns;
}

int count_connected(const std::vector<std::unique_ptr<raw_connection>>& conns) {
  int n = 0;
  for (const auto& c : conns) n += c->connected() ? 1 : 0;
  return n;
}

// A scrape as Prometheus does it, giving up after `limit` (Prometheus's scrape_timeout).
struct scrape_result {
  bool answered = false;
  double seconds = 0;
  std::string error;
};

scrape_result scrape(int port, std::chrono::seconds limit) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(limit);
  cli.set_read_timeout(limit);
  cli.set_write_timeout(limit);
  const auto start = std::chrono::steady_clock::now();
  auto res = cli.Get("/metrics");
  scrape_result out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.answered = res && res->status == 200;
  out.error = res ? "HTTP " + std::to_string(res->status) : httplib::to_string(res.error());
  return out;
}

constexpr auto scrape_limit = std::chrono::seconds(3);

}  // namespace

CATCH_TEST_CASE("The metrics endpoint serves registered gauges and counters with their labels", "[metrics]") {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& loss = prometheus::BuildGauge().Name("longwave_test_loss").Help("Loss").Register(*registry);
  auto& steps =
      prometheus::BuildCounter().Name("longwave_test_steps_total").Help("Inner steps").Register(*registry);
  auto& loss0 = loss.Add({{"worker", "0"}});
  auto& loss1 = loss.Add({{"worker", "1"}});
  auto& steps_odd = steps.Add({{"rank", "1"}, {"note", "say \"hi\" \\ bye"}});
  loss0.Set(3.25);
  loss1.Set(std::numeric_limits<double>::quiet_NaN());
  steps_odd.Increment(42);

  metrics_server server(registry, 0);
  CATCH_REQUIRE(server.port() > 0);

  httplib::Client cli("127.0.0.1", server.port());
  auto res = cli.Get("/metrics");
  CATCH_REQUIRE(res);
  CATCH_CHECK(res->status == 200);
  CATCH_CHECK(res->get_header_value("Content-Type") == "text/plain; version=0.0.4");

  auto samples = parse_prom_text(res->body);
  CATCH_CHECK(prom_value(samples, "longwave_test_loss", {{"worker", "0"}}) == 3.25);
  auto nan = prom_value(samples, "longwave_test_loss", {{"worker", "1"}});
  CATCH_REQUIRE(nan.has_value());
  CATCH_CHECK(std::isnan(*nan));
  CATCH_CHECK(prom_value(samples, "longwave_test_steps_total",
                         {{"rank", "1"}, {"note", "say \"hi\" \\ bye"}}) == 42.0);
  CATCH_CHECK_FALSE(prom_value(samples, "longwave_test_steps_total", {{"rank", "1"}}).has_value());

  loss0.Set(1.5);
  steps_odd.Increment(8);
  samples = parse_prom_text(http_get(server.port(), "/metrics"));
  CATCH_CHECK(prom_value(samples, "longwave_test_loss", {{"worker", "0"}}) == 1.5);
  CATCH_CHECK(prom_value(samples, "longwave_test_steps_total",
                         {{"rank", "1"}, {"note", "say \"hi\" \\ bye"}}) == 50.0);

  CATCH_CHECK(http_get(server.port(), "/").find("/metrics") != std::string::npos);
}

CATCH_TEST_CASE("Binding a port that is already in use fails with a message naming the port", "[metrics]") {
  auto registry = std::make_shared<prometheus::Registry>();
  metrics_server first(registry, 0);
  const std::string port = std::to_string(first.port());
  lw_error err(errc::none, "");
  try {
    metrics_server second(registry, first.port());
  } catch (const lw_error& e) {
    err = e;
  }
  CATCH_CHECK(err.code() ==
              errc::invalid_config);  // the config's to change, or the run started twice: exit 2
  const std::string what = err.what();
  CATCH_CHECK(what.find("127.0.0.1:" + port) != std::string::npos);
  CATCH_CHECK(what.find("in use (is this run or cluster already running?)") != std::string::npos);
  CATCH_CHECK(what.find("metrics.port") != std::string::npos);
  // The first server is unaffected.
  CATCH_CHECK(http_get(first.port(), "/").find("metrics") != std::string::npos);
  // An address no interface here has (192.0.2.0/24 is for documentation) is the config's too: exit 2
  // before the run prepares its data, naming metrics.address (it was exit 1 after, naming the port).
  for (int p : {9999, 0}) {
    lw_error away(errc::none, "");
    try {
      if (p != 0) longwave::runtime::check_metrics_port_free("192.0.2.1", p);
      metrics_server server(registry, p, "192.0.2.1");
    } catch (const lw_error& e) {
      away = e;
    }
    CATCH_CHECK(away.code() == errc::invalid_config);
    CATCH_CHECK(std::string(away.what()).find("set metrics.address") != std::string::npos);
  }
}

CATCH_TEST_CASE("A stopped metrics server no longer answers and its port can be bound again", "[metrics]") {
  auto registry = std::make_shared<prometheus::Registry>();
  int port = 0;
  {
    metrics_server server(registry, 0);
    port = server.port();
    CATCH_CHECK(http_get(port, "/metrics").empty());  // nothing registered yet
  }
  bool refused = false;
  try {
    http_get(port, "/metrics");
  } catch (const std::runtime_error&) {
    refused = true;
  }
  CATCH_CHECK(refused);
  metrics_server again(registry, port);
  CATCH_CHECK(again.port() == port);
}

CATCH_TEST_CASE("The Prometheus text parser handles comments, escapes, special values and timestamps",
                "[metrics]") {
  const std::string text =
      "# HELP a_total Things\n"
      "# TYPE a_total counter\n"
      "a_total{path=\"C:\\\\dir\",msg=\"a \\\"quoted\\\" word\\nnext\",} 7 1700000000000\n"
      "\n"
      "b 1e3\n"
      "c{x=\"1\"} +Inf\n"
      "c{x=\"2\"} -Inf\n"
      "d NaN\n";
  const auto samples = parse_prom_text(text);
  CATCH_REQUIRE(samples.size() == 5);
  CATCH_CHECK(samples[0].labels.at("path") == "C:\\dir");
  CATCH_CHECK(samples[0].labels.at("msg") == "a \"quoted\" word\nnext");
  CATCH_CHECK(samples[0].value == 7);
  CATCH_CHECK(prom_value(samples, "b") == 1000.0);
  CATCH_CHECK(prom_value(samples, "c", {{"x", "1"}}) == std::numeric_limits<double>::infinity());
  CATCH_CHECK(prom_value(samples, "c", {{"x", "2"}}) == -std::numeric_limits<double>::infinity());
  CATCH_CHECK(std::isnan(*prom_value(samples, "d")));
  CATCH_CHECK_FALSE(prom_value(samples, "e").has_value());
  CATCH_CHECK_THROWS_AS(parse_prom_text("x{a=\"1} 2\n"), std::runtime_error);
  CATCH_CHECK_THROWS_AS(parse_prom_text("x{a=\"1\"} two\n"), std::runtime_error);
}

CATCH_TEST_CASE("A scrape is answered while 200 idle connections are open", "[metrics]") {
  auto registry = std::make_shared<prometheus::Registry>();
  metrics_server server(registry, 0);
  auto idle = open_connections(server.port(), 200);
  CATCH_REQUIRE(count_connected(idle) == 200);

  const auto res = scrape(server.port(), scrape_limit);
  CATCH_INFO("scrape: " << res.error << " after " << res.seconds << " s");
  CATCH_CHECK(res.answered);
}

CATCH_TEST_CASE("A scrape is answered while 50 slowloris connections trickle a request that never ends",
                "[metrics]") {
  auto registry = std::make_shared<prometheus::Registry>();
  metrics_server server(registry, 0);
  auto slow = open_connections(server.port(), 50);
  CATCH_REQUIRE(count_connected(slow) == 50);

  // Each connection sends one more byte of an endless header every 200 ms, for at most 15 s.
  const std::string head = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    for (size_t i = 0; !done && std::chrono::steady_clock::now() < until; ++i) {
      for (auto& c : slow) c->send_byte(i < head.size() ? head[i] : 'a');
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the server is now reading 50 partial requests

  const auto res = scrape(server.port(), scrape_limit);
  done = true;
  trickle.join();
  CATCH_INFO("scrape: " << res.error << " after " << res.seconds << " s");
  CATCH_CHECK(res.answered);
}

CATCH_TEST_CASE("An idle connection is closed after a second and a request trickled for two seconds gets 400",
                "[metrics]") {
  auto registry = std::make_shared<prometheus::Registry>();
  metrics_server server(registry, 0);
  const auto start = std::chrono::steady_clock::now();
  auto seconds_since_start = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };

  raw_connection idle(server.port());
  std::string got;
  CATCH_CHECK(idle.closed_within(std::chrono::seconds(3), got));
  CATCH_CHECK(got.empty());
  CATCH_CHECK(seconds_since_start() > 0.5);  // not closed at once: nobody else was waiting

  // A byte every 200 ms restarts httplib's own read timeout every time; the request deadline still ends it.
  raw_connection slow(server.port());
  CATCH_REQUIRE(slow.send_all("GET /metrics HTTP/1.1\r\nX-Slow: "));
  bool closed = false;
  for (int i = 0; i < 30 && !closed; ++i) {  // at most 6 s
    slow.send_byte('a');
    closed = slow.closed_within(std::chrono::milliseconds(200), got);
  }
  CATCH_CHECK(closed);
  CATCH_CHECK(got.rfind("HTTP/1.1 400", 0) == 0);
}

CATCH_TEST_CASE("A kept-alive connection serves a second scrape after a pause", "[metrics]") {
  auto registry = std::make_shared<prometheus::Registry>();
  metrics_server server(registry, 0);
  raw_connection conn(server.port());
  const std::string request = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  std::string first;
  std::string second;
  CATCH_REQUIRE(conn.send_all(request));
  CATCH_CHECK_FALSE(conn.closed_within(std::chrono::milliseconds(500), first));
  CATCH_REQUIRE(conn.send_all(request));
  CATCH_CHECK_FALSE(conn.closed_within(std::chrono::milliseconds(300), second));
  CATCH_CHECK(first.rfind("HTTP/1.1 200", 0) == 0);
  CATCH_CHECK(second.rfind("HTTP/1.1 200", 0) == 0);
  CATCH_CHECK(second.find("/metrics") != std::string::npos);
}
