// A transport's I/O thread: jobs queued under a mutex run one at a time; open and close run on the thread.
#include "comm/io_thread.hpp"

#include "runtime/errors/errors.hpp"

namespace longwave::comm {

void io_thread::start(std::function<void()> open, std::function<void()> close,
                      const std::function<std::string(const char*)>& what) {
  open_ = std::move(open);
  close_ = std::move(close);
  // The thread reports its start-up as a message, not an exception object shared across threads.
  std::promise<std::string> started;
  auto ready = started.get_future();
  thread_ = std::thread([this, &started, &what] { run(started, what); });
  const std::string error = ready.get();
  if (!error.empty()) {
    thread_.join();
    stopping_.store(true, std::memory_order_release);
    throw lw_error(errc::io_error, error);
  }
}

void io_thread::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_requested_ = true;
  }
  stopping_.store(true, std::memory_order_release);
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::future<void> io_thread::submit(std::function<void()> fn) {
  std::packaged_task<void()> task(std::move(fn));
  auto fut = task.get_future();
  {
    std::lock_guard<std::mutex> lk(mu_);
    LW_ASSERT(!stop_requested_, "io_thread::submit after shutdown began");
    jobs_.push_back(std::move(task));
  }
  cv_.notify_one();
  return fut;
}

void io_thread::run(std::promise<std::string>& started, const std::function<std::string(const char*)>& what) {
  id_ = std::this_thread::get_id();
  try {
    open_();
  } catch (const std::exception& e) {  // zmq::error_t, lw_error, std::bad_alloc
    close_();
    started.set_value(what(e.what()));
    return;
  }
  started.set_value({});  // `started` and `what` live on start()'s stack: not touched after this
  for (;;) {
    std::packaged_task<void()> job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_requested_ || !jobs_.empty(); });
      if (jobs_.empty()) break;  // stop requested and nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();  // exceptions land in the job's future; jobs queued at shutdown see stopping() and end quickly
  }
  close_();
}

}  // namespace longwave::comm
