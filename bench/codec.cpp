// Codec throughput on one core: for each wire codec and SIMD level, encode + decode of an fp32 buffer timed
// against memcpy of the same buffer in the same run. Prints (GB of fp32 input / s) / (memcpy GB / s).
// Goal: >= 0.5 for every codec.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "comm/codec.hpp"
#include "comm/codec_kernels.hpp"
#include "runtime/clock/clock.hpp"

using namespace longwave::comm;
using detail::simd_isa;

namespace {

struct codec_case {
  const char* name;
  wire_dtype dt;
  codec_options o;
  /// int8 only: the same bytes through the kernel table one block at a time (an indirect call per block and
  /// kernel, as before the fused kernels; without decode's scale check), the baseline of the fused walk.
  bool per_block = false;
};

void encode_case(simd_isa isa, const codec_case& c, const float* src, size_t n, std::byte* dst) {
  if (!c.per_block) {
    detail::encode(isa, c.dt, src, n, dst, c.o);
    return;
  }
  const auto& k = detail::kernels_for(isa);
  const size_t scale_bytes = encoded_size(c.dt, n, c.o) - n;
  // The bench's input is finite, so no block poisons the chunk (the result is always true).
  detail::int8_encode_walk(src, n, dst, dst + scale_bytes, k.abs_max, k.int8_quantize);
}

bool decode_case(simd_isa isa, const codec_case& c, const std::byte* src, size_t bytes, size_t n, float* out,
                 bool add) {
  if (!c.per_block) {
    return add ? detail::decode_accumulate(isa, c.dt, src, bytes, n, out, c.o)
               : detail::decode(isa, c.dt, src, bytes, n, out, c.o);
  }
  const auto& k = detail::kernels_for(isa);
  detail::int8_decode_walk(src + (bytes - n), src, n, out, add, k.int8_dequantize, k.int8_dequantize_add);
  return true;
}

/// Best (shortest) time of each operation over the repeats, in seconds.
struct timings {
  double memcpy_s = 1e30;
  double encode_s = 1e30;
  double decode_s = 1e30;
  double accumulate_s = 1e30;
};

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return longwave::runtime::seconds_since(t0);
}

/// CPU model and the flags that matter for the codecs, from /proc/cpuinfo.
std::string cpu_summary() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model, flags;
  while (std::getline(in, line) && (model.empty() || flags.empty())) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (model.empty() && line.rfind("model name", 0) == 0) model = value;
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = value;
  }
  std::string picked;
  std::istringstream words(flags);
  for (std::string w; words >> w;) {
    if (w == "sse4_2" || w == "avx" || w == "avx2" || w == "f16c" || w == "fma" ||
        w.rfind("avx512", 0) == 0) {
      picked += (picked.empty() ? "" : " ") + w;
    }
  }
  return (model.empty() ? "unknown CPU" : model) +
         "; flags: " + (picked.empty() ? "(none of interest)" : picked);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Wire codec encode + decode throughput against memcpy, one core"};
  size_t n = 64'000'000;
  size_t chunk_bytes = size_t{1} << 20;
  int repeats = 5;
  std::string simd = "all";
  app.add_option("--n", n, "fp32 values in the buffer (suffixes k, M, G: powers of 1024)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(size_t{1}, size_t{1} << 36));
  app.add_option(
      "--chunk-bytes", chunk_bytes,
      "encoded bytes per encode call, as ring_options::chunk_bytes (one int8 codebook each; plain int8 has "
      "a scale per 256 values); "
      "0: the whole buffer is one chunk");
  app.add_option("--repeats", repeats, "repeats per measurement; the best is kept")
      ->check(CLI::Range(1, 1000));
  app.add_option("--simd", simd, "kernel levels to run: all, active, scalar, avx2, avx512");
  CLI11_PARSE(app, argc, argv);

  std::vector<simd_isa> levels;
  if (simd == "all") {
    for (simd_isa isa : {simd_isa::scalar, simd_isa::avx2, simd_isa::avx512}) {
      if (detail::isa_supported(isa)) levels.push_back(isa);
    }
  } else if (simd == "active") {
    levels.push_back(detail::active_isa());
  } else if (auto isa = detail::parse_simd_isa(simd); isa && detail::isa_supported(*isa)) {
    levels.push_back(*isa);
  } else {
    std::fprintf(stderr,
                 "bench_codec: --simd %s is not one of all, active, scalar, avx2, avx512 or is not "
                 "supported by this CPU\n",
                 simd.c_str());
    return 2;
  }

  const codec_case cases[] = {{"fp32", wire_dtype::fp32, {}},
                              {"fp16", wire_dtype::fp16, {}},
                              {"bf16", wire_dtype::bf16, {}},
                              {"int8", wire_dtype::int8, {}},
                              {"int8-perblock", wire_dtype::int8, {}, true},
                              {"int8-codebook", wire_dtype::int8, {true}}};

  // Pseudo-gradient-like input; every buffer is written once so page faults stay out of the timings.
  std::vector<float> src(n), dst(n), acc(n, 0.0f);
  {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1e-3f);
    for (float& v : src) v = normal(rng);
  }
  // Values per encode call, as the ring computes them: chunk_bytes of payload, headers included.
  const auto chunk_values = [&](const codec_case& c) {
    if (chunk_bytes == 0) return n;
    const size_t probe = size_t{1} << 20;
    const double per_value = static_cast<double>(encoded_size(c.dt, probe, c.o)) / static_cast<double>(probe);
    return std::clamp<size_t>(static_cast<size_t>(static_cast<double>(chunk_bytes) / per_value), 1, n);
  };
  size_t max_bytes = 0;
  for (const codec_case& c : cases) {
    const size_t chunk = chunk_values(c);
    size_t bytes = 0;
    for (size_t off = 0; off < n; off += chunk) bytes += encoded_size(c.dt, std::min(chunk, n - off), c.o);
    max_bytes = std::max(max_bytes, bytes);
  }
  std::vector<std::byte> enc(max_bytes, std::byte{0});
  std::memcpy(dst.data(), src.data(), 4 * n);

  const double gb = 4.0 * static_cast<double>(n) / 1e9;
  std::printf(
      "codec bench: n=%zu fp32 values (%.1f MB), chunks of %s, best of %d, one thread\n", n, gb * 1e3,
      chunk_bytes == 0 ? "the whole buffer" : (std::to_string(chunk_bytes) + " encoded bytes").c_str(),
      repeats);
  std::printf("cpu: %s\n", cpu_summary().c_str());
  std::printf("default simd level: %s (LONGWAVE_SIMD overrides)\n", simd_level());
  std::printf(
      "GB/s count fp32 input bytes; ratio = (4n / (t_encode + t_decode)) / (4n / t_memcpy), goal >= 0.5;\n"
      "ratio acc uses decode_accumulate; chunk = values per encode call; int8-perblock = int8 with a kernel\n"
      "call per 256-value block (the dispatch before the fused kernels), the baseline of the fused walk\n"
      "fp32 is what the ring does: encode copies the chunk into the message it sends, the receiver decodes\n"
      "(copies) it, so its ratio is ~0.5 by construction (zero-copy sends are not safe: comm/CODEC.md, "
      "Cost)\n\n");
  std::printf("%-7s %-14s %9s %9s %9s %9s %9s %9s %10s %10s\n", "level", "codec", "chunk", "wire MB",
              "memcpy", "encode", "decode", "dec+acc", "ratio", "ratio acc");

  int active_rows = 0;
  int active_met = 0;
  std::string speedups;  // int8: per-block calls' time over the fused walk's, per level
  for (simd_isa isa : levels) {
    timings fused;
    for (const codec_case& c : cases) {
      timings t;
      size_t wire_bytes = 0;
      const size_t chunk = chunk_values(c);
      for (int r = 0; r < repeats; ++r) {
        // memcpy of the same buffer, interleaved with the codec so both see the same machine state.
        t.memcpy_s = std::min(t.memcpy_s, seconds([&] { std::memcpy(dst.data(), src.data(), 4 * n); }));
        t.encode_s = std::min(t.encode_s, seconds([&] {
                                size_t at = 0;
                                for (size_t off = 0; off < n; off += chunk) {
                                  const size_t len = std::min(chunk, n - off);
                                  encode_case(isa, c, src.data() + off, len, enc.data() + at);
                                  at += encoded_size(c.dt, len, c.o);
                                }
                                wire_bytes = at;
                              }));
        bool ok = true;
        const auto decode_all = [&](float* out, bool add) {
          size_t at = 0;
          for (size_t off = 0; off < n; off += chunk) {
            const size_t len = std::min(chunk, n - off);
            const size_t bytes = encoded_size(c.dt, len, c.o);
            ok &= decode_case(isa, c, enc.data() + at, bytes, len, out + off, add);
            at += bytes;
          }
        };
        t.decode_s = std::min(t.decode_s, seconds([&] { decode_all(dst.data(), false); }));
        t.accumulate_s = std::min(t.accumulate_s, seconds([&] { decode_all(acc.data(), true); }));
        if (!ok) {
          std::fprintf(stderr, "bench_codec: %s failed to decode its own output\n", c.name);
          return 1;
        }
      }
      const double ratio = t.memcpy_s / (t.encode_s + t.decode_s);
      const double ratio_acc = t.memcpy_s / (t.encode_s + t.accumulate_s);
      if (c.dt == wire_dtype::int8 && !c.o.int8_codebook && !c.per_block) fused = t;
      if (c.per_block) {
        char line[160];
        std::snprintf(line, sizeof line, "%-7s encode %.2fx, decode %.2fx, dec+acc %.2fx\n",
                      detail::to_string(isa), t.encode_s / fused.encode_s, t.decode_s / fused.decode_s,
                      t.accumulate_s / fused.accumulate_s);
        speedups += line;
      }
      if (isa == detail::active_isa() && !c.per_block) {
        ++active_rows;
        active_met += ratio >= 0.5 ? 1 : 0;
      }
      std::printf("%-7s %-14s %9zu %9.1f %9.2f %9.2f %9.2f %9.2f %10.2f %10.2f%s\n", detail::to_string(isa),
                  c.name, chunk, static_cast<double>(wire_bytes) / 1e6, gb / t.memcpy_s, gb / t.encode_s,
                  gb / t.decode_s, gb / t.accumulate_s, ratio, ratio_acc,
                  c.dt == wire_dtype::fp32 ? "  (2 copies)"
                  : c.per_block            ? "  (baseline)"
                                           : (ratio >= 0.5 ? "" : "  < goal"));
    }
  }
  std::printf("\nint8-perblock time / int8 time (one kernel call per 256 values against the fused walk):\n%s",
              speedups.c_str());
  if (active_rows > 0) {
    std::printf("\nratio >= 0.5 at the default level (%s): %d of %d codecs\n", simd_level(), active_met,
                active_rows);
  }
  return 0;
}
