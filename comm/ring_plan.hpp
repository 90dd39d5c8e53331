#pragma once
// The ring's schedule of one call (comm/ring_allreduce.cpp, ring_round.cpp): which chunks a rank sends and
// expects, in wire order, and which arrival makes each send ready. Pure arithmetic, no I/O.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "comm/frame.hpp"
#include "comm/ring_allreduce.hpp"

namespace longwave::comm {

inline constexpr size_t npos = std::numeric_limits<size_t>::max();

// One chunk of the schedule, as sent or as expected.
struct item {
  ring_phase phase;
  uint32_t step;
  uint32_t segment;
  uint32_t chunk;
  size_t offset;         // into data (all-reduce) or into the segment's message (all-gather)
  size_t count;          // values (all-gather: bytes)
  size_t bytes;          // encoded payload bytes (0 for an empty chunk)
  size_t dep = npos;     // out items: the in item whose arrival makes this one ready; npos: ready at once
  bool keep = false;     // in items: the payload is passed on unchanged by a later out item
  bool forward = false;  // out items: sends the kept payload of its dep instead of building one
};

/// Encoded bytes of `count` values in o's dtype (0 for an empty chunk).
inline size_t payload_bytes(const ring_options& o, size_t count) {
  return count == 0 ? 0 : encoded_size(o.dtype, count, o.codec);
}

// The schedule of one call: what this rank sends (out) and expects (in), in wire order.
struct ring_plan {
  std::vector<item> in;
  std::vector<item> out;

  // The all-reduce of n values: N segments, reduce-scatter then all-gather.
  static ring_plan reduce(uint32_t rank, uint32_t world, size_t n, size_t chunk_elems,
                          const ring_options& o) {
    ring_plan p;
    const size_t base = n / world;
    const size_t rem = n % world;
    auto seg_offset = [&](uint32_t s) { return s * base + std::min<size_t>(s, rem); };
    auto seg_len = [&](uint32_t s) { return base + (s < rem ? 1 : 0); };
    auto bytes_of = [&](size_t count) { return payload_bytes(o, count); };
    const int64_t r = rank;
    // in_start[p][t]: index of the first in item of (phase p, step t).
    std::vector<size_t> in_start[2];
    for (int ph = 0; ph < 2; ++ph) {
      const auto phase = static_cast<ring_phase>(ph);
      for (uint32_t t = 0; t + 1 < world; ++t) {
        const uint32_t in_seg = ph == 0 ? mod(r - t - 1, world) : mod(r - t, world);
        const uint32_t out_seg = ph == 0 ? mod(r - t, world) : mod(r + 1 - t, world);
        in_start[ph].push_back(p.in.size());
        add(p.in, phase, t, in_seg, seg_offset(in_seg), seg_len(in_seg), chunk_elems, bytes_of);
        const size_t first_out = p.out.size();
        add(p.out, phase, t, out_seg, seg_offset(out_seg), seg_len(out_seg), chunk_elems, bytes_of);
        // Dependencies: the same segment's chunk k one step earlier (the reduce-scatter's last step for the
        // all-gather's first).
        if (ph == 0 && t == 0) continue;
        p.link(first_out,
               ph == 0 ? in_start[0][t - 1] : (t == 0 ? in_start[0][world - 2] : in_start[1][t - 1]));
      }
    }
    p.mark_forwarding(world);
    return p;
  }

  // The all-gather of one message of `bytes` bytes per rank: segment s is rank s's message. Step t sends
  // segment r-t (this rank's own at step 0, then what arrived at step t-1) and receives segment r-t-1.
  static ring_plan gather(uint32_t rank, uint32_t world, size_t bytes, size_t chunk_bytes) {
    ring_plan p;
    auto bytes_of = [](size_t count) { return count; };
    const int64_t r = rank;
    size_t prev_in = 0;  // the first in item of step t-1
    for (uint32_t t = 0; t + 1 < world; ++t) {
      const size_t in_start = p.in.size();
      add(p.in, ring_phase::all_gather, t, mod(r - t - 1, world), 0, bytes, chunk_bytes, bytes_of);
      const size_t first_out = p.out.size();
      add(p.out, ring_phase::all_gather, t, mod(r - t, world), 0, bytes, chunk_bytes, bytes_of);
      if (t > 0) p.link(first_out, prev_in);
      prev_in = in_start;
    }
    p.mark_forwarding(world);
    return p;
  }

 private:
  static uint32_t mod(int64_t v, uint32_t world) {
    return static_cast<uint32_t>(((v % world) + world) % world);
  }

  // Appends the chunks of segment seg (len values from offset off) to v; an empty segment is one empty chunk.
  template <class BytesOf>
  static void add(std::vector<item>& v, ring_phase p, uint32_t t, uint32_t seg, size_t off, size_t len,
                  size_t chunk, BytesOf&& bytes_of) {
    const size_t k_max = len == 0 ? size_t{1} : (len + chunk - 1) / chunk;
    for (size_t k = 0; k < k_max; ++k) {
      const size_t at = std::min(len, k * chunk);
      const size_t cnt = std::min(len - at, chunk);
      v.push_back(item{p, t, seg, static_cast<uint32_t>(k), off + at, cnt, bytes_of(cnt)});
    }
  }

  // The out items from first_out on depend, chunk by chunk, on the in items from dep_start on.
  void link(size_t first_out, size_t dep_start) {
    for (size_t i = first_out; i < out.size(); ++i) out[i].dep = dep_start + (i - first_out);
  }

  // The all-gather forwards what it receives unchanged, except at its last step (nobody needs it then).
  void mark_forwarding(uint32_t world) {
    for (auto& it : in) it.keep = it.phase == ring_phase::all_gather && it.step + 2 < world;
    for (auto& it : out) it.forward = it.phase == ring_phase::all_gather && it.step > 0;
  }
};

}  // namespace longwave::comm
