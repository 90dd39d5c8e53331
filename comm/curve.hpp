#pragma once
// ZeroMQ CURVE for a cluster's links (control, ring, state transfer): key pairs and their files, the key
// ring a server admits, the ZAP handler that enforces it on one ZeroMQ context, and the socket options of
// either side. A key directory (`longwave keys new`) holds cluster.{public,secret} (the coordinator's pair)
// and nodes/NAME.{public,secret} (one pair per node); a node's name is bound to its key.
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace zmq {
class context_t;
class message_t;
class socket_t;
}  // namespace zmq

namespace longwave::comm {

/// A CURVE key pair as Z85 text (40 characters each); `secret_key` is empty when only the public half is
/// known.
struct curve_key {
  std::string public_key;
  std::string secret_key;
};

/// A fresh key pair (libsodium through libzmq). Throws lw_error(io_error) if libzmq lacks CURVE.
curve_key new_curve_key();

/// What a CURVE client needs: its own key pair and the public key of the server it pins.
struct curve_peer {
  curve_key own;
  std::string server_public;
};

/// True for 40 characters of Z85 (a 32-byte key).
bool is_z85_key(std::string_view text);

/// The public half of a Z85 secret key.
std::string public_of(const std::string& secret_key);

/// Reads a key file (one Z85 line; lines starting with '#' are comments). A secret key file must not be
/// readable by group or others. Throws lw_error(invalid_config) naming the file when it is missing,
/// unreadable, too open or malformed.
std::string read_key_file(const std::string& path, bool secret);

/// Writes one key file with mode 0600 (a comment line, then the key). Throws lw_error(invalid_config)
/// naming the file when it exists (keys are never overwritten) or cannot be written.
void write_key_file(const std::string& path, const std::string& key, const std::string& comment);

/// The node keys a server admits: public key (Z85) -> node name, and the keys refused as revoked.
/// Thread-safe: the owner updates it while a ZAP handler reads it.
class key_ring {
 public:
  /// Admits `public_key` as node `name` (a key already known is renamed).
  void allow(const std::string& public_key, const std::string& name);
  /// Admits exactly these (name, public key) pairs from now on: keys not listed are no longer admitted.
  void assign(const std::vector<std::pair<std::string, std::string>>& entries);
  /// Refuses `public_key` from now on, even if allowed.
  void revoke(const std::string& public_key);
  /// The node name of an admitted key; nullopt for an unknown or revoked key.
  std::optional<std::string> name_of(const std::string& public_key) const;
  bool is_revoked(const std::string& public_key) const;
  /// The public key of node `name` ("" if none is admitted).
  std::string key_of(const std::string& name) const;
  /// True when `name` has a key in the ring, admitted or revoked.
  bool knows_name(const std::string& name) const;
  /// Every admitted (name, public key), by name.
  std::vector<std::pair<std::string, std::string>> entries() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::string> names_;  // public key -> name
  std::set<std::string> revoked_;
};

/// A refused CURVE handshake, as a server saw it.
struct handshake_refusal {
  std::string reason;      ///< "unknown_key", "revoked" (ZAP) or "handshake" (not CURVE, or another key)
  std::string address;     ///< the peer's address, e.g. "127.0.0.1"
  std::string public_key;  ///< the client's key (Z85), when the handshake got that far
  /// One line naming what was refused and why.
  std::string describe() const;
};

/// What a CURVE server needs: its key pair and the node keys it admits (on_refused: each refused
/// handshake, called from the ZAP handler's thread).
struct curve_server_keys {
  curve_key own;
  std::shared_ptr<const key_ring> admitted;
  std::function<void(const handshake_refusal&)> on_refused;
};

/// The ZAP user id of a connection made with the cluster's own key pair (cluster.secret): `longwave stop`.
/// No node name can take it (names are letters, digits, _ and -).
inline constexpr const char* operator_user_id = "@cluster";

/// Answers the ZAP requests of one ZeroMQ context on its own thread (RFC 27): a CURVE client whose public
/// key is in the ring gets in with its node name as the connection's user id ("User-Id" of its messages);
/// any other is refused and reported to on_refused (from that thread). Before refusing an unknown key it
/// calls refresh (e.g. node_key_refresh: keys added to the key directory since; it must be cheap, as any
/// stranger can make it run); when refresh returns true the key is looked up again. Must be created before
/// any CURVE server socket of the context binds, and destroyed before the context.
class zap_handler {
 public:
  /// operator_public: a key admitted besides the ring's, as user id operator_user_id (the coordinator's own
  /// public key: whoever holds cluster.secret may stop the cluster). Empty: none.
  zap_handler(zmq::context_t& ctx, std::shared_ptr<const key_ring> keys,
              std::function<void(const handshake_refusal&)> on_refused = {},
              std::function<bool()> refresh = {}, std::string operator_public = {});
  ~zap_handler();
  zap_handler(const zap_handler&) = delete;
  zap_handler& operator=(const zap_handler&) = delete;

  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  void run();
  std::vector<zmq::message_t> receive_request();
  std::string judge(const std::vector<zmq::message_t>& parts, handshake_refusal& r) const;
  void answer(const std::vector<zmq::message_t>& parts);
  std::unique_ptr<zmq::socket_t> sock_;
  std::shared_ptr<const key_ring> keys_;
  std::function<void(const handshake_refusal&)> on_refused_;
  std::function<bool()> refresh_;
  std::string operator_public_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_{0};
  std::thread thread_;
};

/// Makes sock a CURVE server with this key pair (call before bind). Its context needs a zap_handler, or
/// every client is admitted.
void make_curve_server(zmq::socket_t& sock, const curve_key& own);

/// Makes sock a CURVE client with this key pair, of a server whose public key is server_public (call
/// before connect): the connection completes only with that server.
void make_curve_client(zmq::socket_t& sock, const curve_key& own, const std::string& server_public);

/// The user id a ZAP handler gave the connection a message came on ("" without CURVE).
std::string user_id_of(const void* zmq_msg);

/// A cluster's keys as one role needs them, from a key directory.
struct cluster_keys {
  curve_key own;                    ///< the coordinator's (cluster.*) or this node's (nodes/NAME.*) pair
  std::string coordinator_public;   ///< cluster.public (what nodes pin)
  std::shared_ptr<key_ring> nodes;  ///< coordinator: every nodes/*.public, less the revoked
};

/// The coordinator's keys: cluster.secret (0600), and every nodes/NAME.public as node NAME; `revoked` lists
/// node names or Z85 public keys that are refused. Throws lw_error(invalid_config) naming the file or entry.
cluster_keys load_coordinator_keys(const std::string& dir, const std::vector<std::string>& revoked);

/// Admits the nodes/NAME.public files of key directory `dir` whose node name the ring does not know yet
/// (keys made after the coordinator started; a revoked key stays refused, and a node's key is not replaced).
/// Returns how many were admitted; files that cannot be read are skipped (all_read then says false).
size_t admit_new_node_keys(const std::string& dir, key_ring& ring, bool* all_read = nullptr);

/// A zap_handler refresh for a coordinator: admit_new_node_keys(dir, *ring) when dir/nodes changed since its
/// last complete read (one stat otherwise), calling on_added with how many it admitted.
std::function<bool()> node_key_refresh(std::string dir, std::shared_ptr<key_ring> ring,
                                       std::function<void(size_t)> on_added);

/// A node's keys: cluster.public and nodes/NAME.secret (0600). Throws lw_error(invalid_config) naming the
/// file.
cluster_keys load_node_keys(const std::string& dir, const std::string& name);

/// `longwave keys new`: writes cluster.{public,secret} (unless dir already has the pair) and
/// nodes/NAME.{public,secret} for each name, every file 0600; refuses to overwrite a node's key. Returns
/// the files written. Throws lw_error(invalid_config) naming the file.
std::vector<std::string> make_key_directory(const std::string& dir, const std::vector<std::string>& names);

}  // namespace longwave::comm
