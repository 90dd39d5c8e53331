// Sparse codec cost on one core: encode (top-k selection + quantize + pack), decode and decode-accumulate,
// as GB/s of fp32 input and as a ratio to memcpy of the same buffer in the same run, plus wire bytes against
// fp32 and int8 (issue 22).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "comm/codec.hpp"
#include "comm/sparse_codec.hpp"
#include "comm/sparse_error_feedback.hpp"
#include "runtime/clock/clock.hpp"

using namespace longwave::comm;

namespace {

template <class F>
double best_seconds(int repeats, F&& f) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, longwave::runtime::seconds_since(t0));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Sparse codec (top-k + 2/4-bit codes) throughput against memcpy, one core"};
  size_t n = 14'000'000;
  size_t chunk = 4096;
  int repeats = 5;
  app.add_option("--n", n, "fp32 values (default: the 14m preset's parameter count, rounded)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 34));
  app.add_option("--chunk", chunk, "values per top-k chunk")->check(CLI::Range(size_t{1}, size_t{1} << 24));
  app.add_option("--repeats", repeats, "repeats per measurement; the best is kept")
      ->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);

  // Pseudo-gradient-like input (heavy-tailed); every buffer is written once so page faults stay out.
  std::vector<float> src(n), dst(n), acc(n, 0.0f);
  {
    std::mt19937 rng(1);
    std::student_t_distribution<float> heavy(3.0f);
    for (float& v : src) v = 1e-3f * heavy(rng);
  }
  std::memcpy(dst.data(), src.data(), 4 * n);
  const double gb = 4.0 * static_cast<double>(n) / 1e9;
  const double int8_bytes = static_cast<double>(encoded_size(wire_dtype::int8, n));
  std::printf("sparse codec bench: n=%zu fp32 values (%.1f MB), chunk %zu, best of %d, one thread\n", n,
              gb * 1e3, chunk, repeats);
  std::printf(
      "GB/s count fp32 input bytes; ratio = (4n / (t_encode + t_decode)) / (4n / t_memcpy); ef = "
      "sparse_error_feedback::encode (decay, add, encode, own decode-subtract)\n\n");
  std::printf("%8s %4s %9s %7s %7s %8s %8s %8s %8s %8s %7s %9s\n", "density", "bits", "wire MB", "/fp32",
              "/int8", "memcpy", "encode", "decode", "dec+acc", "ef", "ratio", "ratio acc");
  for (double density : {0.01, 0.03, 0.1}) {
    for (unsigned bits : {2u, 4u}) {
      const sparse_options o{chunk, density, bits};
      const size_t bytes = sparse_encoded_size(n, o);
      std::vector<std::byte> enc(bytes, std::byte{0});
      sparse_error_feedback ef(n, 0.9f);
      bool ok = true;
      const double t_memcpy = best_seconds(repeats, [&] { std::memcpy(dst.data(), src.data(), 4 * n); });
      const double t_enc = best_seconds(repeats, [&] { ok &= sparse_encode(src.data(), n, enc.data(), o); });
      const double t_dec =
          best_seconds(repeats, [&] { ok &= sparse_decode(enc.data(), bytes, n, dst.data(), o); });
      const double t_acc =
          best_seconds(repeats, [&] { ok &= sparse_decode_accumulate(enc.data(), bytes, n, acc.data(), o); });
      const double t_ef = best_seconds(repeats, [&] { ok &= ef.encode(src.data(), n, 0, enc.data(), o); });
      if (!ok) {
        std::fprintf(stderr, "bench_sparse_codec: the codec refused its own output\n");
        return 1;
      }
      std::printf("%8.3f %4u %9.2f %6.0fx %6.1fx %8.2f %8.2f %8.2f %8.2f %8.2f %7.3f %9.3f\n", density, bits,
                  static_cast<double>(bytes) / 1e6, 4.0 * static_cast<double>(n) / static_cast<double>(bytes),
                  int8_bytes / static_cast<double>(bytes), gb / t_memcpy, gb / t_enc, gb / t_dec, gb / t_acc,
                  gb / t_ef, t_memcpy / (t_enc + t_dec), t_memcpy / (t_enc + t_acc));
    }
  }
  return 0;
}
