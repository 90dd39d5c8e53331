#pragma once
// Copies of a device's fp32 tensors into reusable host buffers (pinned for a GPU), made on a side stream so
// that the compute stream goes on meanwhile (issue 38's overlap). Events order each copy after the work that
// wrote its source, a reader after the copy, and the source's next write after the copy.
#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "models/device_stream.hpp"
#include "models/gpu_info.hpp"

namespace longwave::models {

class host_stage {
 public:
  /// compute: the stream that writes the sources (default: the device's compute stream); side: the stream
  /// the copies run on (default: a new one).
  explicit host_stage(const c10::Device& device, std::shared_ptr<device_stream> compute = nullptr,
                      std::shared_ptr<device_stream> side = nullptr);
  ~host_stage();
  host_stage(const host_stage&) = delete;
  host_stage& operator=(const host_stage&) = delete;

  struct staged {
    at::Tensor host;                     ///< the copy, shaped as the source; read it after done
    std::shared_ptr<device_event> done;  ///< the copy is complete
  };

  /// Queues a copy of `src` (a contiguous fp32 tensor of the device, as the compute stream will have written
  /// it by now) into a free host buffer. A buffer is free once nobody holds a tensor on it (views included)
  /// and its copy is done: a reader keeps the tensor for as long as it reads it. The stage keeps src alive
  /// until the copy is done; the compute stream must not write src again before fence(src).
  staged stage(const at::Tensor& src);
  /// The compute stream's later work waits for the copies in flight whose source shares `written`'s
  /// storage: a copy of another source (a state's, copied while the next round runs) holds nothing.
  void fence(const at::Tensor& written);
  /// Lets go of the sources whose copies are done (stage() does so too): a caller that waited for its copy
  /// frees the source's device memory now, not at the next stage().
  void release_sources();

  /// Times every later copy on the device (CUDA events around it on the side stream, for benches);
  /// last_copy_seconds() waits for the last one's and returns it, -1 without a GPU or timing.
  void time_copies();
  double last_copy_seconds();

  /// Host buffers this stage holds (free or held).
  size_t buffers() const { return pool_.size(); }
  device_stream& side() { return *side_; }
  device_stream& compute() { return *compute_; }

 private:
  struct buffer {
    at::Tensor host;                     // 1-D fp32; pinned for a GPU
    at::Tensor source;                   // kept alive until the copy is done
    std::shared_ptr<device_event> done;  // its last copy
  };
  /// A free buffer of at least n values, or a new one.
  buffer& free_buffer(int64_t n);

  c10::Device device_;
  std::shared_ptr<device_stream> compute_, side_;
  device_event written_;  // marks the compute stream's work that a copy waits for
  std::vector<buffer> pool_;
  // Buffers and sources whose copy may be queued with no event marking its end: never let go of.
  std::vector<at::Tensor> lost_;
  std::unique_ptr<gpu_timer> timer_;  // time_copies()
};

}  // namespace longwave::models
