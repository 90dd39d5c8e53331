// Training windows for one worker: random (seed, position)-addressed windows inside the worker's own region
// of the train tokens, resumable exactly by position; plus fixed, consecutive validation windows.
#include "models/data/window_sampler.hpp"

#include <fmt/format.h>
#include <algorithm>

#include "runtime/checksum/splitmix64.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::models::data {

namespace {

using runtime::splitmix64;

// A uniform value in [0, range) from a 64-bit hash (Lemire's multiply-shift; bias < range / 2^64).
uint64_t reduce(uint64_t hash, uint64_t range) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(hash) * range) >> 64);
}

void check_positive(int64_t value, const char* name) {
  if (value <= 0)
    throw lw_error(errc::invalid_config, fmt::format("{} must be positive, got {}", name, value));
}

// Number of validation windows before wrapping: starts k*T with k*T + T < n.
int64_t n_validation_windows(const std::vector<uint16_t>& val_tokens, int64_t batch_size, int64_t seq_len) {
  check_positive(batch_size, "batch_size");
  check_positive(seq_len, "seq_len");
  const auto n = static_cast<int64_t>(val_tokens.size());
  if (n < seq_len + 2) {
    throw lw_error(
        errc::invalid_config,
        fmt::format("validation set too small: {} tokens < seq_len+2 = {}; use a shorter seq_len, a "
                    "larger val_fraction or a larger corpus",
                    n, seq_len + 2));
  }
  return (n - 1) / seq_len;
}

}  // namespace

window_sampler::window_sampler(std::shared_ptr<const std::vector<uint16_t>> tokens,
                               std::vector<token_span> spans, int64_t worker, int64_t batch_size,
                               int64_t seq_len, uint64_t seed)
    : tokens_(std::move(tokens)),
      worker_(worker),
      batch_size_(batch_size),
      seq_len_(seq_len),
      seed_(seed),
      spans_(std::move(spans)) {
  if (!tokens_) throw lw_error(errc::invalid_config, "window_sampler: no train tokens given");
  check_positive(batch_size, "batch_size");
  check_positive(seq_len, "seq_len");
  if (spans_.empty()) {
    throw lw_error(errc::invalid_config,
                   fmt::format("corpus too small: worker {} has no tokens to read; use fewer workers or a "
                               "larger corpus",
                               worker));
  }
  const int64_t row_len = seq_len + 1;
  const auto n = static_cast<int64_t>(tokens_->size());
  int64_t tokens_in_spans = 0;
  starts_before_.push_back(0);
  for (const auto& s : spans_) {
    if (s.begin < 0 || s.end < s.begin || s.end > n) {
      throw lw_error(errc::invalid_config,
                     fmt::format("worker {}: span [{}, {}) lies outside the {} train tokens", worker, s.begin,
                                 s.end, n));
    }
    tokens_in_spans += s.end - s.begin;
    starts_before_.push_back(starts_before_.back() +
                             static_cast<uint64_t>(std::max<int64_t>(0, s.end - s.begin - row_len + 1)));
  }
  if (starts_before_.back() < 2) {
    // Spans (iid blocks) may hold seq_len+2 tokens in all and still fewer than 2 windows: say what it holds.
    const auto holds =
        spans_.size() <= 1 || tokens_in_spans < seq_len + 2
            ? fmt::format("worker region of {} tokens < seq_len+2 = {}", tokens_in_spans, seq_len + 2)
            : fmt::format(
                  "worker region of {} tokens in {} pieces holds {} window start{} "
                  "of seq_len+1 = {} tokens, and a worker needs 2",
                  tokens_in_spans, spans_.size(), starts_before_.back(),
                  starts_before_.back() == 1 ? "" : "s", row_len);
    throw lw_error(
        errc::invalid_config,
        fmt::format("corpus too small: {}; use fewer workers, shorter seq_len or a larger corpus{}", holds,
                    spans_.size() > 1 ? " (data.partition = contiguous keeps a worker's "
                                        "tokens in one piece)"
                                      : ""));
  }
}

window_sampler::window_sampler(std::shared_ptr<const std::vector<uint16_t>> tokens, int64_t worker,
                               int64_t n_workers, int64_t batch_size, int64_t seq_len, uint64_t seed)
    : window_sampler(tokens,
                     partition_spans(config::data_partition::contiguous,
                                     tokens ? static_cast<int64_t>(tokens->size()) : 0, {}, worker, n_workers,
                                     seq_len + 1),
                     worker, batch_size, seq_len, seed) {}

void window_sampler::next(std::vector<int64_t>& out) {
  const int64_t row_len = seq_len_ + 1;
  out.resize(static_cast<size_t>(batch_size_ * row_len));
  // Window starts are numbered across the spans; start k of span i is spans_[i].begin + k, and every
  // window ends inside its span.
  const uint64_t n_starts = starts_before_.back();
  const uint64_t base =
      splitmix64(splitmix64(splitmix64(seed_) ^ static_cast<uint64_t>(worker_)) ^ position_);
  const uint16_t* src = tokens_->data();
  for (int64_t r = 0; r < batch_size_; ++r) {
    const uint64_t h = splitmix64(base ^ splitmix64(static_cast<uint64_t>(r)));
    const uint64_t k = reduce(h, n_starts);
    const auto i = static_cast<size_t>(std::upper_bound(starts_before_.begin(), starts_before_.end(), k) -
                                       starts_before_.begin() - 1);
    const int64_t start = spans_[i].begin + static_cast<int64_t>(k - starts_before_[i]);
    int64_t* dst = out.data() + r * row_len;
    for (int64_t t = 0; t < row_len; ++t) dst[t] = src[start + t];
  }
  ++position_;
}

std::vector<int64_t> validation_batch(const std::vector<uint16_t>& val_tokens, int64_t batch_index,
                                      int64_t batch_size, int64_t seq_len) {
  const int64_t n_windows = n_validation_windows(val_tokens, batch_size, seq_len);
  if (batch_index < 0) {
    throw lw_error(errc::invalid_config, fmt::format("validation batch index {} is negative", batch_index));
  }
  const int64_t row_len = seq_len + 1;
  std::vector<int64_t> out(static_cast<size_t>(batch_size * row_len));
  for (int64_t r = 0; r < batch_size; ++r) {
    const int64_t k = (batch_index % n_windows * (batch_size % n_windows) + r) % n_windows;
    const uint16_t* src = val_tokens.data() + k * seq_len;
    for (int64_t t = 0; t < row_len; ++t) out[static_cast<size_t>(r * row_len + t)] = src[t];
  }
  return out;
}

int64_t max_validation_batches(const std::vector<uint16_t>& val_tokens, int64_t batch_size, int64_t seq_len) {
  const int64_t n_windows = n_validation_windows(val_tokens, batch_size, seq_len);
  return std::max<int64_t>(1, n_windows / batch_size);
}

}  // namespace longwave::models::data
