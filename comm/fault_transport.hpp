#pragma once
// Test faults and a rate limit as a transport decorator, installed when a ring is built (a node reads them
// from its environment at start-up): the ring's loop has no branch for them.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "comm/transport.hpp"

namespace longwave::comm {

struct transport_faults {
  /// The process kills itself with SIGKILL 50 ms after handing over its die_after_chunks-th chunk of the
  /// first call (round, fragment) of round die_in_round. 0: never.
  uint64_t die_in_round = 0;
  size_t die_after_chunks = 0;
  /// Instead of dying there, the ring hangs: it sends and takes nothing more, while ZeroMQ still delivers
  /// what it was handed, until something else kills the process (a test that waits until the next rank holds
  /// those chunks: 50 ms is not a promise on a loaded machine).
  bool hang = false;
  /// Frames towards the next rank leave as from a link of this many bytes per second (TCP/IP headers
  /// counted), each once the link would have carried it, after a burst of 256 KiB when idle (as tc tbf's
  /// in scripts/wan): a slow link where network namespaces are not at hand (bench/rate_limit.sh compares the
  /// two). 0: no limit.
  double send_bytes_per_s = 0;
  /// The frames of round gate_round wait until a file exists at gate_path (a test holds an all-reduce in
  /// flight while it does something else, then lets it go). 0: no gate.
  uint64_t gate_round = 0;
  std::string gate_path;
};

/// Wraps the transports `inner` builds (empty: ZeroMQ) with these faults.
transport_factory with_faults(transport_factory inner, transport_faults faults);

/// The faults a node's environment asks for: LONGWAVE_FAULT_DIE_IN_ALLREDUCE=ROUND:CHUNKS[:hang],
/// LONGWAVE_FAULT_RING_RATE=BYTES_PER_S and LONGWAVE_FAULT_ALLREDUCE_GATE=ROUND:PATH. nullopt when none is
/// set; lw_error(errc::invalid_config) naming the variable when one is malformed.
std::optional<transport_faults> transport_faults_from_env();

}  // namespace longwave::comm
