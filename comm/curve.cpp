// ZeroMQ CURVE keys, key files and the ZAP handler (see curve.hpp).
#include "comm/curve.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <zmq.hpp>

#include "runtime/errors/errors.hpp"

namespace longwave::comm {

namespace fs = std::filesystem;

namespace {

constexpr const char* zap_endpoint = "inproc://zeromq.zap.01";

lw_error config_problem(const std::string& what) {
  return lw_error(errc::invalid_config, what);
}

std::string z85_of(const uint8_t* bytes32) {
  char out[41] = {};
  zmq_z85_encode(out, bytes32, 32);
  return std::string(out, 40);
}

}  // namespace

curve_key new_curve_key() {
  char pub[41] = {}, sec[41] = {};
  if (zmq_curve_keypair(pub, sec) != 0)
    throw lw_error(errc::io_error,
                   fmt::format("cannot make a CURVE key pair: {} (is libzmq built with libsodium?)",
                               zmq_strerror(zmq_errno())));
  return {std::string(pub, 40), std::string(sec, 40)};
}

bool is_z85_key(std::string_view text) {
  if (text.size() != 40) return false;
  static constexpr std::string_view alphabet =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  if (!std::all_of(text.begin(), text.end(),
                   [](char c) { return alphabet.find(c) != std::string_view::npos; }))
    return false;
  uint8_t bytes[32];
  const std::string s(text);
  return zmq_z85_decode(bytes, s.c_str()) != nullptr;
}

std::string public_of(const std::string& secret_key) {
  char pub[41] = {};
  if (zmq_curve_public(pub, secret_key.c_str()) != 0)
    throw config_problem("cannot derive a CURVE public key from the secret key: " +
                         std::string(zmq_strerror(zmq_errno())));
  return std::string(pub, 40);
}

std::string read_key_file(const std::string& path, bool secret) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw config_problem(fmt::format("{}: {} ({} key file; `longwave keys new` makes them)", path,
                                     std::strerror(errno), secret ? "secret" : "public"));
  if (!S_ISREG(st.st_mode)) throw config_problem(path + ": not a regular file");
  if (secret && (st.st_mode & 077) != 0)
    throw config_problem(fmt::format(
        "{}: permissions {:04o} let other users read this secret key; make it private (chmod 600 {})", path,
        st.st_mode & 07777, path));
  std::ifstream in(path);
  if (!in) throw config_problem(fmt::format("{}: cannot be read: {}", path, std::strerror(errno)));
  std::string line, key;
  int lines = 0;
  while (std::getline(in, line) && ++lines < 64) {
    const auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    const auto e = line.find_last_not_of(" \t\r");
    if (!key.empty()) throw config_problem(path + ": more than one key line");
    key = line.substr(b, e - b + 1);
  }
  if (!is_z85_key(key))
    throw config_problem(fmt::format("{}: not a CURVE key (expected one line of 40 Z85 characters)", path));
  return key;
}

void write_key_file(const std::string& path, const std::string& key, const std::string& comment) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST)
      throw config_problem(path + ": exists; keys are never overwritten (delete it first to replace it)");
    throw config_problem(fmt::format("{}: cannot be written: {}", path, std::strerror(errno)));
  }
  const std::string text = "# " + comment + "\n" + key + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fchmod(fd, 0600) == 0 && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    throw config_problem(fmt::format("{}: cannot be written: {}", path, std::strerror(err)));
  }
}

// ---- key_ring ----

void key_ring::allow(const std::string& public_key, const std::string& name) {
  std::lock_guard<std::mutex> lk(mu_);
  names_[public_key] = name;
}

void key_ring::assign(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::lock_guard<std::mutex> lk(mu_);
  names_.clear();
  for (const auto& [name, key] : entries) names_[key] = name;
}

void key_ring::revoke(const std::string& public_key) {
  std::lock_guard<std::mutex> lk(mu_);
  revoked_.insert(public_key);
}

std::optional<std::string> key_ring::name_of(const std::string& public_key) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (revoked_.count(public_key)) return std::nullopt;
  const auto it = names_.find(public_key);
  if (it == names_.end()) return std::nullopt;
  return it->second;
}

bool key_ring::is_revoked(const std::string& public_key) const {
  std::lock_guard<std::mutex> lk(mu_);
  return revoked_.count(public_key) > 0;
}

std::string key_ring::key_of(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [key, n] : names_)
    if (n == name && !revoked_.count(key)) return key;
  return "";
}

bool key_ring::knows_name(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [key, n] : names_)
    if (n == name) return true;
  return false;
}

std::vector<std::pair<std::string, std::string>> key_ring::entries() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [key, name] : names_)
    if (!revoked_.count(key)) out.emplace_back(name, key);
  std::sort(out.begin(), out.end());
  return out;
}

// ---- ZAP ----

std::string handshake_refusal::describe() const {
  const std::string from = address.empty() ? "a peer" : address;
  if (reason == "revoked") return fmt::format("refused {}: its CURVE key {} is revoked", from, public_key);
  if (reason == "unknown_key")
    return fmt::format("refused {}: its CURVE key {} is not one of this cluster's node keys", from,
                       public_key);
  return fmt::format(
      "refused {}: its CURVE handshake failed (a peer without this cluster's keys: no CURVE, or it pinned "
      "another cluster's key)",
      from);
}

zap_handler::zap_handler(zmq::context_t& ctx, std::shared_ptr<const key_ring> keys,
                         std::function<void(const handshake_refusal&)> on_refused,
                         std::function<bool()> refresh, std::string operator_public)
    : keys_(std::move(keys)),
      on_refused_(std::move(on_refused)),
      refresh_(std::move(refresh)),
      operator_public_(std::move(operator_public)) {
  sock_ = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::rep);
  sock_->set(zmq::sockopt::linger, 0);
  try {
    sock_->bind(zap_endpoint);
  } catch (const zmq::error_t& e) {
    throw lw_error(errc::io_error, fmt::format("cannot start the ZAP handler: {}", e.what()));
  }
  thread_ = std::thread([this] { run(); });
}

zap_handler::~zap_handler() {
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
  sock_.reset();
}

void zap_handler::run() {
  while (!stop_.load(std::memory_order_acquire)) {
    zmq::pollitem_t item{sock_->handle(), 0, ZMQ_POLLIN, 0};
    try {
      if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) <= 0) continue;
    } catch (const zmq::error_t&) {
      continue;  // EINTR
    }
    auto parts = receive_request();
    if (!parts.empty()) answer(parts);
  }
}

std::vector<zmq::message_t> zap_handler::receive_request() {
  std::vector<zmq::message_t> parts;
  for (;;) {
    zmq::message_t m;
    if (!sock_->recv(m, zmq::recv_flags::dontwait)) break;
    const bool more = m.more();
    parts.push_back(std::move(m));
    if (!more) break;
  }
  return parts;
}

/// The user id a request's key speaks as, or (empty) the refusal's reason in r.
std::string zap_handler::judge(const std::vector<zmq::message_t>& parts, handshake_refusal& r) const {
  const auto text = [&](size_t i) { return i < parts.size() ? parts[i].to_string() : std::string(); };
  if (parts.size() < 7 || text(0) != "1.0" || text(5) != "CURVE" || parts[6].size() != 32) {
    r.reason = "handshake";
    return "";
  }
  r.public_key = z85_of(static_cast<const uint8_t*>(parts[6].data()));
  if (keys_->is_revoked(r.public_key)) {
    r.reason = "revoked";
    return "";
  }
  if (!operator_public_.empty() && r.public_key == operator_public_) return operator_user_id;
  if (auto name = keys_->name_of(r.public_key)) return *name;
  // A key not in the ring: let refresh add keys (it decides whether anything is worth reading), then look
  // again.
  if (refresh_ && refresh_())
    if (auto added = keys_->name_of(r.public_key)) return *added;
  r.reason = "unknown_key";
  return "";
}

/// Answers one request: [version, request id, domain, address, identity, mechanism, credentials...].
void zap_handler::answer(const std::vector<zmq::message_t>& parts) {
  handshake_refusal r;
  r.address = parts.size() > 3 ? parts[3].to_string() : std::string();
  const std::string user = judge(parts, r);
  const bool ok = r.reason.empty();
  const std::string id = parts.size() > 1 ? parts[1].to_string() : std::string();
  std::array<std::string, 6> reply = {"1.0", id, ok ? "200" : "400", ok ? "OK" : r.reason, user, ""};
  for (size_t i = 0; i < reply.size(); ++i)
    sock_->send(zmq::buffer(reply[i]),
                i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  if (!ok) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    if (on_refused_) on_refused_(r);
  }
}

void make_curve_server(zmq::socket_t& sock, const curve_key& own) {
  sock.set(zmq::sockopt::curve_server, true);
  sock.set(zmq::sockopt::curve_secretkey, own.secret_key);
  // Handshakes go through the context's ZAP handler; ZMQ_ZAP_ENFORCE_DOMAIN makes a context without one
  // refuse every client instead of admitting it (libzmq 4.3's default). Its name is only in zmq.h's draft
  // section; a libzmq that rejects it leaves the callers' order (handler before bind) as the only guard, as
  // the log says.
  sock.set(zmq::sockopt::zap_domain, "longwave");
  constexpr int zap_enforce_domain = 93;  // ZMQ_ZAP_ENFORCE_DOMAIN in zmq.h's draft section
  const int one = 1;
  if (zmq_setsockopt(sock.handle(), zap_enforce_domain, &one, sizeof one) != 0) {
    static std::once_flag warned;
    std::call_once(warned, [] {
      fprintf(stderr,
              "longwave: this libzmq lacks ZMQ_ZAP_ENFORCE_DOMAIN: a CURVE server relies on its ZAP "
              "handler being bound first\n");
    });
  }
}

void make_curve_client(zmq::socket_t& sock, const curve_key& own, const std::string& server_public) {
  sock.set(zmq::sockopt::curve_serverkey, server_public);
  sock.set(zmq::sockopt::curve_publickey, own.public_key);
  sock.set(zmq::sockopt::curve_secretkey, own.secret_key);
}

std::string user_id_of(const void* zmq_msg) {
  const char* v = zmq_msg_gets(const_cast<zmq_msg_t*>(static_cast<const zmq_msg_t*>(zmq_msg)), "User-Id");
  return v ? std::string(v) : std::string();
}

// ---- key directories ----

namespace {

std::string join_path(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

/// A pair from NAME.secret (checked against NAME.public when that exists).
curve_key read_pair(const std::string& dir, const std::string& stem) {
  curve_key k;
  k.secret_key = read_key_file(join_path(dir, stem + ".secret"), true);
  k.public_key = public_of(k.secret_key);
  const auto pub_path = join_path(dir, stem + ".public");
  if (fs::exists(pub_path) && read_key_file(pub_path, false) != k.public_key)
    throw config_problem(
        fmt::format("{}: not the public half of {}.secret (the two files are of different "
                    "pairs)",
                    pub_path, stem));
  return k;
}

}  // namespace

cluster_keys load_coordinator_keys(const std::string& dir, const std::vector<std::string>& revoked) {
  cluster_keys out;
  out.own = read_pair(dir, "cluster");
  out.coordinator_public = out.own.public_key;
  out.nodes = std::make_shared<key_ring>();
  const auto nodes_dir = join_path(dir, "nodes");
  std::error_code ec;
  if (!fs::is_directory(nodes_dir, ec))
    throw config_problem(nodes_dir +
                         ": no such directory (the node public keys; `longwave keys new` makes it)");
  std::vector<std::pair<std::string, std::string>> found;  // name, key
  for (const auto& e : fs::directory_iterator(nodes_dir, ec)) {
    if (e.path().extension() != ".public") continue;
    found.emplace_back(e.path().stem().string(), read_key_file(e.path().string(), false));
  }
  if (ec) throw config_problem(fmt::format("{}: cannot be listed: {}", nodes_dir, ec.message()));
  if (found.empty()) throw config_problem(nodes_dir + ": no NAME.public files: no node could join");
  for (const auto& [name, key] : found) out.nodes->allow(key, name);
  for (const auto& r : revoked) {
    if (is_z85_key(r)) {
      out.nodes->revoke(r);
      continue;
    }
    const auto key = out.nodes->key_of(r);
    if (key.empty())
      throw config_problem(fmt::format(
          "security.revoked: '{}' is neither a node with a key in {} nor a 40-character Z85 public key", r,
          nodes_dir));
    out.nodes->revoke(key);
  }
  // As for no key at all (a probe's coordinator waited out its join deadline, then exited 1).
  if (out.nodes->entries().empty())
    throw config_problem(
        fmt::format("every node key in {} is revoked (security.revoked): no node could join", nodes_dir));
  return out;
}

size_t admit_new_node_keys(const std::string& dir, key_ring& ring, bool* all_read) {
  std::error_code ec;
  size_t added = 0;
  if (all_read) *all_read = true;
  for (const auto& e : fs::directory_iterator(join_path(dir, "nodes"), ec)) {
    if (e.path().extension() != ".public") continue;
    const std::string name = e.path().stem().string();
    if (ring.knows_name(name)) continue;  // admitted already, or revoked: a new key file does not undo that
    try {
      const auto key = read_key_file(e.path().string(), false);
      if (ring.is_revoked(key) || ring.name_of(key)) continue;
      ring.allow(key, name);
      ++added;
    } catch (const lw_error&) {
      if (all_read) *all_read = false;  // being written, or malformed: the next refresh reads it again
    }
  }
  if (ec && all_read) *all_read = false;
  return added;
}

std::function<bool()> node_key_refresh(std::string dir, std::shared_ptr<key_ring> ring,
                                       std::function<void(size_t)> on_added) {
  auto read_at = std::make_shared<std::optional<fs::file_time_type>>();
  return [dir = std::move(dir), ring = std::move(ring), on_added = std::move(on_added), read_at] {
    std::error_code ec;
    const auto changed = fs::last_write_time(join_path(dir, "nodes"), ec);
    if (ec || (*read_at && **read_at == changed)) return false;  // a new file changes the folder's time
    bool all_read = true;
    const size_t added = admit_new_node_keys(dir, *ring, &all_read);
    if (all_read) *read_at = changed;
    if (added > 0 && on_added) on_added(added);
    return added > 0;
  };
}

cluster_keys load_node_keys(const std::string& dir, const std::string& name) {
  cluster_keys out;
  out.coordinator_public = read_key_file(join_path(dir, "cluster.public"), false);
  out.own = read_pair(join_path(dir, "nodes"), name);
  return out;
}

std::vector<std::string> make_key_directory(const std::string& dir, const std::vector<std::string>& names) {
  std::vector<std::string> written;
  std::error_code ec;
  const bool fresh = !fs::exists(dir);
  fs::create_directories(join_path(dir, "nodes"), ec);
  if (ec)
    throw config_problem(fmt::format("{}: cannot be created: {}", join_path(dir, "nodes"), ec.message()));
  if (fresh) ::chmod(dir.c_str(), 0700);  // never an existing directory's mode (--out ~)
  // Check everything first: nothing is written when one file would be overwritten.
  const auto cluster_pub = join_path(dir, "cluster.public"), cluster_sec = join_path(dir, "cluster.secret");
  const bool have_cluster = fs::exists(cluster_sec) || fs::exists(cluster_pub);
  std::optional<curve_key> cluster;  // an existing pair must be valid; a lost public half is made again
  if (have_cluster) cluster = read_pair(dir, "cluster");
  for (const auto& n : names)
    for (const char* ext : {".public", ".secret"}) {
      const auto p = join_path(join_path(dir, "nodes"), n + ext);
      if (fs::exists(p))
        throw config_problem(p + ": exists; keys are never overwritten (delete it first to replace it)");
    }
  if (cluster && !fs::exists(cluster_pub)) {
    write_key_file(cluster_pub, cluster->public_key, "longwave cluster public key: every node pins it");
    written.push_back(cluster_pub);
  }
  if (!have_cluster) {
    const auto k = new_curve_key();
    write_key_file(cluster_sec, k.secret_key,
                   "longwave cluster secret key: the coordinator's; keep it private");
    write_key_file(cluster_pub, k.public_key, "longwave cluster public key: every node pins it");
    written.push_back(cluster_sec);
    written.push_back(cluster_pub);
  }
  for (const auto& n : names) {
    const auto k = new_curve_key();
    const auto base = join_path(join_path(dir, "nodes"), n);
    write_key_file(base + ".secret", k.secret_key,
                   "longwave secret key of node " + n + ": only node " + n + " needs it");
    write_key_file(base + ".public", k.public_key,
                   "longwave public key of node " + n + ": the coordinator admits it");
    written.push_back(base + ".secret");
    written.push_back(base + ".public");
  }
  return written;
}

}  // namespace longwave::comm
