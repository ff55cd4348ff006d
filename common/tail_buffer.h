#ifndef KILN_COMMON_TAIL_BUFFER_H_
#define KILN_COMMON_TAIL_BUFFER_H_

#include <cstddef>
#include <mutex>
#include <string>

namespace kiln {

// The last `capacity` bytes appended, for one writer and any readers: a child
// process's stderr tail, kept for error reports.
class TailBuffer {
 public:
  explicit TailBuffer(size_t capacity) : capacity_(capacity) {}

  void Append(const char* data, size_t size) {
    std::lock_guard lock(mutex_);
    text_.append(data, size);
    if (text_.size() > capacity_) text_.erase(0, text_.size() - capacity_);
  }

  std::string Get() const {
    std::lock_guard lock(mutex_);
    return text_;
  }

 private:
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::string text_;  // guarded by mutex_
};

}  // namespace kiln

#endif  // KILN_COMMON_TAIL_BUFFER_H_
