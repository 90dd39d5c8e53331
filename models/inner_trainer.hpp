#pragma once
// One replica's inner loop: model, flat AdamW, fp32 master weights, the worker's data stream and the
// learning-rate schedule. Used by the worker actor, the plain-loop benchmark and the tests.
#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/adamw.hpp"
#include "models/data/partition.hpp"
#include "models/gpt.hpp"
#include "models/gpu_info.hpp"
#include "models/host_stage.hpp"
#include "models/model_spec.hpp"

namespace longwave::models::data {
class window_sampler;
}

namespace longwave::models {

/// Settings of the inner loop.
struct inner_options {
  int64_t batch_size = 8;
  double lr = 4e-3;
  int64_t warmup_steps = 50;
  int64_t total_steps = 1000;  ///< schedule length in inner steps
  double min_lr_ratio = 0.1;
  double grad_clip = 1.0;  ///< 0 disables
  adamw_options adam;
  bool bf16 = false;
  std::string device = "cpu";  ///< "cpu" or "cuda:N" (models::device_plan)
  bool autocast = false;       ///< bf16 autocast of the forward pass (CUDA only)
  int64_t micro_batches =
      1;  ///< the batch's rows in this many equal parts, gradients added (divides batch_size)
  /// The pseudo-gradient goes out through host_stage (a device buffer, a side stream, a reusable host
  /// buffer): always on CUDA; on the CPU only when set (tests run the GPU's logic so).
  bool stage_delta = false;
  /// Staged: node_delta leaves the pseudo-gradient on the device, where the node's mean of its workers is
  /// taken before one copy leaves it (the communicator's stage_mean).
  bool device_delta = false;
  /// Tests: the stage's compute and side streams (null: the device's compute stream, a new side stream),
  /// which a test holds (test::gate) or asks whether a fence holds the trainer, where it cannot reach it.
  std::shared_ptr<device_stream> stage_compute, stage_side;
};

/// The resumable state of one replica (all tensors fp32 on the host, owned by the caller of `state()`).
struct inner_state {
  at::Tensor master, exp_avg, exp_avg_sq;
  int64_t adam_steps = 0;
  uint64_t sampler_position = 0;
};

/// A state whose host copies may still be in flight (inner_trainer::state_copy): its tensors hold the
/// values once ready() or after wait().
struct inner_state_copy {
  inner_state state;
  std::shared_ptr<device_event> done;  ///< the last of its copies (one side stream: in order); null: none
  bool ready() const { return !done || done->query(); }
  /// The host waits for the copies; a device error of theirs is thrown here.
  void wait() const {
    if (done) done->synchronize();
  }
};

/// Mean loss of `model` on the first n_batches validation batches (batch_size sequences of the model's
/// length), computed on the model's device. after_batch(done), if given, follows each batch (progress).
double validation_loss(gpt& model, const std::vector<uint16_t>& val_tokens, int64_t batch_size,
                       int64_t n_batches, const std::function<void(int64_t)>& after_batch = nullptr);

/// One worker's replica and inner optimizer, on its device (options.device). What goes in and out (theta, the
/// pseudo-gradient, DDP's gradient, the state) is fp32 on the host: the rest of Longwave never sees a device
/// tensor. On CUDA step_async queues a step's work and reads the loss of the step before it, so the host
/// never waits for the step it has just queued and the device always has the next one.
class inner_trainer {
 public:
  /// Worker `worker` (its global rank) reads the windows of `spans` (data::partition_spans).
  inner_trainer(const model_spec& spec, const inner_options& opts,
                std::shared_ptr<const std::vector<uint16_t>> train_tokens,
                std::vector<data::token_span> spans, int64_t worker, uint64_t seed);
  ~inner_trainer();

  /// Sets master and model weights to theta (fp32 flat).
  void set_params(const at::Tensor& theta);
  /// On the ranges only: master <- (1 - alpha) * theta + alpha * master (and the model weights follow).
  void mix(const at::Tensor& theta, const flat_ranges& ranges, double alpha);
  /// One AdamW step on the next batch; returns its training loss (waits for it). schedule_step: where the
  /// learning-rate schedule stands for it (diloco.adaptive_steps; -1: the steps done so far). Not to be
  /// mixed with step_async while a loss is pending.
  float step(int64_t schedule_step = -1);
  /// Queues one AdamW step and returns the loss of the step queued before it, if one is pending (on a GPU
  /// read once that step is done, while this one runs). The last loss: take_pending_loss().
  std::optional<float> step_async(int64_t schedule_step = -1);
  /// The loss of the last queued step, waiting for it; nullopt when none is pending.
  std::optional<float> take_pending_loss();
  /// On a GPU: the device time of the step whose loss was read last (CUDA events), its memory figures;
  /// -1 / zeros on the CPU.
  double last_gpu_seconds() const { return gpu_seconds_; }
  gpu_memory gpu_memory_now() const;
  /// DDP: forward and backward on the next batch; the fp32 gradient is then in grad().
  float compute_grad();
  /// The fp32 gradient on the host (on the CPU the live buffer: read-only until the next apply_grad;
  /// staged: a host buffer of the stage, as pseudo_gradient's).
  at::Tensor grad();
  /// theta - master, fp32 on the host: the round's pseudo-gradient. Staged (CUDA, or stage_delta): computed
  /// on the device and copied on a side stream into a reusable host buffer (pinned on CUDA), which stays
  /// this caller's until it drops the tensor; the host waits for that copy only.
  at::Tensor pseudo_gradient(const at::Tensor& theta);
  /// The pseudo-gradient on `ranges` only, their values concatenated in range order (a streaming
  /// fragment's): only they are computed and, staged, copied.
  at::Tensor pseudo_gradient(const at::Tensor& theta, const flat_ranges& ranges);
  /// The pseudo-gradient as the node's mean takes it: with device_delta (staged) theta - master on `ranges`,
  /// packed, in a device buffer that this trainer writes again only once nobody holds a tensor on it, its
  /// computation done; otherwise pseudo_gradient's host tensor. The worker replies at once: no copy waits.
  at::Tensor node_delta(const at::Tensor& theta, const flat_ranges& ranges);
  /// Copies of a theta onto the device so far (staged: set_params' one a round; the pseudo-gradient of a
  /// round whose theta set_params loaded uploads none).
  size_t theta_uploads() const { return theta_uploads_; }
  /// Host buffers the pseudo-gradient's stage holds (0: not staged).
  size_t staged_buffers() const { return stage_ ? stage_->buffers() : 0; }
  /// DDP: clip and apply an (averaged) fp32 gradient.
  void apply_grad(const at::Tensor& grad_fp32);
  /// Mean validation loss of theta over n_batches fixed windows; the replica's own weights are restored.
  double evaluate(const at::Tensor& theta, const std::vector<uint16_t>& val_tokens, int64_t n_batches);

  /// The fp32 master weights, on the replica's device.
  at::Tensor& master() { return master_; }
  const at::Device& device() const { return device_; }
  int64_t steps_done() const { return adam_.steps(); }
  double current_lr() const;
  int64_t tokens_per_step() const;
  /// A deep copy; lend: the live buffers instead, which the caller must keep from changing (no step, load
  /// or mix) until every holder has let go of them.
  inner_state state(bool lend = false) const;
  /// A deep copy that the caller need not wait for. Staged, it leaves through the stage's side stream while
  /// the next steps are queued: master as a device clone (the model's fp32 size, freed by the first update
  /// once its copy is done), the Adam moments in place, their next write (a step's update, a load) waiting
  /// for their copies. Otherwise (or when the clone does not fit) state()'s copy, ready at once.
  inner_state_copy state_copy() const;
  /// The stage's side stream (null: not staged); tests hold it to keep a copy in flight.
  device_stream* copy_stream() const { return stage_ ? &stage_->side() : nullptr; }
  /// The compute stream (null: not staged); tests ask it whether a fence holds the trainer.
  device_stream* compute_stream() const { return stage_ ? &stage_->compute() : nullptr; }
  void load_state(const inner_state& s);
  gpt& model() { return model_; }

 private:
  void next_batch();
  /// Forward and backward on the next batch: the loss, not yet read (no synchronisation).
  at::Tensor forward_backward();
  void apply_update(at::Tensor& grad_fp32);
  /// delta_dev_'s first values (a larger buffer when it is too small): theta - master on `ranges`, packed,
  /// queued on the compute stream; their count.
  int64_t fill_delta(const at::Tensor& theta, const flat_ranges& ranges);
  /// delta_dev_ holds theta's upload by set_params (the same tensor, unchanged since) and ranges are all of
  /// it.
  bool holds_theta(const at::Tensor& theta, const flat_ranges& ranges) const;
  /// ranges are the whole flat buffer, as one range.
  bool whole(const flat_ranges& ranges) const;
  /// A new delta_dev_ of n values (it no longer holds set_params' theta).
  void new_delta_buffer(int64_t n);
  /// A host copy (a device tensor), or the tensor itself or its clone (on the CPU).
  at::Tensor to_host(const at::Tensor& t, bool lend) const;
  /// The state through the stage, not waited for: master and both moments (in_flight: master cloned, so
  /// the steps may go on before the copy is done; the moments' next write calls fence_moments).
  inner_state_copy staged_state(bool in_flight) const;
  /// The compute stream's next write of the Adam moments waits for their copies in flight.
  void fence_moments();
  /// The state goes through the stage (staged, and fp32).
  bool stages_state() const;

  model_spec spec_;
  inner_options opts_;
  at::Device device_;
  gpt model_;
  adamw adam_;
  int64_t lr_step_ = -1;  // the schedule step of the step() in progress (-1: adam_.steps())
  at::Tensor master_, grad_fp32_, batch_;
  std::vector<int64_t> batch_buf_;
  // Two of each, alternating by step: a step's batch is staged while the step before may still read the
  // other buffer, and its loss and timer are read one step later.
  int slot_ = 0;                                             // this step's
  int pending_ = -1;                                         // the slot whose loss is unread (-1: none)
  std::array<at::Tensor, 2> loss_;                           // the loss (CPU), or its pinned host copy (CUDA)
  std::array<at::Tensor, 2> batch_pinned_;                   // CUDA: staging buffers in pinned host memory
  std::shared_ptr<device_stream> compute_;                   // CUDA: the stream the steps run on
  std::array<std::unique_ptr<device_event>, 2> copied_;      // CUDA: a staging buffer's copy is done
  std::array<std::unique_ptr<device_event>, 2> loss_ready_;  // CUDA: the loss's host copy is done
  std::array<std::unique_ptr<gpu_timer>, 2> timer_;          // CUDA: the step's device time
  double gpu_seconds_ = -1;
  std::unique_ptr<host_stage> stage_;  // the pseudo-gradient's way out (CUDA, or stage_delta)
  at::Tensor delta_dev_;  // theta - master on the device; read by the stage's last copy, or the node's mean
  // Staged: the theta that set_params left in delta_dev_ (weak: its holders alone keep it) and its version,
  // so the round's pseudo-gradient subtracts on the device without uploading theta again.
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> theta_in_delta_;
  int64_t theta_version_ = 0;
  size_t theta_uploads_ = 0;
  std::unique_ptr<data::window_sampler> sampler_;
};

}  // namespace longwave::models
