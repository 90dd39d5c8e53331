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

// Allocates, writes and frees `blocks` frames; returns the minor page faults of the last of `passes` passes.
long faults_of_last_pass(int passes) {
  long faults = 0;
  std::thread t([&] {  // a thread of its own, as the ring's I/O threads (a non-main arena)
    for (int p = 0; p < passes; ++p) {
      const long before = thread_minor_faults();
      std::vector<void*> v;
      for (size_t i = 0; i < blocks; ++i) {
        v.push_back(std::malloc(block));
        std::memset(v.back(), p + 1, block);
      }
      for (void* x : v) std::free(x);
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

CATCH_TEST_CASE("release_freed_memory hands freed frames back to the kernel", "[allocator]") {
  CATCH_REQUIRE(longwave::runtime::keep_freed_buffers());
  const size_t bytes = blocks * block;
  longwave::runtime::release_freed_memory();  // what earlier tests kept
  const size_t start = longwave::runtime::resident_bytes();
  CATCH_REQUIRE(start > 0);
  std::vector<void*> v;
  for (size_t i = 0; i < blocks; ++i) {
    v.push_back(std::malloc(block));
    std::memset(v.back(), 1, block);
  }
  for (void* x : v) std::free(x);
  const size_t kept = longwave::runtime::resident_bytes();
  CATCH_INFO("resident at the start " << start << ", after writing and freeing the frames " << kept);
  CATCH_REQUIRE(kept >= start + bytes * 9 / 10);  // kept for reuse, as keep_freed_buffers asks
  const size_t released = longwave::runtime::release_freed_memory();
  const size_t after = longwave::runtime::resident_bytes();
  CATCH_INFO("released " << released << ", resident after " << after);
  CATCH_CHECK(released >= bytes * 9 / 10);
  CATCH_CHECK(after <= start + bytes / 10);
}
