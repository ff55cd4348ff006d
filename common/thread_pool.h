#ifndef KILN_COMMON_THREAD_POOL_H_
#define KILN_COMMON_THREAD_POOL_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

// Threads running tasks in FIFO order, interactive tasks before background
// ones. The destructor runs every task already queued, then joins, so no
// accepted work is dropped at shutdown.
class ThreadPool {
 public:
  // kLoweredCpu: the threads run at a lowered CPU priority (platform::LowerCurrentThreadPriority).
  enum CpuPriority { kNormalCpu, kLoweredCpu };

  // A fixed set of `threads`.
  explicit ThreadPool(int threads, CpuPriority cpu = kNormalCpu);
  // No thread at first: a task scheduled while none is idle starts one, so
  // every task starts at once. A thread, once started, stays until the pool
  // is destroyed; for tasks whose threads must outlive them (see
  // client/cpp/client.cc).
  struct GrowWithDemand {};
  explicit ThreadPool(GrowWithDemand);
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
  const bool grows_with_demand_ = false;
  int idle_threads_ = 0;  // guarded by mutex_
  std::vector<std::thread> threads_;  // guarded by mutex_ when grows_with_demand_
};

}  // namespace kiln

#endif  // KILN_COMMON_THREAD_POOL_H_
