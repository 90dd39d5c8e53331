#pragma once
// Training windows for one worker: random (seed, position)-addressed windows inside the worker's own region
// of the train tokens, resumable exactly by position; plus fixed, consecutive validation windows.
#include <cstdint>
#include <memory>
#include <vector>

#include "models/data/partition.hpp"

namespace longwave::models::data {

/// Draws batches of B windows of T+1 tokens from worker m's spans of the train tokens (partition_spans),
/// each window inside one span, every start equally likely. Batch p depends only on (seed, worker, p), never
/// on earlier calls, so seek(p) resumes a run exactly.
class window_sampler {
 public:
  /// Worker m of M reads the spans `spans`. Throws lw_error(invalid_config) on non-positive sizes, null
  /// tokens, a span outside the tokens, or spans with room for fewer than two window starts ("corpus too
  /// small: ...").
  window_sampler(std::shared_ptr<const std::vector<uint16_t>> tokens, std::vector<token_span> spans,
                 int64_t worker, int64_t batch_size, int64_t seq_len, uint64_t seed);
  /// The contiguous partition: worker m of M reads [m*N/M, (m+1)*N/M).
  window_sampler(std::shared_ptr<const std::vector<uint16_t>> tokens, int64_t worker, int64_t n_workers,
                 int64_t batch_size, int64_t seq_len, uint64_t seed);

  /// Fills `out` with batch_size * (seq_len + 1) tokens, row-major (B rows of T+1), then advances position.
  /// Row r's inputs are out[r*(T+1) .. r*(T+1)+T-1] and its targets are shifted by one.
  void next(std::vector<int64_t>& out);

  /// Number of batches drawn since position 0: the index of the batch next() returns.
  uint64_t position() const { return position_; }
  /// Makes the next batch the one a fresh sampler returns after `pos` calls to next().
  void seek(uint64_t pos) { position_ = pos; }

  /// The spans this worker reads.
  const std::vector<token_span>& spans() const { return spans_; }
  /// First token index of this worker's first span (its region, for the contiguous partition).
  int64_t region_begin() const { return spans_.front().begin; }
  /// One past the last token index of its last span.
  int64_t region_end() const { return spans_.back().end; }

 private:
  std::shared_ptr<const std::vector<uint16_t>> tokens_;
  int64_t worker_;
  int64_t batch_size_;
  int64_t seq_len_;
  uint64_t seed_;
  std::vector<token_span> spans_;
  std::vector<uint64_t> starts_before_;  ///< window starts in the spans before span i; back(): all of them
  uint64_t position_ = 0;
};

/// Validation batch `batch_index`: B windows of T+1 tokens, window k (= batch_index*B + row) starting at
/// token k*T, so inputs never overlap and every token after the first is a target exactly once per pass.
/// Windows wrap around to the start when the set is short. Throws lw_error(invalid_config) if val has <
/// seq_len+2 tokens.
std::vector<int64_t> validation_batch(const std::vector<uint16_t>& val_tokens, int64_t batch_index,
                                      int64_t batch_size, int64_t seq_len);

/// Batches validation_batch() yields before repeating a window (at least 1). Same errors as
/// validation_batch().
int64_t max_validation_batches(const std::vector<uint16_t>& val_tokens, int64_t batch_size, int64_t seq_len);

}  // namespace longwave::models::data
