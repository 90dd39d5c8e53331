// Tests of runtime/metrics_server and of the Prometheus text parser the tests use.
#include <catch2/catch.hpp>

#include <httplib.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "runtime/errors.hpp"
#include "runtime/metrics_server.hpp"
#include "tests/support/prom_text.hpp"

using longwave::errc;
using longwave::lw_error;
using longwave::runtime::metrics_server;
using longwave::test::http_get;
using longwave::test::parse_prom_text;
using longwave::test::prom_value;

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
  CATCH_CHECK(err.code() == errc::io_error);
  const std::string what = err.what();
  CATCH_CHECK(what.find("127.0.0.1:" + port) != std::string::npos);
  CATCH_CHECK(what.find("in use") != std::string::npos);
  CATCH_CHECK(what.find("metrics.port") != std::string::npos);
  // The first server is unaffected.
  CATCH_CHECK(http_get(first.port(), "/").find("metrics") != std::string::npos);
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
