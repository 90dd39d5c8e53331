#pragma once
// A checkpoint as one byte string in memory, for sending the training state to a node that joins a running
// cluster (cluster/state_server.hpp). The file format (checkpoint_store) streams to disk with fsync; this one
// is built and read in memory. The transfer checks its own CRCs; the reader still checks every length.
#include <cstddef>
#include <vector>

#include "runtime/checkpoint/checkpoint_store.hpp"

namespace longwave::runtime {

/// "LWSTATE1", round, step, meta, then each blob's name and bytes (little-endian lengths).
std::vector<std::byte> checkpoint_to_bytes(const checkpoint& c);

/// The checkpoint in `bytes` (its blobs own copies). Throws lw_error(corrupt_checkpoint) naming what is wrong
/// (bad magic, a length past the end, trailing bytes).
checkpoint checkpoint_from_bytes(const std::vector<std::byte>& bytes);

}  // namespace longwave::runtime
