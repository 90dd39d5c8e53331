#pragma once
// Longwave's error vocabulary: expected failures are values (errc), broken invariants are LW_ASSERT.
#include <cstdint>
#include <stdexcept>
#include <string>

namespace longwave {

/// Expected failures. Registered with CAF in runtime/messages/type_ids.hpp.
enum class errc : uint8_t {
  none = 0,
  invalid_config,       ///< user config rejected (CLI exits 2)
  io_error,             ///< file could not be read or written
  corrupt_checkpoint,   ///< checksum, size or magic mismatch
  corrupt_data,         ///< corpus, token shard or tokenizer file malformed (bad input: the CLI exits 2)
  deadline_missed,      ///< a request timed out
  stale_round,          ///< a message for a round that is over
  peer_lost,            ///< a peer or local worker went away
  malformed_frame,      ///< a wire frame failed validation
  torch_error,          ///< a c10::Error caught at an actor boundary
  cancelled,            ///< stopped by the user (Ctrl-C)
  diverged,             ///< training produced NaN or infinite values
  illegal_transition,   ///< a bug: the coordinator tried a move its state machine forbids
  evicted,              ///< this node was removed from its cluster's membership
  not_announced,        ///< the cluster's master does not know this node (it restarted): say hello again
  dir_lost,             ///< the run's directory lock was removed or replaced: another run may own it now
  checkpoint_mismatch,  ///< a valid checkpoint of another run's shape (workers, model, mode): not this run's
};

/// Human-readable name of an errc value.
const char* to_string(errc e);

/// An exception carrying an errc; thrown only inside a component and converted at its boundary.
class lw_error : public std::runtime_error {
 public:
  lw_error(errc code, const std::string& what) : std::runtime_error(what), code_(code) {}
  errc code() const noexcept { return code_; }

 private:
  errc code_;
};

/// e.what() for a message, except that a std::bad_alloc (whose what() is only "std::bad_alloc") becomes a
/// sentence saying memory ran out and which settings to lower.
std::string describe(const std::exception& e);

[[noreturn]] void assert_fail(const char* cond, const char* file, int line, const std::string& msg);

}  // namespace longwave

/// Broken invariant: a bug. Aborts with the condition, place and message.
#define LW_ASSERT(cond, msg)                                                \
  do {                                                                      \
    if (!(cond)) ::longwave::assert_fail(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)
