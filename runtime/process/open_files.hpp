#pragma once
// The process's open-file limit, raised to what the system allows: every connection a coordinator or node
// accepts (CURVE's unauthenticated ones during their handshake too) holds a descriptor.
#include <cstdint>

namespace longwave::runtime {

/// Raises the soft RLIMIT_NOFILE to the hard limit, as Go's runtime does at start: a soft limit of 1024 (a
/// common default) let a peer without keys exhaust a node's descriptors with idle connections, and its
/// checkpoint writes then failed (a probe). Returns the soft limit now (0 when it cannot be read).
uint64_t raise_open_file_limit();

}  // namespace longwave::runtime
