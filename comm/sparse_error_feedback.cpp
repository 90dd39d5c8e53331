// Sparse error feedback: decay and add, encode the residual, subtract this node's own decode of the message.
#include "comm/sparse_error_feedback.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "runtime/errors/errors.hpp"

namespace longwave::comm {
namespace {

// Threads of one encode, and the fewest values worth a thread of their own.
size_t max_encode_threads() {
  static const size_t n = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 4);
  return n;
}
constexpr size_t min_values_per_thread = size_t{1} << 20;

/// fn(0 .. count-1), fn(0) on this thread and the others on threads of their own; every thread is joined
/// before the first exception (of any of them, or of starting one) is rethrown here.
template <class Fn>
void in_parallel(size_t count, Fn fn) {
  std::vector<std::exception_ptr> errors(count);
  auto guarded = [&](size_t t) {
    try {
      fn(t);
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  try {
    for (size_t t = 1; t < count; ++t) pool.emplace_back(guarded, t);
  } catch (...) {
    errors[0] = std::current_exception();  // no thread: run nothing more, join what started
  }
  if (!errors[0]) guarded(0);
  for (auto& th : pool) th.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void check_decay(float decay) {
  LW_ASSERT(decay >= 0.0f && decay <= 1.0f,
            "sparse_error_feedback: ef_decay = " + std::to_string(decay) + " is outside [0, 1]");
}

}  // namespace

sparse_error_feedback::sparse_error_feedback(size_t n, float decay) : residual_(n, 0.0f), decay_(decay) {
  check_decay(decay);
}

sparse_error_feedback::sparse_error_feedback(std::vector<float> residual, float decay)
    : residual_(std::move(residual)), decay_(decay) {
  check_decay(decay);
}

bool sparse_error_feedback::encode(const float* delta, size_t n, size_t offset, std::byte* dst,
                                   const sparse_options& o) {
  LW_ASSERT(offset <= residual_.size() && n <= residual_.size() - offset,
            "sparse_error_feedback: range [" + std::to_string(offset) + ", +" + std::to_string(n) +
                ") outside " + std::to_string(residual_.size()));
  float* e = residual_.data() + offset;
  // Whole chunks are independent: a large vector is cut into ranges of whole chunks, one per thread, each
  // written at its own byte offset, so the bytes are those of one pass. The codec is the CPU cost of the
  // sparse all-reduce (about 1.3 GB/s of input on one core), and a node's cores are idle while it runs.
  const size_t chunks = (n + o.chunk - 1) / o.chunk;
  const size_t threads =
      std::max<size_t>(1, std::min<size_t>({max_encode_threads(), chunks, n / min_values_per_thread}));
  const size_t per = (chunks + threads - 1) / threads;
  auto begin_of = [&](size_t t) { return std::min(n, t * per * o.chunk); };
  auto len_of = [&](size_t t) { return begin_of(t + 1) - begin_of(t); };
  // begin_of(t) is a multiple of the chunk, so the bytes before it are those of begin_of(t) values.
  auto out_of = [&](size_t t) { return dst + sparse_encoded_size(begin_of(t), o); };
  std::vector<uint8_t> ok(threads, 1);
  in_parallel(threads, [&](size_t t) {
    float* x = e + begin_of(t);
    const float* d = delta + begin_of(t);
    for (size_t i = 0, len = len_of(t); i < len; ++i) x[i] = decay_ * x[i] + d[i];
    ok[t] = sparse_encode(x, len_of(t), out_of(t), o) ? 1 : 0;
  });
  if (std::find(ok.begin(), ok.end(), 0) != ok.end()) return false;  // e keeps decay * e_old + delta
  in_parallel(threads, [&](size_t t) {
    // Our own bytes: the decode cannot fail, and it is exactly what every receiver adds.
    const bool decoded =
        sparse_decode_subtract(out_of(t), sparse_encoded_size(len_of(t), o), len_of(t), e + begin_of(t), o);
    LW_ASSERT(decoded, "sparse_error_feedback: a message this node encoded does not decode");
  });
  return true;
}

bool sparse_error_feedback::accumulate_and_gather(const float* delta, const size_t* mask, size_t k,
                                                  float* v) {
  LW_ASSERT(k == 0 || mask[k - 1] < residual_.size(), "sparse_error_feedback: mask index out of range");
  float* e = residual_.data();
  for (size_t i = 0; i < residual_.size(); ++i) e[i] = decay_ * e[i] + delta[i];
  bool finite = true;
  for (size_t i = 0; i < k; ++i) {
    v[i] = e[mask[i]];
    finite = finite && std::isfinite(v[i]);
  }
  return finite;
}

void sparse_error_feedback::subtract(const size_t* mask, size_t k, const float* sent) {
  LW_ASSERT(k == 0 || mask[k - 1] < residual_.size(), "sparse_error_feedback: mask index out of range");
  for (size_t i = 0; i < k; ++i) residual_[mask[i]] -= sent[i];
}

void sparse_error_feedback::reset() {
  std::fill(residual_.begin(), residual_.end(), 0.0f);
}

}  // namespace longwave::comm
