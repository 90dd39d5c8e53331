#pragma once
// Device-generic streams and events, so that overlapping a round's copies with the inner steps (issue 38)
// is one piece of logic on every device: on a GPU a CUDA stream and event; on the CPU the calling thread (the
// compute stream: its work runs inline) or a host thread that runs its queue in order (a side stream), and a
// marker in that queue. The tests drive the CPU kind; a GPU node runs the same calls.
#include <c10/core/Device.h>

#include <functional>
#include <memory>

namespace longwave::models {

/// An in-order queue of one device's work.
class device_stream {
 public:
  virtual ~device_stream() = default;
  device_stream(const device_stream&) = delete;
  device_stream& operator=(const device_stream&) = delete;

  /// The compute stream of `device`: on CUDA c10's current stream of the calling thread (read at each call),
  /// on the CPU inline (work runs at once, on the caller's thread).
  static std::shared_ptr<device_stream> compute(const c10::Device& device);
  /// A new stream beside the compute stream: on CUDA a non-blocking stream from c10's pool, on the CPU one
  /// host thread (joined when the stream goes, after its queue).
  static std::shared_ptr<device_stream> side(const c10::Device& device);

  /// Queues `work` after this stream's earlier work. CUDA: runs it now with this stream current, so the
  /// kernels and copies it issues go to this stream. CPU inline: runs it now. CPU side: runs it on the
  /// thread. An exception from work on a side thread is kept and rethrown by the next run() or wait on that
  /// stream.
  virtual void run(std::function<void()> work) = 0;
  /// A CPU stream: whether its thread (inline: a thread that queued work on it) is blocked on an event now
  /// (tests use it to know a fence holds).
  virtual bool waiting() const { return false; }
  const c10::Device& device() const { return device_; }

 protected:
  explicit device_stream(const c10::Device& device) : device_(device) {}

 private:
  c10::Device device_;
};

/// A marker in a stream: done once the work queued on that stream before record() is. Before any record()
/// it is done.
class device_event {
 public:
  explicit device_event(const c10::Device& device);
  ~device_event();
  device_event(const device_event&) = delete;
  device_event& operator=(const device_event&) = delete;

  /// Marks the work queued on `stream` so far (no host wait).
  void record(device_stream& stream);
  /// `stream`'s later work waits for the marked work (CUDA: cudaStreamWaitEvent, no host wait; CPU inline:
  /// the host waits; CPU side: the stream's thread waits).
  void block(device_stream& stream);
  /// The host waits for the marked work.
  void synchronize();
  /// Whether the marked work is done (no wait).
  bool query() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace longwave::models
