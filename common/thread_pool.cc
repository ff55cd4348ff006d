#include "common/thread_pool.h"

#include <utility>

#include "common/platform.h"

namespace kiln {

ThreadPool::ThreadPool(int threads, CpuPriority cpu) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this, cpu] { WorkLoop(cpu); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wakeup_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void ThreadPool::Schedule(std::function<void()> task, Priority priority) {
  {
    std::lock_guard lock(mutex_);
    (priority == kInteractive ? interactive_ : background_).push_back(std::move(task));
  }
  wakeup_.notify_one();
}

void ThreadPool::WorkLoop(CpuPriority cpu) {
  if (cpu == kLoweredCpu) platform::LowerCurrentThreadPriority();
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      wakeup_.wait(lock,
                   [this] { return stopping_ || !interactive_.empty() || !background_.empty(); });
      auto& queue = !interactive_.empty() ? interactive_ : background_;
      if (queue.empty()) return;  // stopping, and everything queued has run
      task = std::move(queue.front());
      queue.pop_front();
    }
    task();
  }
}

}  // namespace kiln
