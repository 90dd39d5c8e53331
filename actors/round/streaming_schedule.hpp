#pragma once
// Streaming DiLoCo's schedule within a round, as pure functions: where the workers stop next, which fragment
// takes its snapshot (starts its all-reduce) or is synced there, and the syncs that finish a run.
#include <cstdint>
#include <vector>

namespace longwave::actors {

/// H inner steps per round, P fragments (H a multiple of P), tau overlap steps (tau < H/P).
struct streaming_shape {
  int64_t h = 0, p = 1, tau = 0;
  int64_t period() const { return h / p; }  ///< H/P: one fragment event pair per period
};

/// The next stop of the workers after `pos` inner steps of the round (0 <= pos < H, at a previous stop).
/// For j = 1..P, fragment j mod P takes its snapshot at j*H/P - tau and is synced at j*H/P; with tau = 0 both
/// happen at the same stop.
struct streaming_event {
  int64_t at = 0;          ///< inner step of the round where the workers stop (1..H)
  int64_t steps = 0;       ///< inner steps to run to get there (at - pos)
  uint32_t j = 0;          ///< the round's j-th sync (1..P); ring label (round, j)
  uint32_t fragment = 0;   ///< j mod P
  bool snapshot = false;   ///< take the fragment's pseudo-gradient and start its all-reduce
  bool sync = false;       ///< wait for its average, apply it and mix it into the replicas
  bool round_end = false;  ///< the round's last stop (step H: fragment 0's sync)
  int64_t next_pos() const { return round_end ? 0 : at; }  ///< the round position after this stop
};
streaming_event next_streaming_event(const streaming_shape& s, int64_t pos);

/// Whether a round position is a stop with no fragment in flight (a mid-round snapshot may be taken there
/// and resumed): a multiple of H/P inside the round (H itself is the round's end, before its average).
bool streaming_resumable_at(const streaming_shape& s, int64_t pos);

/// After the last round, fragments 1..P-1 were last synced part-way through it and are synced once more, in
/// this order; fragment f's ring label is (T, P + f).
std::vector<uint32_t> streaming_final_fragments(const streaming_shape& s);

}  // namespace longwave::actors
