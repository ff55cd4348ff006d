#ifndef KILN_COMMON_FMT_ABSL_H_
#define KILN_COMMON_FMT_ABSL_H_

// Lets spdlog/fmt print absl::string_view (Debian's Abseil has its own
// string_view type rather than an alias of std::string_view).

#include "absl/strings/string_view.h"
#include "fmt/format.h"

template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view text, FormatContext& context) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(text.data(), text.size()),
                                                    context);
  }
};

#endif  // KILN_COMMON_FMT_ABSL_H_
