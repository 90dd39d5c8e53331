#pragma once
// The all-reduce (and all-gather) of a cluster whose membership changes by epochs. Each epoch has its own
// collective among that epoch's members: a ring_allreduce (comm.backend = "ring"), or whatever a factory
// makes (NCCL: a communicator per epoch, comm/deferred_collective.hpp); a fence from the coordinator
// abandons the call in flight (cancel: NCCL aborts its communicator), and the next membership either keeps
// its result (every member holds it) or redoes it among the new members from the kept input. Results are
// applied only after a confirmation all-reduce (two values a rank: its note), so no member applies an average
// that another member may have to redo.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/collective.hpp"
#include "comm/frame.hpp"
#include "comm/ring_allreduce.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::comm {

/// One epoch's ring, in rank order.
struct epoch_view {
  uint64_t epoch = 0;
  uint32_t rank = 0;
  std::vector<std::string> names;
  std::vector<std::string> endpoints;
  std::vector<std::string> public_keys;  ///< CURVE: each member's key (empty without CURVE)
};

/// A ring call that failed without a fence: what the node tells the coordinator (ring_failed_msg).
struct ring_failure {
  uint64_t epoch = 0;
  std::string suspect;  ///< the next rank's name when its connection dropped, else empty
  std::string reason;
  /// When the failed call began: a rank whose previous neighbour died waits the ring's timeout before its
  /// call fails, so its ring may have stalled since any moment after this (cut_off_rule counts from here).
  std::chrono::steady_clock::time_point began;
};

/// The collective of a cluster node. allreduce and allgather run on the communicator's thread; the
/// membership calls (fence, enter, evict, fence_report, take_failure) come from the node's main thread.
class elastic_ring final : public collective {
 public:
  /// One epoch's collective among view's members, made on the main thread (in the constructor and enter()):
  /// it must not block there. A failure to make it is thrown as an lw_error, which evicts the node.
  using epoch_factory = std::function<std::shared_ptr<collective>(const epoch_view& view)>;

  /// The ring backend: a ring_allreduce per epoch. committed: the last all-reduce the node's starting state
  /// includes (a joiner's; else none).
  elastic_ring(epoch_view first, ring_options opts, ring_allreduce::reject_callback on_reject = {},
               reduce_key committed = {});
  /// Another backend: `make` builds each epoch's collective; timeout: how long a failure waits for the
  /// coordinator's fence before the call fails.
  elastic_ring(epoch_view first, epoch_factory make, std::chrono::milliseconds timeout,
               reduce_key committed = {});
  ~elastic_ring() override;

  /// As ring_allreduce::allreduce, across the current epoch's members. A fence during the call parks it
  /// until the next membership; then its result is kept or the call is redone from the input it was given.
  /// Throws peer_lost when this node is evicted, cancelled after cancel(), and the ring's error when a
  /// failure brings no fence within the ring's timeout. weight may be rank0_weight (collective.hpp).
  void allreduce(uint64_t round, float* data, size_t n, double weight = 1.0, uint32_t fragment = 0,
                 std::optional<wire_dtype> dtype = std::nullopt) override;

  /// As ring_allreduce::allgather, across the current epoch's members, with allreduce's fence, redo and
  /// confirmation rules: a parked call keeps its gathered result or gathers again among the new members
  /// from the same message, so every member returns the same messages.
  gathered allgather(uint64_t round, const std::byte* message, size_t bytes, double weight = 1.0,
                     uint32_t fragment = 0) override;

  void cancel() override;
  void peer_declared_lost(const std::string& verdict) override;

  /// Membership is changing to `epoch`: the call in flight is abandoned and no new one starts until enter().
  void fence(uint64_t epoch);
  /// Once the ring is idle after fence(): what this node holds, for the coordinator (once per fence).
  std::optional<fence_state> fence_report();
  /// The next epoch's members and the kept all-reduce (commit): rebuilds the ring and resumes a parked call.
  void enter(const epoch_view& next, reduce_key commit);
  /// This node is no longer a member: the running and every later call throw peer_lost with `why`.
  void evict(const std::string& why);
  /// A call that failed without a fence since the last call of this (the coordinator should hear of it).
  std::optional<ring_failure> take_failure();

  uint64_t epoch() const;
  /// Between a fence and the next membership.
  bool fenced() const;
  /// The call in flight or parked, if any.
  std::optional<reduce_key> pending() const;
  /// The last all-reduce applied.
  reduce_key committed() const;

  uint64_t completed_round() const override;
  void set_note(const rank_note& note) override;
  std::vector<rank_note> notes() const override;
  double last_total_weight() const override { return total_weight_.load(); }
  std::vector<std::string> last_members() const override;
  uint64_t bytes_sent() const override;
  uint64_t bytes_received() const override;
  double encode_seconds() const override;
  double send_wait_seconds() const override;
  double receive_wait_seconds() const override;
  double decode_seconds() const override;
  size_t chunk_elements() const override;
  int rank() const override;
  int world_size() const override;
  const char* backend_name() const override { return backend_; }

 private:
  enum class outcome { done, parked, failed };
  /// The main collective of a call on one epoch's collective, with the fragment to use.
  using main_call = std::function<void(collective& ring, uint32_t fragment)>;
  // One call through fences and membership changes: main then its confirmation, redone (after restore()
  // puts the kept input back) until it is done, kept, or fails.
  void run(const reduce_key& key, const main_call& main, const std::function<void()>& restore);
  outcome attempt(const reduce_key& key, const main_call& main, std::string& error, errc& code);
  /// The call's confirmation on `ring`: every rank's note, in rank order.
  std::vector<rank_note> confirm(collective& ring, const reduce_key& key);
  void start(reduce_key committed);
  void retire_ring();  // under mu_
  void build_ring();   // under mu_

  epoch_factory make_;
  std::chrono::milliseconds timeout_;
  const char* backend_ = "ring";
  size_t chunk_elements_ = 1;
  std::vector<float> input_;  // the running call's input (allreduce's thread only)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  epoch_view view_;
  std::shared_ptr<collective> ring_;  // the current epoch's collective; shared with a call in flight
  bool fenced_ = false, reported_ = false, in_call_ = false, cancelled_ = false;
  uint64_t fence_epoch_ = 0;
  std::optional<std::string> evicted_;
  std::optional<ring_failure> failure_;
  std::optional<reduce_key> pending_;  // the call in flight or parked
  bool have_result_ = false;           // pending_'s main all-reduce completed
  std::optional<reduce_key> commit_;   // the coordinator's verdict for a parked call
  bool entered_ = false;               // enter() since the call parked
  reduce_key committed_;
  std::atomic<double> total_weight_{0};  // of the last main all-reduce that completed
  std::atomic<bool> confirming_{false};  // in a confirmation, holding the main all-reduce's result
  rank_note note_;                       // this rank's, sent with each confirmation (under mu_)
  std::vector<rank_note> notes_;         // every rank's, from the last confirmation (under mu_)
  double result_total_ = 0;              // the parked call's main total weight (under mu_, with have_result_)
  std::vector<std::string> result_members_;  // the epoch's members that computed it (under mu_, likewise)
  std::vector<std::string> members_;         // those of the last call that completed (under mu_)
  // Counters of retired rings.
  uint64_t sent_ = 0, received_ = 0;
  double encode_s_ = 0, decode_s_ = 0;
  double send_wait_s_ = 0, receive_wait_s_ = 0;
};

}  // namespace longwave::comm
