#pragma once
// Naming one all-reduce of a run, and what a ring holds when its membership changes: the data plane's
// vocabulary that the control plane (cluster/) carries in its messages.
#include <cstdint>
#include <string>

namespace longwave::comm {

/// One all-reduce of a run: (round, fragment), increasing from call to call.
struct reduce_key {
  uint64_t round = 0;
  uint32_t fragment = 0;
  friend bool operator==(const reduce_key& a, const reduce_key& b) {
    return a.round == b.round && a.fragment == b.fragment;
  }
  friend bool operator!=(const reduce_key& a, const reduce_key& b) { return !(a == b); }
  friend bool operator<(const reduce_key& a, const reduce_key& b) {
    return a.round != b.round ? a.round < b.round : a.fragment < b.fragment;
  }
};

/// "round R", or "round R fragment F" for a streaming fragment's (fragment 0 is a round's whole average).
inline std::string label_text(const reduce_key& k) {
  return "round " + std::to_string(k.round) + (k.fragment ? " fragment " + std::to_string(k.fragment) : "");
}

/// What a fenced ring holds once it is idle (comm::elastic_ring::fence_report); the node sends it to its
/// coordinator as its fence acknowledgement.
struct fence_state {
  uint64_t epoch = 0;
  reduce_key committed;      ///< the last all-reduce the node applied ({0, 0}: none)
  bool has_pending = false;  ///< an all-reduce was in flight
  reduce_key pending;        ///< ... this one
  bool have_result = false;  ///< ... and its result had arrived (its confirmation had not)
};

}  // namespace longwave::comm
