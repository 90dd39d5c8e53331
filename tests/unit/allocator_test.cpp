// keep_freed_buffers: chunk-sized blocks freed by a thread stay in malloc's arena, so the next frames reuse
// resident pages instead of faulting in fresh ones (the ring's pattern, bench/RESULTS.md).
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/memory/allocator.hpp"

namespace {

constexpr size_t block = (size_t{1} << 20) + 64;  // a 1 MiB frame and its message header
constexpr size_t blocks = 48;

long thread_minor_faults() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_minflt;
}

// `blocks` frames, each allocated and filled with `fill`.
std::vector<void*> written_frames(int fill) {
  std::vector<void*> v;
  for (size_t i = 0; i < blocks; ++i) {
    v.push_back(std::malloc(block));
    std::memset(v.back(), fill, block);
  }
  return v;
}

// Allocates, writes and frees `blocks` frames; returns the minor page faults of the last of `passes` passes.
long faults_of_last_pass(int passes) {
  long faults = 0;
  std::thread t([&] {  // a thread of its own, as the ring's I/O threads (a non-main arena)
    for (int p = 0; p < passes; ++p) {
      const long before = thread_minor_faults();
      for (void* x : written_frames(p + 1)) std::free(x);
      faults = thread_minor_faults() - before;
    }
  });
  t.join();
  return faults;
}

}  // namespace

CATCH_TEST_CASE("After keep_freed_buffers, reusing freed frames faults in almost no pages", "[allocator]") {
  CATCH_REQUIRE(longwave::runtime::keep_freed_buffers());
  CATCH_REQUIRE(longwave::runtime::keep_freed_buffers());  // idempotent
  const long pages = static_cast<long>(blocks * block / 4096);
  const long faults = faults_of_last_pass(3);
  CATCH_INFO("minor faults in the third pass: " << faults << " of " << pages << " pages written");
  // glibc's defaults trim the freed frames and fault every page in again (measured: ~100% of the pages).
  CATCH_CHECK(faults < pages / 10);
}

namespace {

// Writes and frees `blocks` frames, then returns a frame-sized block allocated after them and still live
// (so that the freed frames sit in the arena's bins instead of merging into its top, as between a
// node's live buffers).
void* frames_freed_before_a_live_block() {
  const std::vector<void*> v = written_frames(1);
  void* live = std::malloc(block);
  for (void* x : v) std::free(x);
  return live;
}

}  // namespace

CATCH_TEST_CASE("release_freed_memory hands freed frames back to the kernel", "[allocator]") {
  CATCH_REQUIRE(longwave::runtime::keep_freed_buffers());
  const size_t bytes = blocks * block;
  const bool on_a_thread = GENERATE(false, true);  // the main arena, or a thread's arena (the ring's case)
  CATCH_INFO((on_a_thread ? "frames of a thread that has ended" : "frames of the main thread"));
  longwave::runtime::release_freed_memory();  // what earlier sections kept
  const size_t start = longwave::runtime::resident_bytes();
  CATCH_REQUIRE(start > 0);
  void* live = nullptr;
  if (on_a_thread)
    std::thread([&] { live = frames_freed_before_a_live_block(); }).join();
  else
    live = frames_freed_before_a_live_block();
  const size_t kept = longwave::runtime::resident_bytes();
  CATCH_INFO("resident at the start " << start << ", after writing and freeing the frames " << kept);
  // No check that `kept` grew: a thread that reuses an arena whose top an earlier thread left (glibc never
  // trims it here) writes its frames into pages that were resident already.
  const size_t released = longwave::runtime::release_freed_memory();
  const size_t after = longwave::runtime::resident_bytes();
  std::free(live);
  CATCH_INFO("released " << released << ", resident after " << after);
  CATCH_CHECK(released >= bytes * 9 / 10);
  CATCH_CHECK(after <= start + bytes / 10 + block);
}
