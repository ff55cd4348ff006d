#ifndef KILN_COMMON_THREAD_POOL_H_
#define KILN_COMMON_THREAD_POOL_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

// A fixed set of threads running tasks in FIFO order, interactive tasks before
// background ones. The destructor runs every task already queued, then joins,
// so no accepted work is dropped at shutdown.
class ThreadPool {
 public:
  // kLoweredCpu: the threads run at a lowered CPU priority (platform::LowerCurrentThreadPriority).
  enum CpuPriority { kNormalCpu, kLoweredCpu };

  explicit ThreadPool(int threads, CpuPriority cpu = kNormalCpu);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  enum Priority { kInteractive, kBackground };

  void Schedule(std::function<void()> task, Priority priority = kInteractive);

 private:
  void WorkLoop(CpuPriority cpu);

  std::mutex mutex_;
  std::condition_variable wakeup_;
  std::deque<std::function<void()>> interactive_;  // guarded by mutex_
  std::deque<std::function<void()>> background_;   // guarded by mutex_
  bool stopping_ = false;                    // guarded by mutex_
  std::vector<std::thread> threads_;
};

}  // namespace kiln

#endif  // KILN_COMMON_THREAD_POOL_H_
