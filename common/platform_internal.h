#ifndef KILN_COMMON_PLATFORM_INTERNAL_H_
#define KILN_COMMON_PLATFORM_INTERNAL_H_

// Shared between platform_common.cc and the per-OS platform files only.

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "common/platform.h"

namespace kiln::platform {

struct ShutdownSignals::State {
  std::mutex mutex;
  std::condition_variable requested;
  std::string reason;  // guarded by mutex; empty until the first request
  // POSIX: the thread that turns SIGTERM/SIGINT into Request(), and whether
  // it has left sigwait (guarded by mutex).
  std::thread signal_waiter;
  bool signal_waiter_done = false;
};

}  // namespace kiln::platform

#endif  // KILN_COMMON_PLATFORM_INTERNAL_H_
