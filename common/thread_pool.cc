#include "common/thread_pool.h"

#include <utility>

#include "common/platform.h"

namespace kiln {

ThreadPool::ThreadPool(int threads, CpuPriority cpu) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this, cpu] { WorkLoop(cpu); });
}

ThreadPool::ThreadPool(GrowWithDemand) : grows_with_demand_(true) {}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wakeup_.notify_all();
  // One at a time under the lock: a task still running may start a thread.
  while (true) {
    std::thread thread;
    {
      std::lock_guard lock(mutex_);
      if (threads_.empty()) break;
      thread = std::move(threads_.back());
      threads_.pop_back();
    }
    thread.join();
  }
}

void ThreadPool::Schedule(std::function<void()> task, Priority priority) {
  {
    std::lock_guard lock(mutex_);
    (priority == kInteractive ? interactive_ : background_).push_back(std::move(task));
    if (grows_with_demand_ && idle_threads_ < static_cast<int>(interactive_.size() + background_.size())) {
      threads_.emplace_back([this] { WorkLoop(kNormalCpu); });
      return;
    }
  }
  wakeup_.notify_one();
}

void ThreadPool::WorkLoop(CpuPriority cpu) {
  if (cpu == kLoweredCpu) platform::LowerCurrentThreadPriority();
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      ++idle_threads_;
      wakeup_.wait(lock,
                   [this] { return stopping_ || !interactive_.empty() || !background_.empty(); });
      --idle_threads_;
      auto& queue = !interactive_.empty() ? interactive_ : background_;
      if (queue.empty()) return;  // stopping, and everything queued has run
      task = std::move(queue.front());
      queue.pop_front();
    }
    task();
  }
}

}  // namespace kiln
