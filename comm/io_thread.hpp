#pragma once
// The single thread a transport does all its I/O on: a job queue that other threads feed and wait on with a
// std::future, and open/close hooks that run on that thread (a socket lives and dies on one thread).
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>

namespace longwave::comm {

class io_thread {
 public:
  io_thread() = default;
  ~io_thread() { stop(); }
  io_thread(const io_thread&) = delete;
  io_thread& operator=(const io_thread&) = delete;

  /// Starts the thread and runs open there. If open throws, close runs there too, the thread ends, and
  /// start throws lw_error(errc::io_error) with what(open's message). close runs on the thread at stop().
  void start(std::function<void()> open, std::function<void()> close,
             const std::function<std::string(const char*)>& what);
  /// Lets queued jobs run (they see stopping()), runs close, joins. Idempotent; any thread but this one.
  void stop();

  std::future<void> submit(std::function<void()> fn);
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  bool on_thread() const { return std::this_thread::get_id() == id_; }

 private:
  void run(std::promise<std::string>& started, const std::function<std::string(const char*)>& what);

  std::function<void()> open_;
  std::function<void()> close_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> jobs_;  // guarded by mu_
  bool stop_requested_ = false;                  // guarded by mu_
  std::atomic<bool> stopping_{false};
  std::thread::id id_;
  std::thread thread_;
};

}  // namespace longwave::comm
