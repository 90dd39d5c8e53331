// Names of errc values and the LW_ASSERT failure path.
#include "runtime/errors/errors.hpp"

#include <cstdio>
#include <cstdlib>
#include <new>

namespace longwave {

const char* to_string(errc e) {
  switch (e) {
    case errc::none: return "none";
    case errc::invalid_config: return "invalid_config";
    case errc::io_error: return "io_error";
    case errc::corrupt_checkpoint: return "corrupt_checkpoint";
    case errc::corrupt_data: return "corrupt_data";
    case errc::deadline_missed: return "deadline_missed";
    case errc::stale_round: return "stale_round";
    case errc::peer_lost: return "peer_lost";
    case errc::malformed_frame: return "malformed_frame";
    case errc::torch_error: return "torch_error";
    case errc::cancelled: return "cancelled";
    case errc::diverged: return "diverged";
    case errc::illegal_transition: return "illegal_transition";
    case errc::evicted: return "evicted";
    case errc::not_announced: return "not_announced";
    case errc::dir_lost: return "dir_lost";
    case errc::checkpoint_mismatch: return "checkpoint_mismatch";
  }
  return "unknown";
}

std::string describe(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) {
    return "out of memory (std::bad_alloc): lower train.batch_size, train.workers or model.seq_len, or use a "
           "smaller model.preset";
  }
  return e.what();
}

void assert_fail(const char* cond, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "longwave: internal error: %s:%d: %s failed: %s\n", file, line, cond, msg.c_str());
  std::abort();
}

}  // namespace longwave
