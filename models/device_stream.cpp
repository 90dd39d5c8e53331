// CPU streams are the calling thread or a host thread with a queue; CUDA streams and events go through c10's
// CUDA layer, compiled only in the cuda build (LONGWAVE_CUDA_BUILD).
#include "models/device_stream.hpp"

#ifdef LONGWAVE_CUDA_BUILD
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace longwave::models {

namespace stream_detail {

/// A CPU event's marker: set by its stream once the work queued before it ran, with that work's error.
struct cpu_mark {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  void set(std::exception_ptr e) {
    {
      const std::lock_guard<std::mutex> lock(mu);
      done = true;
      error = std::move(e);
    }
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [this] { return done; });
    if (error) std::rethrow_exception(error);
  }
  bool is_done() {
    const std::lock_guard<std::mutex> lock(mu);
    return done;
  }
};

}  // namespace stream_detail

namespace {

using stream_detail::cpu_mark;

/// Counts a wait on an event while it lasts (waiting()).
struct counted_wait {
  std::atomic<int>& n;
  explicit counted_wait(std::atomic<int>& c) : n(c) { ++n; }
  ~counted_wait() { --n; }
  counted_wait(const counted_wait&) = delete;
  counted_wait& operator=(const counted_wait&) = delete;
};

class cpu_inline_stream final : public device_stream {
 public:
  explicit cpu_inline_stream(const c10::Device& d) : device_stream(d) {}
  void run(std::function<void()> work) override { work(); }
  bool waiting() const override { return waiting_.load() > 0; }
  /// block(): the calling thread waits for `m`, as the inline work it stands for would.
  void wait_for(const std::shared_ptr<cpu_mark>& m) {
    const counted_wait in_wait(waiting_);
    m->wait();
  }

 private:
  std::atomic<int> waiting_{0};
};

/// One host thread running its queue in order. The first error is kept: later work is skipped, and every
/// later marker carries the error, so whoever waits for the stream's results sees it.
class cpu_thread_stream final : public device_stream {
 public:
  explicit cpu_thread_stream(const c10::Device& d) : device_stream(d), thread_([this] { loop(); }) {}
  ~cpu_thread_stream() override {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void run(std::function<void()> work) override {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      if (error_) std::rethrow_exception(error_);
    }
    push({std::move(work), nullptr});
  }
  bool waiting() const override { return waiting_.load() > 0; }

  /// Queues setting `m` once the work before it ran.
  void mark(std::shared_ptr<cpu_mark> m) { push({nullptr, std::move(m)}); }
  /// Queues a wait for `m`.
  void wait_for(std::shared_ptr<cpu_mark> m) {
    run([this, m = std::move(m)] {
      const counted_wait in_wait(waiting_);
      m->wait();
    });
  }

 private:
  struct item {
    std::function<void()> work;
    std::shared_ptr<cpu_mark> mark;  // set: a marker
  };

  void push(item it) {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(it));
    }
    cv_.notify_all();
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and the queue has run
      auto it = std::move(queue_.front());
      queue_.pop_front();
      const std::exception_ptr failed = error_;
      lock.unlock();
      std::exception_ptr e;
      if (it.mark) {
        it.mark->set(failed);
      } else if (!failed) {
        try {
          it.work();
        } catch (...) {
          e = std::current_exception();
        }
      }
      it = item{};  // what the work held goes before the next waits
      lock.lock();
      if (e && !error_) error_ = e;
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<item> queue_;
  bool stop_ = false;
  std::exception_ptr error_;  // the first error of this stream's work
  std::atomic<int> waiting_{0};
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace

#ifdef LONGWAVE_CUDA_BUILD

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// The calling thread's current stream (compute), or a stream of c10's pool (side).
class cuda_stream final : public device_stream {
 public:
  cuda_stream(const c10::Device& d, bool side) : device_stream(d) {
    if (side) stream_.emplace(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d.index()));
  }
  void run(std::function<void()> work) override {
    if (!stream_) return work();
    const c10::cuda::CUDAStreamGuard on(*stream_);
    work();
  }
  cudaStream_t handle() const {
    return stream_ ? stream_->stream() : c10::cuda::getCurrentCUDAStream(device().index()).stream();
  }

 private:
  std::optional<c10::cuda::CUDAStream> stream_;
};

}  // namespace

#endif

struct device_event::impl {
  c10::Device device;
  std::shared_ptr<stream_detail::cpu_mark> mark;  // CPU: the last record()'s marker (null: none yet)
#ifdef LONGWAVE_CUDA_BUILD
  cudaEvent_t event = nullptr;
  bool recorded = false;
#endif
  explicit impl(const c10::Device& d) : device(d) {}
};

std::shared_ptr<device_stream> device_stream::compute(const c10::Device& device) {
#ifdef LONGWAVE_CUDA_BUILD
  if (device.is_cuda()) return std::make_shared<cuda_stream>(device, false);
#endif
  if (!device.is_cpu()) throw std::invalid_argument("no stream for device " + device.str());
  return std::make_shared<cpu_inline_stream>(device);
}

std::shared_ptr<device_stream> device_stream::side(const c10::Device& device) {
#ifdef LONGWAVE_CUDA_BUILD
  if (device.is_cuda()) return std::make_shared<cuda_stream>(device, true);
#endif
  if (!device.is_cpu()) throw std::invalid_argument("no stream for device " + device.str());
  return std::make_shared<cpu_thread_stream>(device);
}

device_event::device_event(const c10::Device& device) : impl_(std::make_unique<impl>(device)) {
#ifdef LONGWAVE_CUDA_BUILD
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard on(device.index());  // an event belongs to one device
    check_cuda(cudaEventCreateWithFlags(&impl_->event, cudaEventDisableTiming), "cudaEventCreate");
  }
#endif
}

device_event::~device_event() {
#ifdef LONGWAVE_CUDA_BUILD
  if (impl_->event) cudaEventDestroy(impl_->event);
#endif
}

void device_event::record(device_stream& stream) {
#ifdef LONGWAVE_CUDA_BUILD
  if (impl_->event) {
    if (stream.device() != impl_->device)
      throw std::invalid_argument("device_event: an event of " + impl_->device.str() + " recorded on " +
                                  stream.device().str());
    // A compute stream's handle is null, the current device's default stream: that device must be the
    // event's (a thread's current device is 0 between ATen's ops on another).
    const c10::cuda::CUDAGuard on(impl_->device.index());
    check_cuda(cudaEventRecord(impl_->event, dynamic_cast<cuda_stream&>(stream).handle()), "cudaEventRecord");
    impl_->recorded = true;
    return;
  }
#endif
  auto m = std::make_shared<cpu_mark>();
  if (auto* t = dynamic_cast<cpu_thread_stream*>(&stream))
    t->mark(m);
  else
    m->set(nullptr);  // inline: the work before it has run
  impl_->mark = std::move(m);
}

void device_event::block(device_stream& stream) {
#ifdef LONGWAVE_CUDA_BUILD
  if (impl_->event) {
    if (impl_->recorded) {
      const c10::cuda::CUDAGuard on(stream.device().index());  // the null handle: this stream's device
      check_cuda(cudaStreamWaitEvent(dynamic_cast<cuda_stream&>(stream).handle(), impl_->event, 0),
                 "cudaStreamWaitEvent");
    }
    return;
  }
#endif
  if (!impl_->mark) return;
  if (auto* t = dynamic_cast<cpu_thread_stream*>(&stream))
    t->wait_for(impl_->mark);
  else if (auto* in = dynamic_cast<cpu_inline_stream*>(&stream))
    in->wait_for(impl_->mark);
  else
    impl_->mark->wait();
}

void device_event::synchronize() {
#ifdef LONGWAVE_CUDA_BUILD
  if (impl_->event) {
    if (impl_->recorded) check_cuda(cudaEventSynchronize(impl_->event), "cudaEventSynchronize");
    return;
  }
#endif
  if (impl_->mark) impl_->mark->wait();
}

bool device_event::query() const {
#ifdef LONGWAVE_CUDA_BUILD
  if (impl_->event) {
    if (!impl_->recorded) return true;
    const cudaError_t e = cudaEventQuery(impl_->event);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) check_cuda(e, "cudaEventQuery");
    (void)cudaGetLastError();  // "not ready" would otherwise fail the next kernel launch's check
    return false;
  }
#endif
  return !impl_->mark || impl_->mark->is_done();
}

}  // namespace longwave::models
