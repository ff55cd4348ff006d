#ifndef KILN_CLIENT_PROGRESS_LINE_H_
#define KILN_CLIENT_PROGRESS_LINE_H_

#include <ostream>
#include <string>

#include "absl/strings/string_view.h"

namespace kiln {

// One status line of a long command (`kiln compile`): on a terminal it is
// redrawn in place and lines printed through it go above it; elsewhere (a
// log, a pipe) there is no status line, only the printed lines, so logs stay
// plain text.
class ProgressLine {
 public:
  ProgressLine(std::ostream& out, bool terminal) : out_(out), terminal_(terminal) {}
  ~ProgressLine() { Clear(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  void Update(absl::string_view status);
  void Print(absl::string_view line);  // one line, without its newline
  // Erases the status line (before writing to stderr); the next Update draws it again.
  void Clear();

 private:
  std::ostream& out_;
  const bool terminal_;
  std::string status_;  // what is drawn now; empty: nothing
};

}  // namespace kiln

#endif  // KILN_CLIENT_PROGRESS_LINE_H_
