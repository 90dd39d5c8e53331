#pragma once
// The control plane's messages (cluster/control.capnp), one Envelope frame each, as plain structs, and
// building and validating those frames: every received envelope passes these checks before its fields are
// used.
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "comm/frame.hpp"
#include "runtime/messages/merge_order.hpp"

namespace longwave::cluster {

using comm::frame_result;
using comm::reduce_key;
using comm::rejection;
using comm::wire_dtype;

/// Largest Envelope frame accepted.
inline constexpr size_t max_envelope_bytes = 256 * 1024;

/// A node asks to join (or, running, re-announces itself to a restarted coordinator).
struct hello_msg {
  uint16_t protocol_version = 0;
  uint64_t cluster_id = 0;
  std::string node_name;
  uint32_t n_workers = 0;
  std::string data_endpoint;
  uint64_t resume_round = 0;   ///< completed rounds of the node's newest checkpoint (0: none)
  bool running = false;        ///< a training node re-announcing itself: the fields below are set
  uint64_t epoch = 0;          ///< its epoch
  uint32_t world_size = 0;     ///< that epoch's member count
  reduce_key committed;        ///< the last all-reduce it applied
  uint64_t config_hash = 0;    ///< the node's training fingerprint (config::training_fingerprint)
  std::string state_endpoint;  ///< where the node serves its training state to joiners ("": nowhere)
  uint64_t data_fingerprint =
      0;  ///< its training data's fingerprint (models::data::data_fingerprint; 0: none)
  /// The completed rounds of every checkpoint it holds, oldest first (at most max_checkpoint_rounds, the
  /// newest): a cluster resumes after the newest round they all hold.
  std::vector<uint64_t> checkpoint_rounds;
  /// Which training history each of those checkpoints holds (runtime::held_round::history: its theta's
  /// CRC-32C), in the same order (empty: not known: an older node, eager or async).
  std::vector<uint32_t> checkpoint_thetas;
  /// The settings config_hash covers (config::training_settings): a coordinator that turns the node away for
  /// them names the keys that differ. "" from an older node.
  std::string training_settings;
  /// diloco.outer = "async", running: the merges it was told of and has not applied, oldest first (at most
  /// max_held_merges). A coordinator taking the cluster over announces them again rather than close others.
  std::vector<runtime::merge_order> merging;
  uint64_t newest_told = 0;  ///< async, running: the newest merge it was told of (0: none)
  /// Its first worker's global rank by its own cluster file, which places its data (-1: not sent). A listed
  /// node whose file orders the nodes otherwise than the coordinator's is turned away.
  int64_t worker_offset = -1;
};
/// One ring member in a welcome_msg.
struct peer_entry {
  uint32_t rank = 0;
  std::string name;
  std::string endpoint;
  std::string public_key;  ///< CURVE public key (Z85); "" without CURVE
};
/// The answer to hello: the receiver's rank and every member's data endpoint.
struct welcome_msg {
  uint32_t rank = 0;
  uint32_t world_size = 0;
  std::vector<peer_entry> peers;
  uint64_t start_round = 0;  ///< the round every node resumes from (the oldest of the nodes' resume rounds)
  uint64_t epoch = 0;        ///< the membership epoch the ring starts in
  std::vector<peer_entry> keys;  ///< CURVE: every node key the cluster admits (name, public_key)
};
/// Membership is changing to `epoch`: abandon the all-reduce in flight and report (fence_ack_msg).
struct fence_msg {
  uint64_t epoch = 0;
};
/// A node's answer to a fence, once its ring is idle: what its ring holds.
using fence_ack_msg = comm::fence_state;
/// The members of an epoch in ring order, the receiver's rank, and which interrupted all-reduce is kept.
struct membership_msg {
  uint64_t epoch = 0;
  uint32_t rank = 0;
  std::vector<peer_entry> peers;  ///< indexed by rank
  std::vector<uint32_t> workers;  ///< each member's worker count, indexed by rank
  reduce_key commit;              ///< nodes holding this all-reduce's result keep it; others redo theirs
  std::vector<peer_entry> keys;   ///< CURVE: every node key the cluster admits (name, public_key)
};
/// Node `node` is asked to leave the cluster at its next round boundary.
struct leave_msg {
  std::string node;
};
/// Stopping the whole cluster at one round boundary (`longwave stop`): requester -> coordinator and
/// coordinator -> member with round 0 (stop, or: where can you stop?), member -> coordinator with the round
/// after which it holds, coordinator -> member with the round after which every member stops.
struct stop_msg {
  uint64_t round = 0;
  bool answer = false;  ///< a member's answer, never a request (control.capnp)
};
/// Holding the members at one round boundary while a joiner fetches that round's state: coordinator ->
/// member with round 0 (where can you hold?), round R (hold after R) or release (go on); member ->
/// coordinator with the round after which it holds.
struct pin_msg {
  uint64_t round = 0;
  bool release = false;
};
/// theta_global after round `round` has CRC-32C `theta_crc` (node -> coordinator, once per round).
struct committed_msg {
  uint64_t round = 0;
  uint32_t theta_crc = 0;
};
/// A node's ring failed in `epoch` (e.g. the next rank's connection dropped).
struct ring_failed_msg {
  uint64_t epoch = 0;
  std::string suspect;  ///< the node the ring lost, if known
  std::string reason;
};
/// The coordinator lets a node join the running cluster: fetch the state from `sources` (each member's state
/// server), then send join_ready_msg. Sent again (with a note) when the state fetched was stale.
struct recover_msg {
  uint64_t epoch = 0;
  std::vector<peer_entry> sources;
  std::string note;
  uint64_t round = 0;          ///< the round the members last reported completing
  uint64_t worker_offset = 0;  ///< the global rank of the joiner's first worker
  uint32_t theta_crc = 0;      ///< theta's CRC-32C after `round` as the members reported it (0: not known)
};
/// A joiner holds the state after all-reduce `key` (completed round `round`) and asks to be admitted.
struct join_ready_msg {
  reduce_key key;
  uint64_t round = 0;
};
struct round_start_msg {
  uint64_t round = 0;
  uint32_t fragment = 0;
  uint64_t n_elements = 0;
  wire_dtype dtype = wire_dtype::fp32;
};
struct heartbeat_msg {
  uint64_t round = 0;
  uint64_t unix_millis = 0;
  uint64_t epoch = 0;
  bool starting = false;  // sent before the node's main loop runs: it is alive, not yet training
};
struct done_msg {
  uint64_t round = 0;
  uint32_t fragment = 0;
};
struct error_msg {
  uint16_t code = 0;  ///< a longwave::errc value
  std::string message;
};
struct bye_msg {
  std::string reason;
};

/// A node's pseudo-gradient is ready to merge (diloco.outer = "async"): it trained `tokens` tokens from
/// version `v_start` (node -> coordinator).
struct contribute_msg {
  uint64_t v_start = 0;
  uint64_t tokens = 0;
  /// The node process's count of its contributions, from 1, the same when one is sent again (a welcome
  /// after a takeover or a dropped link): the master takes each once. 0: not known (an older node).
  uint64_t seq = 0;
};
/// comm.backend = "nccl": the unique id (hex of ncclUniqueId's bytes) of epoch `epoch`'s communicator, made
/// by its rank 0 (node -> coordinator) and handed to the epoch's other members (coordinator -> node).
struct nccl_id_msg {
  uint64_t epoch = 0;
  std::string id;
};
/// A standby coordinator that would listen at `address` stands by (standby -> leader, repeated): the leader
/// says bye to it when the cluster ends.
struct standby_msg {
  std::string address;
};
/// A merge or drops (coordinator -> members): runtime/messages/merge_order.hpp, which training takes as is.
using merge_entry = runtime::merge_entry;
using merge_msg = runtime::merge_order;

/// A control message: who sent it and which of the union members it carries.
struct envelope {
  uint64_t cluster_id = 0;
  uint32_t sender = 0xffffffffu;  ///< rank, or 0xffffffff before the sender has one
  std::variant<hello_msg, welcome_msg, round_start_msg, heartbeat_msg, done_msg, error_msg, bye_msg,
               fence_msg, fence_ack_msg, membership_msg, ring_failed_msg, leave_msg, recover_msg,
               join_ready_msg, stop_msg, committed_msg, pin_msg, contribute_msg, merge_msg, nccl_id_msg,
               standby_msg>
      body;
  /// The sending coordinator's term, or the newest term a node follows (0: none yet): one coordinator leads.
  uint64_t term = 0;
};

/// Limits parse_envelope enforces on text and lists.
inline constexpr size_t max_name_bytes = 256;
inline constexpr size_t max_endpoint_bytes = 1024;
inline constexpr size_t max_message_bytes = 4096;
inline constexpr size_t max_peers = 4096;
inline constexpr size_t max_checkpoint_rounds = 64;
inline constexpr size_t max_held_merges = 8;      ///< hello merging (async.max_in_flight is 1 by default)
inline constexpr size_t max_nccl_id_bytes = 256;  ///< hex of NCCL_UNIQUE_ID_BYTES (128)
inline constexpr size_t max_settings_bytes = 32 * 1024;  ///< hello trainingSettings

/// Serializes e as an unpacked Cap'n Proto Envelope (one frame). Texts longer than the limits above are
/// refused by the receiver, so keep them short.
std::vector<std::byte> build_envelope(const envelope& e);

/// Decodes and checks an Envelope frame: the same framing checks as parse_chunk_header (with
/// max_envelope_bytes), a known union member, text and list sizes within the limits, dtype in range, and
/// clusterId == expected_cluster_id (wrong_cluster otherwise). Protocol-level checks such as Hello's version
/// are the caller's.
frame_result<envelope> parse_envelope(const void* data, size_t size, uint64_t expected_cluster_id);

}  // namespace longwave::cluster
