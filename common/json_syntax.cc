#include "common/json_syntax.h"

#include "absl/strings/ascii.h"

namespace kiln {
namespace {

class JsonSyntax {
 public:
  explicit JsonSyntax(absl::string_view text) : at_(text.data()), end_(text.data() + text.size()) {}

  bool WholeObject() {
    SkipSpace();
    if (!Object(0)) return false;
    SkipSpace();
    return at_ == end_;
  }

 private:
  bool Value(int depth) {
    if (at_ == end_) return false;
    switch (*at_) {
      case '{': return Object(depth);
      case '[': return Array(depth);
      case '"': return String();
      case 't': return Word("true");
      case 'f': return Word("false");
      case 'n': return Word("null");
      default: return Number();
    }
  }

  bool Object(int depth) {
    if (depth >= kMaxJsonDepth || !Take('{')) return false;
    SkipSpace();
    if (Take('}')) return true;
    do {
      SkipSpace();
      if (!String()) return false;
      SkipSpace();
      if (!Take(':')) return false;
      SkipSpace();
      if (!Value(depth + 1)) return false;
      SkipSpace();
    } while (Take(','));
    return Take('}');
  }

  bool Array(int depth) {
    if (depth >= kMaxJsonDepth || !Take('[')) return false;
    SkipSpace();
    if (Take(']')) return true;
    do {
      SkipSpace();
      if (!Value(depth + 1)) return false;
      SkipSpace();
    } while (Take(','));
    return Take(']');
  }

  bool String() {
    if (!Take('"')) return false;
    while (at_ != end_) {
      const unsigned char c = static_cast<unsigned char>(*at_++);
      if (c == '"') return true;
      if (c < 0x20) return false;  // control characters must be escaped
      if (c != '\\') continue;
      if (at_ == end_) return false;
      const char escaped = *at_++;
      if (escaped == 'u') {
        for (int i = 0; i < 4; ++i) {
          if (at_ == end_ || !absl::ascii_isxdigit(static_cast<unsigned char>(*at_++))) return false;
        }
      } else if (absl::string_view("\"\\/bfnrt").find(escaped) == absl::string_view::npos) {
        return false;
      }
    }
    return false;  // unterminated
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  bool Number() {
    Take('-');
    // A lone 0, or digits that cannot start with one (the 0 was not there).
    if (!Take('0') && SkipDigits() == 0) return false;
    if (Take('.') && SkipDigits() == 0) return false;
    if (Take('e') || Take('E')) {
      if (!Take('+')) Take('-');
      if (SkipDigits() == 0) return false;
    }
    return true;
  }

  bool Word(absl::string_view word) {
    if (absl::string_view(at_, end_ - at_).substr(0, word.size()) != word) return false;
    at_ += word.size();
    return true;
  }

  bool Take(char c) {
    if (at_ == end_ || *at_ != c) return false;
    ++at_;
    return true;
  }

  int SkipDigits() {
    int digits = 0;
    while (at_ != end_ && absl::ascii_isdigit(static_cast<unsigned char>(*at_))) ++at_, ++digits;
    return digits;
  }

  void SkipSpace() {
    while (at_ != end_ && (*at_ == ' ' || *at_ == '\t' || *at_ == '\n' || *at_ == '\r')) ++at_;
  }

  const char* at_;
  const char* end_;
};

}  // namespace

bool IsJsonObject(absl::string_view text) { return JsonSyntax(text).WholeObject(); }

}  // namespace kiln
