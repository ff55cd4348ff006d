#include "progress_line.h"

namespace kiln {

// "\r" back to the line's start, then erase it (ANSI, which Windows 10's
// console understands too).
constexpr absl::string_view kEraseLine = "\r\x1b[2K";

void ProgressLine::Update(absl::string_view status) {
  if (!terminal_ || status == status_) return;
  out_ << kEraseLine << status << std::flush;
  status_ = std::string(status);
}

void ProgressLine::Print(absl::string_view line) {
  if (terminal_ && !status_.empty()) out_ << kEraseLine;
  out_ << line << "\n";
  if (terminal_ && !status_.empty()) out_ << status_;
  out_ << std::flush;
}

void ProgressLine::Clear() {
  if (!terminal_ || status_.empty()) return;
  out_ << kEraseLine << std::flush;
  status_.clear();
}

}  // namespace kiln
