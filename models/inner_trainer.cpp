// Inner step: batch -> loss/backward -> clip -> AdamW on the fp32 master -> copy into the model dtype. On the
// CPU this is op for op what it always was (the golden traces); on CUDA the batch goes through two pinned
// buffers ordered by events, clipping stays on the device, and a step's loss is read during the next step.
#include "models/inner_trainer.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <vector>

#include "models/data/window_sampler.hpp"
#include "models/lr_schedule.hpp"
#include "models/torch_compat.hpp"

namespace longwave::models {

namespace {
/// "cuda" is the current GPU, 0: a trainer always knows its device's index.
at::Device device_of(const std::string& name) {
  const at::Device d(name);
  return d.is_cuda() && !d.has_index() ? at::Device(at::kCUDA, 0) : d;
}
}  // namespace

inner_trainer::inner_trainer(const model_spec& spec, const inner_options& opts,
                             std::shared_ptr<const std::vector<uint16_t>> train_tokens,
                             std::vector<data::token_span> spans, int64_t worker, uint64_t seed)
    : spec_(spec),
      opts_(opts),
      device_(device_of(opts.device)),
      model_(spec, opts.bf16 ? at::kBFloat16 : at::kFloat, device_),
      adam_(model_.n_params(), opts.adam, device_),
      // fp32: the master is the model's own flat buffer; bf16: a separate fp32 copy.
      master_(opts.bf16 ? at::zeros({model_.n_params()}, at::dtype(at::kFloat).device(device_))
                        : model_.flat_params()),
      sampler_(std::make_unique<data::window_sampler>(std::move(train_tokens), std::move(spans), worker,
                                                      opts.batch_size, spec.seq_len, seed)) {
  batch_buf_.resize(static_cast<size_t>(opts.batch_size * (spec.seq_len + 1)));
  grad_fp32_ =
      opts.bf16 ? at::zeros({model_.n_params()}, at::dtype(at::kFloat).device(device_)) : model_.flat_grads();
  model_.set_autocast(opts.autocast);
  if (device_.is_cuda()) {
    compute_ = device_stream::compute(device_);
    batch_ = at::empty({opts.batch_size, spec.seq_len + 1}, at::dtype(at::kLong).device(device_));
    for (int i = 0; i < 2; ++i) {
      batch_pinned_[i] =
          at::empty({opts.batch_size, spec.seq_len + 1}, at::dtype(at::kLong).pinned_memory(true));
      loss_[i] = at::empty({}, at::dtype(at::kFloat).pinned_memory(true));
      copied_[i] = std::make_unique<device_event>(device_);
      loss_ready_[i] = std::make_unique<device_event>(device_);
      timer_[i] = std::make_unique<gpu_timer>(device_.index());
    }
  }
  if (device_.is_cuda() || opts.stage_delta) {
    stage_ = std::make_unique<host_stage>(device_, opts.stage_compute, opts.stage_side);
    delta_dev_ = at::empty_like(master_);  // at start-up: a device without room for it fails here
  }
}

inner_trainer::~inner_trainer() = default;

void inner_trainer::set_params(const at::Tensor& theta) {
  if (stage_ && theta.numel() == master_.numel()) {
    // Staged: theta is uploaded once, into delta_dev_, where the round's pseudo-gradient is then made.
    no_grad_guard no_grad;
    stage_->fence(delta_dev_);  // a staged copy has read delta_dev_
    if (delta_dev_.storage().use_count() > 1 || delta_dev_.numel() < master_.numel())
      new_delta_buffer(master_.numel());
    auto on_device = delta_dev_.narrow(0, 0, master_.numel());
    on_device.copy_(theta);
    ++theta_uploads_;
    master_.copy_(on_device);
    theta_in_delta_.emplace(theta.getIntrusivePtr());
    theta_version_ = theta._version();
  } else {
    master_.copy_(theta);
  }
  if (opts_.bf16) model_.load_flat(master_);
}

void inner_trainer::mix(const at::Tensor& theta, const flat_ranges& ranges, double alpha) {
  no_grad_guard no_grad;
  for (const auto& [off, len] : ranges) {
    auto local = master_.narrow(0, off, len);
    auto global = theta.narrow(0, off, len).to(device_);
    if (alpha == 0.0)
      local.copy_(global);  // exactly theta, as set_params
    else
      local.mul_(alpha).add_(global, 1.0 - alpha);
  }
  if (opts_.bf16) model_.load_flat(master_);
}

double inner_trainer::current_lr() const {
  return warmup_cosine_lr(opts_.lr, lr_step_ >= 0 ? lr_step_ : adam_.steps(), opts_.warmup_steps,
                          opts_.total_steps, opts_.min_lr_ratio);
}

int64_t inner_trainer::tokens_per_step() const {
  return opts_.batch_size * spec_.seq_len;
}

void inner_trainer::next_batch() {
  sampler_->next(batch_buf_);
  if (!device_.is_cuda()) {
    batch_ = at::from_blob(batch_buf_.data(), {opts_.batch_size, spec_.seq_len + 1}, at::kLong);
    return;
  }
  // This slot's staging buffer was last read by the copy two steps back: wait until that copy is done. The
  // device buffer needs no wait: the copy is queued behind the kernels of the step before, which read it.
  auto& staged = batch_pinned_[slot_];
  copied_[slot_]->synchronize();
  std::copy(batch_buf_.begin(), batch_buf_.end(), staged.data_ptr<int64_t>());
  batch_.copy_(staged, /*non_blocking=*/true);
  copied_[slot_]->record(*compute_);
}

at::Tensor inner_trainer::forward_backward() {
  next_batch();
  model_.zero_grad();
  at::Tensor l;
  if (opts_.micro_batches <= 1) {
    l = model_.loss(batch_, /*grad=*/true);
  } else {
    // Each part's mean loss scaled by 1/k: the gradients add up to the whole batch's mean-loss gradient.
    const int64_t k = opts_.micro_batches, rows = opts_.batch_size / k;
    const double scale = 1.0 / static_cast<double>(k);
    for (int64_t i = 0; i < k; ++i) {
      auto part = model_.loss(batch_.narrow(0, i * rows, rows), /*grad=*/true, scale);
      l = i == 0 ? part : l + part;
    }
    l = l * scale;
  }
  if (opts_.bf16) grad_fp32_.copy_(model_.flat_grads());
  return l;
}

float inner_trainer::compute_grad() {
  return forward_backward().item<float>();
}

void inner_trainer::apply_update(at::Tensor& g) {
  no_grad_guard no_grad;
  if (opts_.grad_clip > 0 && device_.is_cuda()) {
    // torch's clip_grad_norm_: the coefficient stays on the device (no synchronisation)
    g.mul_((g.norm() + 1e-6).reciprocal_().mul_(opts_.grad_clip).clamp_max_(1.0));
  } else if (opts_.grad_clip > 0) {
    const double norm = g.norm().item<double>();
    const double coef = opts_.grad_clip / (norm + 1e-6);
    if (coef < 1.0) g.mul_(coef);
  }
  if (stage_) fence_moments();
  adam_.step(master_, g, current_lr());
  if (opts_.bf16) model_.load_flat(master_);
}

float inner_trainer::step(int64_t schedule_step) {
  (void)step_async(schedule_step);
  return *take_pending_loss();
}

std::optional<float> inner_trainer::step_async(int64_t schedule_step) {
  const int t = slot_;
  if (timer_[t]) timer_[t]->start();
  auto l = forward_backward();
  lr_step_ = schedule_step;
  apply_update(grad_fp32_);
  lr_step_ = -1;
  if (timer_[t]) timer_[t]->stop();
  if (device_.is_cuda()) {
    loss_[t].copy_(l.detach(), /*non_blocking=*/true);  // to pinned memory, queued behind the step
    loss_ready_[t]->record(*compute_);
  } else {
    loss_[t] = l.detach();
  }
  auto previous = take_pending_loss();  // the step before: on a GPU done, or nearly, while this one runs
  pending_ = t;
  slot_ = 1 - t;
  return previous;
}

std::optional<float> inner_trainer::take_pending_loss() {
  if (pending_ < 0) return std::nullopt;
  const int t = pending_;
  pending_ = -1;
  if (loss_ready_[t]) loss_ready_[t]->synchronize();
  const float loss = loss_[t].item<float>();  // a host tensor: no device synchronisation
  if (timer_[t]) gpu_seconds_ = timer_[t]->seconds();
  return loss;
}

gpu_memory inner_trainer::gpu_memory_now() const {
  return device_.is_cuda() ? memory_of_gpu(device_.index()) : gpu_memory{};
}

at::Tensor inner_trainer::grad() {
  if (!stage_) return grad_fp32_;  // the CPU: the live buffer
  // ddp on a GPU: every step's gradient goes out through the stage (pinned, on the side stream).
  auto staged = stage_->stage(grad_fp32_);
  staged.done->synchronize();
  return std::move(staged.host);
}

at::Tensor inner_trainer::pseudo_gradient(const at::Tensor& theta) {
  return pseudo_gradient(theta, flat_ranges{{0, master_.numel()}});
}

at::Tensor inner_trainer::pseudo_gradient(const at::Tensor& theta, const flat_ranges& ranges) {
  if (!stage_) {  // the CPU, op for op as always
    if (whole(ranges)) return theta - master_;
    std::vector<at::Tensor> slices;
    for (const auto& [off, len] : ranges)
      slices.push_back(theta.narrow(0, off, len) - master_.narrow(0, off, len));
    return at::cat(slices);
  }
  no_grad_guard no_grad;
  stage_->fence(delta_dev_);                         // a staged copy has read delta_dev_
  const int64_t packed = fill_delta(theta, ranges);  // may take a larger buffer
  auto staged = stage_->stage(delta_dev_.narrow(0, 0, packed));
  staged.done->synchronize();
  return std::move(staged.host);
}

at::Tensor inner_trainer::node_delta(const at::Tensor& theta, const flat_ranges& ranges) {
  if (!stage_ || !opts_.device_delta) return pseudo_gradient(theta, ranges);
  no_grad_guard no_grad;
  stage_->fence(delta_dev_);  // a staged copy (the gradient's) has read delta_dev_
  // The node's mean may still read the last round's: never write under a reader. A new buffer of this
  // call's size (a fragment's, not the model's).
  if (delta_dev_.storage().use_count() > 1) new_delta_buffer(range_size(ranges));
  const int64_t packed = fill_delta(theta, ranges);
  if (compute_) {  // done before another thread's stream reads it
    device_event ready(device_);
    ready.record(*compute_);
    ready.synchronize();
  }
  return delta_dev_.narrow(0, 0, packed);
}

int64_t inner_trainer::fill_delta(const at::Tensor& theta, const flat_ranges& ranges) {
  // A pinned theta (the outer optimizer's on a GPU node) uploads without blocking: whatever reads the result
  // comes after it on the device. Each range's theta - master is one fp32 rounding, as on the host.
  const bool pinned = device_.is_cuda() && theta.is_pinned();
  const bool held = holds_theta(theta, ranges);
  theta_in_delta_.reset();  // delta_dev_ is overwritten either way
  if (held) {               // theta is there since set_params: the same op, no upload
    delta_dev_.narrow(0, 0, master_.numel()).sub_(master_);
    return master_.numel();
  }
  if (delta_dev_.numel() < range_size(ranges)) new_delta_buffer(range_size(ranges));
  ++theta_uploads_;
  int64_t packed = 0;
  for (const auto& [off, len] : ranges) {
    auto d = delta_dev_.narrow(0, packed, len);
    d.copy_(theta.narrow(0, off, len), /*non_blocking=*/pinned);
    d.sub_(master_.narrow(0, off, len));
    packed += len;
  }
  return packed;
}

bool inner_trainer::holds_theta(const at::Tensor& theta, const flat_ranges& ranges) const {
  if (!theta_in_delta_ || !whole(ranges)) return false;
  const auto loaded = theta_in_delta_->lock();  // the null singleton once every holder let go
  return loaded.get() == theta.unsafeGetTensorImpl() && theta._version() == theta_version_;
}

bool inner_trainer::whole(const flat_ranges& ranges) const {
  return ranges.size() == 1 && ranges[0].first == 0 && ranges[0].second == master_.numel();
}

void inner_trainer::new_delta_buffer(int64_t n) {
  theta_in_delta_.reset();
  delta_dev_ = at::empty({n}, master_.options());
}

void inner_trainer::apply_grad(const at::Tensor& grad_fp32) {
  grad_fp32_.copy_(grad_fp32);
  apply_update(grad_fp32_);
}

double inner_trainer::evaluate(const at::Tensor& theta, const std::vector<uint16_t>& val_tokens,
                               int64_t n_batches) {
  // fp32: a model over theta itself (no copy; theta does not change while we evaluate), the replica
  // untouched.
  if (!opts_.bf16) {
    gpt over_theta(spec_, theta.to(device_, at::kFloat).contiguous());
    over_theta.set_autocast(opts_.autocast);
    return validation_loss(over_theta, val_tokens, opts_.batch_size, n_batches);
  }
  model_.load_flat(theta);
  const double loss = validation_loss(model_, val_tokens, opts_.batch_size, n_batches);
  model_.load_flat(master_);
  return loss;
}

double validation_loss(gpt& model, const std::vector<uint16_t>& val_tokens, int64_t batch_size,
                       int64_t n_batches, const std::function<void(int64_t)>& after_batch) {
  no_grad_guard no_grad;
  const int64_t seq_len = model.spec().seq_len;
  double sum = 0;
  for (int64_t b = 0; b < n_batches; ++b) {
    auto buf = data::validation_batch(val_tokens, b, batch_size, seq_len);
    auto t = at::from_blob(buf.data(), {batch_size, seq_len + 1}, at::kLong).to(model.device());
    sum += model.loss(t, /*grad=*/false).item<double>();
    if (after_batch) after_batch(b + 1);
  }
  return sum / static_cast<double>(n_batches);
}

at::Tensor inner_trainer::to_host(const at::Tensor& t, bool lend) const {
  if (device_.is_cuda()) return t.to(at::kCPU);
  return lend ? t : t.clone();
}

void inner_trainer::fence_moments() {
  stage_->fence(adam_.exp_avg());
  stage_->fence(adam_.exp_avg_sq());
}

inner_state_copy inner_trainer::staged_state(bool in_flight) const {
  // Through the pseudo-gradient's stage: reused host buffers (pinned on a GPU), one event for the three.
  // A pageable copy of each into fresh memory held a GPU cluster's round boundary about 0.15 s (small).
  // In flight, master (which the next round's load writes at once) leaves as a device clone, freed by
  // the first update (or stage) once its copy is done; the moments are read in place, and their next write
  // waits for their copies (fence_moments).
  inner_state_copy c;
  c.state.master = stage_->stage(in_flight ? master_.clone(at::MemoryFormat::Contiguous) : master_).host;
  c.state.exp_avg = stage_->stage(adam_.exp_avg()).host;
  auto last = stage_->stage(adam_.exp_avg_sq());
  c.state.exp_avg_sq = std::move(last.host);
  c.done = std::move(last.done);
  c.state.adam_steps = adam_.steps();
  c.state.sampler_position = sampler_->position();
  return c;
}

bool inner_trainer::stages_state() const {
  return stage_ && master_.scalar_type() == at::kFloat && adam_.exp_avg().scalar_type() == at::kFloat;
}

inner_state inner_trainer::state(bool lend) const {
  if (stages_state() && (device_.is_cuda() || !lend)) {
    auto c = staged_state(/*in_flight=*/false);  // nothing writes the sources before the wait
    c.wait();
    return std::move(c.state);
  }
  inner_state s;
  s.master = to_host(master_, lend);
  s.exp_avg = to_host(adam_.exp_avg(), lend);
  s.exp_avg_sq = to_host(adam_.exp_avg_sq(), lend);
  s.adam_steps = adam_.steps();
  s.sampler_position = sampler_->position();
  return s;
}

inner_state_copy inner_trainer::state_copy() const {
  if (stages_state()) {
    try {
      return staged_state(/*in_flight=*/true);
    } catch (const c10::OutOfMemoryError&) {
      // master's clone (the first allocation, so nothing is staged yet) did not fit: a copy waited for
    }
  }
  return {state(), nullptr};
}

void inner_trainer::load_state(const inner_state& s) {
  set_params(s.master);
  if (stage_) fence_moments();
  adam_.exp_avg().copy_(s.exp_avg);
  adam_.exp_avg_sq().copy_(s.exp_avg_sq);
  adam_.set_steps(s.adam_steps);
  sampler_->seek(s.sampler_position);
}

}  // namespace longwave::models
