#ifndef KILN_COMMON_TAIL_BUFFER_H_
#define KILN_COMMON_TAIL_BUFFER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
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
    appended_ += size;
    if (text_.size() > capacity_) text_.erase(0, text_.size() - capacity_);
  }

  // How many bytes were ever appended: a mark for Since().
  uint64_t Appended() const {
    std::lock_guard lock(mutex_);
    return appended_;
  }

  // What is kept of the bytes appended after `mark` (an earlier Appended()).
  std::string Since(uint64_t mark) const {
    std::lock_guard lock(mutex_);
    const uint64_t newer = appended_ - std::min<uint64_t>(mark, appended_);
    return newer >= text_.size() ? text_ : text_.substr(text_.size() - newer);
  }

 private:
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::string text_;     // guarded by mutex_
  uint64_t appended_ = 0;  // guarded by mutex_
};

}  // namespace kiln

#endif  // KILN_COMMON_TAIL_BUFFER_H_
