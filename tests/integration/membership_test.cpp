// The coordinator's membership protocol on real ZeroMQ sockets, with the test playing two nodes through
// control_client: a ring failure fences both, the membership keeps the all-reduce that every member holds
// (the smallest reached key) and redoes the rest, and a ring that keeps failing without progress ends the run
// with a line that says so.
#include <catch2/catch.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <variant>
#include <vector>

#include "cluster/control_client.hpp"
#include "cluster/envelope.hpp"
#include "cluster/master.hpp"
#include "tests/support/errors.hpp"
#include "tests/support/process.hpp"

using namespace longwave;
using namespace longwave::comm;
using namespace longwave::cluster;

namespace {

constexpr uint64_t cluster_id = 0x6d656d62;

/// Polls c until an event of kind k arrives (or 10 s pass).
std::optional<control_event> next_event(control_client& c, control_event::kind k) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    for (auto& ev : c.poll())
      if (ev.what == k) return ev;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::nullopt;
}

fence_ack_msg ack(uint64_t epoch, reduce_key committed, std::optional<reduce_key> pending, bool held) {
  fence_ack_msg a;
  a.epoch = epoch;
  a.committed = committed;
  a.has_pending = pending.has_value();
  if (pending) a.pending = *pending;
  a.have_result = held;
  return a;
}

/// Node `name`'s hello, its ring endpoint on 127.0.0.1:`port` (never bound: the tests speak control only).
hello_msg hello_of(const std::string& name, int port) {
  hello_msg h;
  h.protocol_version = protocol_version();
  h.cluster_id = cluster_id;
  h.node_name = name;
  h.n_workers = 1;
  h.data_endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  return h;
}

/// A coordinator of nodes a and b on a free port.
master_options two_nodes(std::chrono::milliseconds join_timeout) {
  master_options o;
  o.bind_endpoint = "tcp://127.0.0.1:" + std::to_string(test::free_port());
  o.cluster_id = cluster_id;
  o.members = {{"a", "tcp://127.0.0.1:1", 1}, {"b", "tcp://127.0.0.1:2", 1}};
  o.join_timeout = join_timeout;
  return o;
}

}  // namespace

CATCH_TEST_CASE("a node started before its coordinator waits its whole join time from when it reaches it",
                "[integration][membership]") {
  // A probe's node, started 10 s before the coordinator, gave up at its own 35 s ("cannot reach the
  // coordinator") while the coordinator, which had its hello, waited within its join deadline for the others.
  auto o = two_nodes(std::chrono::seconds(60));
  std::atomic<bool> stop{false};
  o.stop = [&] { return stop.load(); };
  const auto join_time = std::chrono::seconds(8);
  const auto began = std::chrono::steady_clock::now();
  control_client a(o.bind_endpoint, cluster_id), b(o.bind_endpoint, cluster_id);
  auto wa = std::async(std::launch::async, [&] { return a.join(hello_of("a", 1), join_time); });
  // The coordinator comes 6 s after a, b 10 s after a: past a's 8 s from its start, within 8 s of its reach.
  std::this_thread::sleep_until(began + std::chrono::seconds(6));
  auto coord = std::async(std::launch::async, [&] { return run_master(o); });
  std::this_thread::sleep_until(began + std::chrono::seconds(10));
  const auto wb = b.join(hello_of("b", 2), std::chrono::seconds(20));
  CATCH_CHECK(std::holds_alternative<welcome_msg>(wb));
  CATCH_CHECK(std::holds_alternative<welcome_msg>(wa.get()));  // it threw deadline_missed at 8 s
  stop = true;
  coord.get();
}

CATCH_TEST_CASE("a joiner's hello is not turned away by the answer to a join_ready it sent before",
                "[integration][membership]") {
  // A probe: a joiner told by a restarted coordinator to say hello again (it sends join_ready every 2 s, so
  // it was told twice) read the second "say hello again" as its hello's answer and exited 2.
  auto o = two_nodes(std::chrono::seconds(20));
  std::atomic<bool> stop{false};
  o.stop = [&] { return stop.load(); };
  auto coord = std::async(std::launch::async, [&] { return run_master(o); });
  control_client a(o.bind_endpoint, cluster_id), b(o.bind_endpoint, cluster_id);
  const join_ready_msg ready{reduce_key{4, 0}, 4};
  CATCH_CHECK(test::error_of([&] { a.join_ready(ready, std::chrono::seconds(20)); }) == errc::not_announced);
  // Sent again, its answer unread: it comes before the hello's (one connection keeps the order).
  CATCH_CHECK(test::error_of([&] { a.join_ready(ready, std::chrono::milliseconds(0)); }) ==
              errc::deadline_missed);
  auto wa =
      std::async(std::launch::async, [&] { return a.join(hello_of("a", 1), std::chrono::seconds(20)); });
  CATCH_CHECK(std::holds_alternative<welcome_msg>(b.join(hello_of("b", 2), std::chrono::seconds(20))));
  CATCH_CHECK(std::holds_alternative<welcome_msg>(wa.get()));  // it threw invalid_config
  stop = true;
  coord.get();
}

CATCH_TEST_CASE("ring failures: fence, the smallest reached key is kept, and endless resets end the run",
                "[integration][membership]") {
  auto o = two_nodes(std::chrono::seconds(20));
  std::vector<std::string> lines;
  std::mutex lines_mu;
  o.info = o.warn = [&](const std::string& s) {
    std::lock_guard<std::mutex> lk(lines_mu);
    lines.push_back(s);
  };
  std::atomic<bool> stop{false};
  o.stop = [&] { return stop.load(); };
  auto coord = std::async(std::launch::async, [&] { return run_master(o); });

  control_client a(o.bind_endpoint, cluster_id), b(o.bind_endpoint, cluster_id);
  auto wa = std::async(std::launch::async, [&] {
    return std::get<cluster::welcome_msg>(a.join(hello_of("a", 1), std::chrono::seconds(20)));
  });
  const auto wb = std::get<cluster::welcome_msg>(b.join(hello_of("b", 2), std::chrono::seconds(20)));
  const auto welcome_a = wa.get();
  CATCH_REQUIRE(welcome_a.epoch == 1);
  CATCH_REQUIRE(wb.rank == 1);
  a.heartbeat(3, 1);
  b.heartbeat(3, 1);

  // Each step: a reports a ring failure, both answer the fence (holding the pending result or not), and the
  // membership keeps `kept`.
  uint64_t epoch = 1;
  // 1: a holds round 4's result, b does not: round 3 is kept and round 4 redone.
  // 2: both hold round 4's result: it is kept. 3, 4: nothing new (no progress).
  const std::vector<std::tuple<bool, bool, reduce_key>> steps{
      {true, false, {3, 0}}, {true, true, {4, 0}}, {false, false, {4, 0}}, {false, false, {4, 0}}};
  reduce_key committed{3, 0};
  for (const auto& [held_a, held_b, kept] : steps) {
    a.ring_failed({epoch, "", "test: the next rank went away"});
    const auto fa = next_event(a, control_event::kind::fence), fb = next_event(b, control_event::kind::fence);
    CATCH_REQUIRE(fa.has_value());
    CATCH_REQUIRE(fb.has_value());
    CATCH_CHECK(fa->epoch == epoch + 1);
    const std::optional<reduce_key> pending =
        committed == reduce_key{4, 0} ? std::optional<reduce_key>({5, 0}) : std::optional<reduce_key>({4, 0});
    a.fence_ack(ack(fa->epoch, committed, pending, held_a));
    b.fence_ack(ack(fb->epoch, committed, pending, held_b));
    const auto ma = next_event(a, control_event::kind::membership);
    const auto mb = next_event(b, control_event::kind::membership);
    CATCH_REQUIRE(ma.has_value());
    CATCH_REQUIRE(mb.has_value());
    CATCH_CHECK(ma->membership.commit == kept);
    CATCH_CHECK(mb->membership.commit == kept);
    CATCH_CHECK(ma->membership.peers.size() == 2);
    CATCH_CHECK(mb->membership.rank == 1);
    epoch = ma->epoch;
    committed = kept;
    a.heartbeat(kept.round, epoch);
    b.heartbeat(kept.round, epoch);
  }
  CATCH_CHECK(epoch == 5);

  // A fourth reset at the same key: the run is called off, and both nodes are told why.
  a.ring_failed({epoch, "", "test: the next rank went away"});
  const auto fa = next_event(a, control_event::kind::fence), fb = next_event(b, control_event::kind::fence);
  CATCH_REQUIRE(fa.has_value());
  CATCH_REQUIRE(fb.has_value());
  a.fence_ack(ack(fa->epoch, committed, reduce_key{5, 0}, false));
  b.fence_ack(ack(fb->epoch, committed, reduce_key{5, 0}, false));
  const auto na = next_event(a, control_event::kind::notice);
  CATCH_REQUIRE(na.has_value());
  CATCH_CHECK(na->code == errc::evicted);
  CATCH_CHECK(na->text.find("the ring failed 4 times in a row") != std::string::npos);
  CATCH_CHECK(na->text.find("test: the next rank went away") != std::string::npos);
  CATCH_REQUIRE(coord.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CATCH_CHECK(coord.get() == 1);
  std::lock_guard<std::mutex> lk(lines_mu);
  bool said = false;
  for (const auto& l : lines) said = said || l.find("coordinator: the ring failed 4 times in a row") == 0;
  CATCH_CHECK(said);
}

namespace {

/// A coordinator of nodes a and b on a free loopback port, run on its own thread, with its lines and error
/// reasons kept; `a` and `b` are the test's control clients, joined.
struct two_node_cluster {
  master_options o;
  std::vector<std::string> lines, errors;
  std::mutex mu;
  std::atomic<bool> stop{false};
  std::future<int> coord;
  std::unique_ptr<control_client> a, b;

  two_node_cluster() {
    o = two_nodes(std::chrono::seconds(20));
    o.info = o.warn = [&](const std::string& s) {
      std::lock_guard<std::mutex> lk(mu);
      lines.push_back(s);
    };
    o.on_error = [&](const std::string& reason) {
      std::lock_guard<std::mutex> lk(mu);
      errors.push_back(reason);
    };
    o.stop = [&] { return stop.load(); };
    coord = std::async(std::launch::async, [&] { return run_master(o); });
    a = std::make_unique<control_client>(o.bind_endpoint, cluster_id);
    b = std::make_unique<control_client>(o.bind_endpoint, cluster_id);
    auto wa =
        std::async(std::launch::async, [&] { return a->join(hello_of("a", 1), std::chrono::seconds(20)); });
    CATCH_REQUIRE(std::holds_alternative<welcome_msg>(b->join(hello_of("b", 2), std::chrono::seconds(20))));
    CATCH_REQUIRE(std::holds_alternative<welcome_msg>(wa.get()));
    a->heartbeat(0, 1);
    b->heartbeat(0, 1);
  }
  ~two_node_cluster() {
    stop = true;
    if (coord.valid()) coord.wait();
  }

  /// The round after which the coordinator tells `node` to stop (queries, round 0, are skipped); 0 if none
  /// comes within 10 s.
  static uint64_t stop_round(control_client& node) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      for (auto& ev : node.poll())
        if (ev.what == control_event::kind::stop && ev.round > 0) return ev.round;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return 0;
  }
  /// How many of the coordinator's lines contain `text` (waiting up to 10 s for at least `want`).
  size_t said(const std::string& text, size_t want = 1) {
    size_t n = 0;
    test::wait_until(
        [&] {
          std::lock_guard<std::mutex> lk(mu);
          n = 0;
          for (const auto& l : lines) n += l.find(text) != std::string::npos;
          return n >= want;
        },
        10);
    return n;
  }
};

}  // namespace

CATCH_TEST_CASE(
    "longwave stop: each member says where it holds, all are told the largest, and they stop there",
    "[integration][membership][stop]") {
  two_node_cluster c;
  control_client requester(c.o.bind_endpoint, cluster_id);
  const auto [code, text] = requester.request_stop(std::chrono::seconds(10));
  CATCH_CHECK(code == errc::none);
  CATCH_CHECK(text.find("the cluster stops at its next round boundary: a, b finish their current round") ==
              0);
  // Both are asked where they can stop (round 0); a is in round 7, b already in round 8.
  const auto qa = next_event(*c.a, control_event::kind::stop),
             qb = next_event(*c.b, control_event::kind::stop);
  CATCH_REQUIRE(qa.has_value());
  CATCH_REQUIRE(qb.has_value());
  CATCH_CHECK(qa->round == 0);
  CATCH_CHECK(qb->round == 0);
  c.a->stop_ack(7);
  // Until b has answered, no round is decided; a second request is told the cluster is already stopping.
  const auto again = requester.request_stop(std::chrono::seconds(10));
  CATCH_CHECK(again.second == "the cluster is already stopping: its nodes are finishing their current round");
  c.b->stop_ack(8);
  CATCH_CHECK(two_node_cluster::stop_round(*c.a) == 8);
  CATCH_CHECK(two_node_cluster::stop_round(*c.b) == 8);
  CATCH_CHECK(c.said("coordinator: every node stops after round 8 (a, b)") == 1);
  c.a->bye("stopped");
  c.b->bye("stopped");
  CATCH_REQUIRE(c.coord.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CATCH_CHECK(c.coord.get() == 0);
  CATCH_CHECK(c.said("coordinator: every node stopped after round 8 (longwave stop)") == 1);
}

CATCH_TEST_CASE("members report theta's CRC each round and the coordinator names and counts a mismatch once",
                "[integration][membership]") {
  two_node_cluster c;
  c.a->committed(1, 0x11111111);
  c.b->committed(1, 0x11111111);
  c.a->committed(2, 0x22222222);
  c.b->committed(2, 0x2222222f);
  c.b->committed(2, 0x2222222f);  // a repeat names nothing new
  c.a->committed(3, 0x33333333);
  c.b->committed(3, 0x33333333);
  c.a->bye("done");
  c.b->bye("done");
  CATCH_REQUIRE(c.coord.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CATCH_CHECK(c.coord.get() == 0);
  // a's and b's reports cross on two connections: either may be the first one of round 2.
  CATCH_CHECK(c.said("coordinator: theta after round 2 differs between nodes: ") == 1);
  CATCH_CHECK(c.said("a has 22222222") == 1);
  CATCH_CHECK(c.said("b has 2222222f") == 1);
  CATCH_CHECK(c.said("theta after round") == 1);
  std::lock_guard<std::mutex> lk(c.mu);
  CATCH_CHECK(c.errors == std::vector<std::string>{"theta_mismatch"});
}

CATCH_TEST_CASE("an NCCL epoch's rank 0 makes the id, and the coordinator hands it to the other member",
                "[integration][membership]") {
  two_node_cluster c;
  // b waits for epoch 1's id; a stop query that comes first is kept for b's next poll, not lost.
  auto got = std::async(std::launch::async, [&] { return c.b->wait_nccl_id(1, std::chrono::seconds(20)); });
  control_client op(c.o.bind_endpoint, cluster_id);  // `longwave stop`
  CATCH_REQUIRE(op.request_stop(std::chrono::seconds(10)).first == errc::none);
  CATCH_REQUIRE(c.said("asking a, b where they can stop") == 1);  // the query went to b before the id
  const std::string id(256, 'c');
  c.a->nccl_id(1, id);
  CATCH_CHECK(got.get() == id);
  // The query is b's at once, from the wait's keeping (a repeat would come only 2 s later).
  const auto next = c.b->poll();
  CATCH_CHECK(std::any_of(next.begin(), next.end(),
                          [](const control_event& ev) { return ev.what == control_event::kind::stop; }));
  CATCH_CHECK(c.said("epoch 1's NCCL id from a goes to b") == 1);
  // An id for an epoch that never comes: b gives up, naming it.
  try {
    c.b->wait_nccl_id(5, std::chrono::milliseconds(300));
    CATCH_FAIL("no id came, yet the wait returned");
  } catch (const lw_error& e) {
    CATCH_CHECK(e.code() == errc::peer_lost);
    CATCH_CHECK(std::string(e.what()).find("no NCCL id for epoch 5") != std::string::npos);
  }
}

namespace {

/// A coordinator played by the test: a ROUTER socket that answers the node that spoke last.
struct fake_coordinator {
  zmq::context_t ctx;
  zmq::socket_t sock{ctx, zmq::socket_type::router};
  std::string endpoint = "tcp://127.0.0.1:" + std::to_string(test::free_port());
  std::string node;  // the routing id of the last frame's sender

  fake_coordinator() { sock.bind(endpoint); }

  /// The next frame whose body holds a T, within `within` (frames of other kinds are skipped).
  template <class T>
  std::optional<envelope> next(std::chrono::seconds within) {
    const auto deadline = std::chrono::steady_clock::now() + within;
    while (std::chrono::steady_clock::now() < deadline) {
      zmq::pollitem_t item{static_cast<void*>(sock), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
      std::vector<zmq::message_t> parts;
      if (!(item.revents & ZMQ_POLLIN) ||
          !zmq::recv_multipart(sock, std::back_inserter(parts), zmq::recv_flags::dontwait) ||
          parts.size() != 2)
        continue;
      node = parts[0].to_string();
      auto e = parse_envelope(parts[1].data(), parts[1].size(), cluster_id);
      if (e && std::holds_alternative<T>(e.value().body)) return e.value();
    }
    return std::nullopt;
  }

  void send(uint64_t term, decltype(envelope::body) body) {
    envelope e;
    e.cluster_id = cluster_id;
    e.term = term;
    e.body = std::move(body);
    const auto bytes = build_envelope(e);
    std::vector<zmq::message_t> parts;
    parts.emplace_back(node.data(), node.size());
    parts.emplace_back(bytes.data(), bytes.size());
    CATCH_REQUIRE(zmq::send_multipart(sock, parts).has_value());
  }
};

}  // namespace

CATCH_TEST_CASE("a node that moves to a newer coordinator's term tells the one it followed, which steps down",
                "[integration][membership][term]") {
  // Two coordinators started together both welcome a node. Before, a node that had followed the older one
  // told it nothing when the newer one's welcome came: the older led an empty cluster until its heartbeat
  // timeout removed every node as lost (a probe saw 30 s of it, and false removals in the event log).
  fake_coordinator older, newer;
  control_client a({older.endpoint, newer.endpoint}, cluster_id);
  auto joined =
      std::async(std::launch::async, [&] { return a.join(hello_of("a", 1), std::chrono::seconds(30)); });
  CATCH_REQUIRE(older.next<hello_msg>(std::chrono::seconds(20)).has_value());
  CATCH_REQUIRE(newer.next<hello_msg>(std::chrono::seconds(20)).has_value());
  welcome_msg w;
  w.world_size = 1;
  w.epoch = 1;
  w.peers = {{0, "a", "tcp://127.0.0.1:1", ""}};
  older.send(term_slots, w);  // term 256 (slot 0) welcomes first: the node follows it
  CATCH_REQUIRE(std::holds_alternative<welcome_msg>(joined.get()));
  CATCH_CHECK(a.term() == term_slots);
  newer.send(term_slots + 1, w);  // then term 257's welcome
  CATCH_REQUIRE(test::wait_until(
      [&] {
        (void)a.poll();
        return a.term() == term_slots + 1;
      },
      20));
  // The older one hears the newer term from the node at once, not after a heartbeat timeout of its own.
  const auto told = older.next<heartbeat_msg>(std::chrono::seconds(20));
  CATCH_REQUIRE(told.has_value());
  CATCH_CHECK(told->term == term_slots + 1);
}
