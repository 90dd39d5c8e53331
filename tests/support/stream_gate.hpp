#pragma once
// A gate that holds a CPU side stream's thread (models::device_stream) until opened: a test keeps a copy in
// flight while the compute stream goes on.
#include <condition_variable>
#include <mutex>

#include "models/device_stream.hpp"

namespace longwave::test {

/// Holds a CPU side stream's thread until opened.
class gate {
 public:
  void hold(models::device_stream& s) {
    s.run([this] {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return open_; });
    });
  }
  void open() {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

}  // namespace longwave::test
