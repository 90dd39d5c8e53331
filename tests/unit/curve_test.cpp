// CURVE keys (comm/curve.hpp): key files and their permissions, key directories that are never overwritten,
// the key ring's revocation, and the ZAP handler admitting exactly the ring's keys over real sockets.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>
#include <zmq.hpp>

#include "comm/curve.hpp"
#include "runtime/errors/errors.hpp"
#include "tests/support/errors.hpp"
#include "tests/support/process.hpp"

using namespace longwave;
using namespace longwave::comm;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

/// The message of the invalid_config error fn throws (the check fails when it throws another or none).
template <class Fn>
std::string refusal_of(Fn fn) {
  std::string message;
  CATCH_CHECK(test::error_of(fn, &message) == errc::invalid_config);
  return message;
}

}  // namespace

CATCH_TEST_CASE(
    "key files: 0600, one Z85 line, never overwritten, and a secret readable by others is refused",
    "[unit][curve]") {
  const auto dir = test::scratch_dir("curve_files");
  const auto k = new_curve_key();
  CATCH_CHECK(is_z85_key(k.public_key));
  CATCH_CHECK(is_z85_key(k.secret_key));
  CATCH_CHECK(public_of(k.secret_key) == k.public_key);
  CATCH_CHECK_FALSE(is_z85_key("short"));
  CATCH_CHECK_FALSE(is_z85_key(std::string(40, ' ')));

  const auto path = dir + "/a.secret";
  write_key_file(path, k.secret_key, "a test key");
  struct stat st {};
  CATCH_REQUIRE(::stat(path.c_str(), &st) == 0);
  CATCH_CHECK((st.st_mode & 0777) == 0600);
  CATCH_CHECK(read_key_file(path, true) == k.secret_key);
  CATCH_CHECK_THAT(refusal_of([&] { write_key_file(path, k.secret_key, "again"); }),
                   Contains("never overwritten"));
  CATCH_CHECK(read_key_file(path, true) == k.secret_key);  // untouched

  ::chmod(path.c_str(), 0644);
  const auto open = refusal_of([&] { read_key_file(path, true); });
  CATCH_CHECK_THAT(open, Contains(path));
  CATCH_CHECK_THAT(open, Contains("0644"));
  CATCH_CHECK(read_key_file(path, false) == k.secret_key);  // a public key file may be readable
  CATCH_CHECK_THAT(refusal_of([&] { read_key_file(dir + "/missing.public", false); }),
                   Contains(dir + "/missing.public"));
  std::ofstream(dir + "/bad.public") << "# comment\nnot a key\n";
  CATCH_CHECK_THAT(refusal_of([&] { read_key_file(dir + "/bad.public", false); }),
                   Contains("not a CURVE key"));
  std::ofstream(dir + "/two.public") << k.public_key << "\n" << k.public_key << "\n";
  CATCH_CHECK_THAT(refusal_of([&] { read_key_file(dir + "/two.public", false); }), Contains("more than one"));
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a key directory: the coordinator's and each node's keys, revoked names, mismatched pairs",
                "[unit][curve]") {
  const auto dir = test::scratch_dir("curve_dir") + "/keys";
  const auto written = make_key_directory(dir, {"a", "b"});
  CATCH_CHECK(written.size() == 6);
  // A second call adds nodes, keeps the cluster pair, and refuses to replace a node's key (nothing written).
  const auto cluster_public = read_key_file(dir + "/cluster.public", false);
  CATCH_CHECK(make_key_directory(dir, {"c"}).size() == 2);
  CATCH_CHECK(read_key_file(dir + "/cluster.public", false) == cluster_public);
  CATCH_CHECK_THAT(refusal_of([&] { make_key_directory(dir, {"d", "b"}); }), Contains("b.public"));
  CATCH_CHECK_FALSE(fs::exists(dir + "/nodes/d.secret"));

  const auto coord = load_coordinator_keys(dir, {"b"});
  CATCH_CHECK(coord.own.public_key == cluster_public);
  const auto a = load_node_keys(dir, "a");
  const auto b = load_node_keys(dir, "b");
  CATCH_CHECK(a.coordinator_public == cluster_public);
  CATCH_CHECK(coord.nodes->name_of(a.own.public_key) == std::optional<std::string>("a"));
  CATCH_CHECK_FALSE(coord.nodes->name_of(b.own.public_key).has_value());  // revoked by name
  CATCH_CHECK(coord.nodes->is_revoked(b.own.public_key));
  CATCH_CHECK(coord.nodes->entries().size() == 2);  // a and c
  // assign: exactly the listed keys from now on (a node's view of the coordinator's list).
  key_ring view;
  view.allow(b.own.public_key, "b");
  view.assign({{"a", a.own.public_key}});
  CATCH_CHECK(view.name_of(a.own.public_key) == std::optional<std::string>("a"));
  CATCH_CHECK_FALSE(view.name_of(b.own.public_key).has_value());
  // Revoked by key, and an entry that is neither a node nor a key.
  CATCH_CHECK(load_coordinator_keys(dir, {a.own.public_key}).nodes->is_revoked(a.own.public_key));
  CATCH_CHECK_THAT(refusal_of([&] { load_coordinator_keys(dir, {"zz"}); }),
                   Contains("security.revoked: 'zz'"));
  CATCH_CHECK_THAT(refusal_of([&] {
                     load_coordinator_keys(dir, {"a", "b", "c"});
                   }),
                   Contains("nodes is revoked (security.revoked): no node could join"));
  CATCH_CHECK_THAT(refusal_of([&] { load_node_keys(dir, "zz"); }), Contains("nodes/zz.secret"));
  // A public file of another pair beside a secret: said, not used.
  fs::copy_file(dir + "/nodes/b.public", dir + "/nodes/a.public", fs::copy_options::overwrite_existing);
  CATCH_CHECK_THAT(refusal_of([&] { load_node_keys(dir, "a"); }), Contains("not the public half"));
  fs::remove_all(fs::path(dir).parent_path());
}

CATCH_TEST_CASE("the ZAP handler admits the ring's keys only, and names each refused one", "[unit][curve]") {
  zmq::context_t ctx;
  const auto server_key = new_curve_key(), good = new_curve_key(), stranger = new_curve_key(),
             revoked = new_curve_key();
  auto ring = std::make_shared<key_ring>();
  ring->allow(good.public_key, "n0");
  ring->allow(revoked.public_key, "n1");
  ring->revoke(revoked.public_key);
  std::mutex mu;
  std::vector<handshake_refusal> refused;
  zap_handler zap(ctx, ring, [&](const handshake_refusal& r) {
    std::lock_guard<std::mutex> lk(mu);
    refused.push_back(r);
  });
  zmq::socket_t server(ctx, zmq::socket_type::pull);
  server.set(zmq::sockopt::linger, 0);
  make_curve_server(server, server_key);
  server.bind("tcp://127.0.0.1:*");
  const std::string endpoint = server.get(zmq::sockopt::last_endpoint);

  // Each client sends one message; only the admitted one's arrives, carrying its node name.
  zmq::context_t client_ctx;
  std::vector<zmq::socket_t> clients;
  for (const auto* k : {&stranger, &revoked, &good}) {
    clients.emplace_back(client_ctx, zmq::socket_type::push);
    clients.back().set(zmq::sockopt::linger, 0);
    make_curve_client(clients.back(), *k, server_key.public_key);
    clients.back().connect(endpoint);
    (void)clients.back().send(zmq::str_buffer("hello"), zmq::send_flags::dontwait);
  }
  server.set(zmq::sockopt::rcvtimeo, 5000);
  zmq::message_t m;
  CATCH_REQUIRE(server.recv(m));
  CATCH_CHECK(m.to_string() == "hello");
  CATCH_CHECK(user_id_of(m.handle()) == "n0");
  server.set(zmq::sockopt::rcvtimeo, 500);
  CATCH_CHECK_FALSE(server.recv(m));  // no second message: the others never got in
  CATCH_REQUIRE(test::wait_until(
      [&] {
        std::lock_guard<std::mutex> lk(mu);
        return refused.size() >= 2;
      },
      10));
  std::lock_guard<std::mutex> lk(mu);
  std::set<std::string> reasons;
  for (const auto& r : refused) reasons.insert(r.reason);
  CATCH_CHECK(reasons == std::set<std::string>{"unknown_key", "revoked"});
  CATCH_CHECK(zap.refused() >= 2);
  for (const auto& r : refused) CATCH_CHECK_THAT(r.describe(), Contains("refused 127.0.0.1"));
}

CATCH_TEST_CASE("a CURVE server whose context has no ZAP handler admits no one", "[unit][curve]") {
  // libzmq 4.3 admits every key when no handler is bound; make_curve_server enforces the ZAP domain instead.
  zmq::context_t ctx;
  const auto server_key = new_curve_key(), client_key = new_curve_key();
  zmq::socket_t server(ctx, zmq::socket_type::pull);
  server.set(zmq::sockopt::linger, 0);
  make_curve_server(server, server_key);
  server.bind("tcp://127.0.0.1:*");
  zmq::context_t client_ctx;
  zmq::socket_t client(client_ctx, zmq::socket_type::push);
  client.set(zmq::sockopt::linger, 0);
  make_curve_client(client, client_key, server_key.public_key);
  client.connect(server.get(zmq::sockopt::last_endpoint));
  (void)client.send(zmq::str_buffer("hello"), zmq::send_flags::dontwait);
  server.set(zmq::sockopt::rcvtimeo, 1500);
  zmq::message_t m;
  CATCH_CHECK_FALSE(server.recv(m));
}

CATCH_TEST_CASE("keys added to the key directory after the start are admitted when they first knock",
                "[unit][curve]") {
  const auto dir = test::scratch_dir("curve_late") + "/keys";
  make_key_directory(dir, {"a", "gone"});
  const auto coord = load_coordinator_keys(dir, {"gone"});
  std::atomic<size_t> added{0};
  zmq::context_t ctx;
  zap_handler zap(ctx, coord.nodes, {}, node_key_refresh(dir, coord.nodes, [&](size_t n) { added += n; }));
  zmq::socket_t server(ctx, zmq::socket_type::pull);
  server.set(zmq::sockopt::linger, 0);
  make_curve_server(server, coord.own);
  server.bind("tcp://127.0.0.1:*");
  const std::string endpoint = server.get(zmq::sockopt::last_endpoint);
  // One client at a time; the node name its message arrives with, or "(refused)".
  zmq::context_t client_ctx;
  auto knock = [&](const curve_key& k) {
    zmq::socket_t c(client_ctx, zmq::socket_type::push);
    c.set(zmq::sockopt::linger, 0);
    make_curve_client(c, k, coord.own.public_key);
    c.connect(endpoint);
    (void)c.send(zmq::str_buffer("hello"), zmq::send_flags::dontwait);
    server.set(zmq::sockopt::rcvtimeo, 1500);
    zmq::message_t m;
    return server.recv(m) ? user_id_of(m.handle()) : std::string("(refused)");
  };
  CATCH_CHECK(knock(new_curve_key()) == "(refused)");  // a stranger: the directory is read, nothing is new
  // The revoked node made itself a new key: its name stays refused.
  fs::remove(dir + "/nodes/gone.public");
  fs::remove(dir + "/nodes/gone.secret");
  make_key_directory(dir, {"gone", "late"});  // and a node keyed after the coordinator started
  CATCH_CHECK(knock(load_node_keys(dir, "gone").own) == "(refused)");
  CATCH_CHECK(knock(load_node_keys(dir, "late").own) == "late");
  CATCH_CHECK(added.load() == 1);
  CATCH_CHECK(coord.nodes->key_of("late") == load_node_keys(dir, "late").own.public_key);
  CATCH_CHECK(coord.nodes->key_of("gone").empty());
  fs::remove_all(fs::path(dir).parent_path());
}
