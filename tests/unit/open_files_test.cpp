// The open-file limit a coordinator or node raises at start (runtime/process/open_files.hpp).
#include <sys/resource.h>

#include <catch2/catch.hpp>

#include "runtime/process/open_files.hpp"

CATCH_TEST_CASE("the soft open-file limit is raised to the hard one", "[unit][process]") {
  rlimit lim{};
  CATCH_REQUIRE(::getrlimit(RLIMIT_NOFILE, &lim) == 0);
  const auto hard = lim.rlim_max;
  CATCH_REQUIRE(hard > 64);
  lim.rlim_cur = 64;  // as a shell's `ulimit -Sn 64` would leave it
  CATCH_REQUIRE(::setrlimit(RLIMIT_NOFILE, &lim) == 0);
  const uint64_t now = longwave::runtime::raise_open_file_limit();
  CATCH_REQUIRE(::getrlimit(RLIMIT_NOFILE, &lim) == 0);
  CATCH_CHECK(lim.rlim_cur == hard);
  CATCH_CHECK(now == (hard == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(hard)));
  CATCH_CHECK(longwave::runtime::raise_open_file_limit() == now);  // again: nothing to raise
}
