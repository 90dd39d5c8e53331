// libFuzzer target: a data-plane chunk as ring_allreduce receives it: parse_chunk_header, check_chunk against
// the expectation, then decode_accumulate (reduce-scatter) or decode (all-gather) of the payload, for every
// dtype and the int8 codebook. Every kernel level this CPU has must decode the same bits.
//
// Input: [mode][header length, 2 bytes little-endian][header frame][payload frame]. mode bit 0: int8
// codebook; bit 1: replace the header's checksum by the payload's CRC-32C (the fuzzer cannot forge a CRC, and
// without this no mutated payload would reach the decoder).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "comm/codec.hpp"
#include "comm/frame.hpp"
#include "fuzz/fuzz_seeds.hpp"
#include "runtime/checksum/crc32c.hpp"

using namespace longwave::comm;
using longwave::runtime::crc32c;

namespace {

constexpr uint64_t cluster = 0xc4a9c;
// A real chunk is at most a few MiB; the fuzzer's are bounded so that one input stays fast.
constexpr uint64_t max_elements = 1u << 16;

void write_seeds(const std::string& dir) {
  std::mt19937 rng(7);
  std::normal_distribution<float> gauss(0.f, 1e-3f);
  const wire_dtype dts[] = {wire_dtype::fp32, wire_dtype::fp16, wire_dtype::bf16, wire_dtype::int8};
  for (auto dt : dts)
    for (int codebook = 0; codebook < (dt == wire_dtype::int8 ? 2 : 1); ++codebook)
      for (int phase = 0; phase < 2; ++phase) {
        const size_t n = 300;  // more than one int8 block
        std::vector<float> x(n);
        for (auto& v : x) v = gauss(rng);
        const codec_options o{codebook != 0};
        std::vector<std::byte> payload(encoded_size(dt, n, o));
        encode(dt, x.data(), n, payload.data(), o);
        chunk_header h;
        h.cluster_id = cluster;
        h.epoch = 2;
        h.round = 5;
        h.phase = static_cast<ring_phase>(phase);
        h.step = 1;
        h.segment = 2;
        h.sender = 1;
        h.world_size = 4;
        h.dtype = dt;
        h.total_elements = 4 * n;
        h.element_count = n;
        h.byte_count = payload.size();
        h.checksum = crc32c(payload.data(), payload.size());
        h.weight = phase == 0 ? 2.0 : 4.0;
        const auto header = build_chunk_header(h);
        // All-gather seeds ask for the checksum to be fixed up (mode bit 1), reduce-scatter ones carry a real
        // one.
        std::vector<uint8_t> in = {static_cast<uint8_t>(codebook | (phase << 1)),
                                   static_cast<uint8_t>(header.size() & 0xff),
                                   static_cast<uint8_t>(header.size() >> 8)};
        const auto* hb = reinterpret_cast<const uint8_t*>(header.data());
        const auto* pb = reinterpret_cast<const uint8_t*>(payload.data());
        in.insert(in.end(), hb, hb + header.size());
        in.insert(in.end(), pb, pb + payload.size());
        longwave::fuzz::write_seed(dir,
                                   std::string("chunk_") + longwave::config::to_string(dt) +
                                       (codebook ? "_cb" : "") + (phase ? "_ag" : "_rs"),
                                   in.data(), in.size());
      }
}

}  // namespace

LW_FUZZ_INITIALIZE(write_seeds)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t mode = data[0];
  const size_t header_size = std::min<size_t>(data[1] | size_t{data[2]} << 8, size - 3);
  const uint8_t* header = data + 3;
  const uint8_t* payload = header + header_size;
  const size_t payload_size = size - 3 - header_size;

  auto parsed = parse_chunk_header(header, header_size);
  if (!parsed) {
    (void)parsed.error().message();
    return 0;
  }
  chunk_header h = parsed.value();
  if (mode & 2) h.checksum = crc32c(payload, payload_size);
  const codec_options o{(mode & 1) != 0};

  // The receiver's expectation: what the ring plan says comes next. Taken from the header (within bounds) so
  // that inputs get past the position checks to the decoder; a second, fixed one exercises the rejections.
  chunk_expectation e;
  e.cluster_id = cluster;
  e.epoch = h.epoch;
  e.round = h.round;
  e.fragment = h.fragment;
  e.world_size = h.world_size;
  e.total_elements = h.total_elements;
  e.dtype = h.dtype;
  e.sender = h.sender;
  e.phase = h.phase;
  e.step = h.step;
  e.segment = h.segment;
  e.chunk = h.chunk;
  e.element_count = std::min<uint64_t>(h.element_count, max_elements);
  e.byte_count = e.element_count == 0 ? 0 : encoded_size(h.dtype, e.element_count, o);
  (void)is_later_round(h, e);
  chunk_expectation fixed;
  fixed.cluster_id = cluster;
  fixed.world_size = 4;
  fixed.total_elements = 1200;
  fixed.element_count = 300;
  fixed.byte_count = encoded_size(wire_dtype::fp32, 300, o);
  (void)is_later_round(h, fixed);
  if (auto bad = check_chunk(h, payload, payload_size, fixed)) (void)bad->message();

  if (auto bad = check_chunk(h, payload, payload_size, e)) {
    (void)bad->message();
    return 0;
  }
  const size_t n = static_cast<size_t>(e.element_count);
  if (n == 0) return 0;
  const auto* src = reinterpret_cast<const std::byte*>(payload);
  using longwave::comm::detail::simd_isa;
  std::vector<float> first;
  bool first_ok = false;
  bool have_first = false;
  for (auto isa : {simd_isa::scalar, simd_isa::avx2, simd_isa::avx512}) {
    if (!longwave::comm::detail::isa_supported(isa)) continue;
    std::vector<float> out(n, 1.0f);
    const bool ok =
        h.phase == ring_phase::reduce_scatter
            ? longwave::comm::detail::decode_accumulate(isa, h.dtype, src, payload_size, n, out.data(), o)
            : longwave::comm::detail::decode(isa, h.dtype, src, payload_size, n, out.data(), o);
    if (!ok)
      for (float v : out)
        if (v != 1.0f) longwave::fuzz::fail("a refused payload changed the output");
    if (!have_first) {
      first = std::move(out);
      first_ok = ok;
      have_first = true;
    } else if (ok != first_ok || std::memcmp(first.data(), out.data(), n * sizeof(float)) != 0) {
      longwave::fuzz::fail("kernel levels disagree on a payload");
    }
  }
  return 0;
}
