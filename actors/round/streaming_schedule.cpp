// Streaming DiLoCo's per-round schedule (docs/02-policies.md).
#include "actors/round/streaming_schedule.hpp"

#include "runtime/errors/errors.hpp"

namespace longwave::actors {

streaming_event next_streaming_event(const streaming_shape& s, int64_t pos) {
  const int64_t len = s.period();
  LW_ASSERT(len > 0 && s.h % s.p == 0 && s.tau >= 0 && s.tau < len, "streaming: bad schedule shape");
  LW_ASSERT(pos >= 0 && pos < s.h, "streaming: position outside the round");
  streaming_event e;
  const int64_t j = pos / len + 1;
  e.snapshot = pos < j * len - s.tau;
  e.at = e.snapshot ? j * len - s.tau : j * len;
  e.sync = !e.snapshot || s.tau == 0;
  e.steps = e.at - pos;
  e.round_end = e.at == s.h;
  e.j = static_cast<uint32_t>(j);
  e.fragment = static_cast<uint32_t>(j % s.p);
  return e;
}

bool streaming_resumable_at(const streaming_shape& s, int64_t pos) {
  return pos >= 0 && pos < s.h && pos % s.period() == 0;
}

std::vector<uint32_t> streaming_final_fragments(const streaming_shape& s) {
  std::vector<uint32_t> out;
  for (int64_t f = 1; f < s.p; ++f) out.push_back(static_cast<uint32_t>(f));
  return out;
}

}  // namespace longwave::actors
