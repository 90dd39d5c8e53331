#pragma once
// diloco.outer = "async": the master's word on a merge, as the control plane carries it
// (cluster/envelope.hpp) and as training takes it (the coordinator's merge message). Torch-free, so the
// control plane shares it.
#include <cstdint>
#include <string>
#include <vector>

namespace longwave::runtime {

/// One contribution a merge names: `tokens` trained by `node` from version v_start (`parts` reports folded).
struct merge_entry {
  std::string node;
  uint64_t v_start = 0;
  uint64_t tokens = 0;
  uint32_t parts = 1;
};

/// Version `version` merges `merged` (the members listed send their pending pseudo-gradient into the
/// all-reduce of (version, 0), the others zeros with weight 0); `dropped` lists contributions refused since
/// the last merge. With `merged` empty, version is the current one and only drops are told.
struct merge_order {
  uint64_t version = 0;
  std::vector<merge_entry> merged;
  std::vector<merge_entry> dropped;
};

}  // namespace longwave::runtime
