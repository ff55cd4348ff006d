#include "common/byte_size.h"

#include <array>
#include <cctype>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace kiln {
namespace {

// Suffixes accepted after the number, lowercased, with their multipliers.
constexpr std::array<std::pair<absl::string_view, uint64_t>, 13> kUnits = {{
    {"", 1},
    {"b", 1},
    {"k", 1ull << 10},
    {"kb", 1ull << 10},
    {"kib", 1ull << 10},
    {"m", 1ull << 20},
    {"mb", 1ull << 20},
    {"mib", 1ull << 20},
    {"g", 1ull << 30},
    {"gb", 1ull << 30},
    {"gib", 1ull << 30},
    {"tib", 1ull << 40},
    {"tb", 1ull << 40},
}};

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < trimmed.size() && std::isdigit(static_cast<unsigned char>(trimmed[digits]))) {
    ++digits;
  }
  uint64_t number = 0;
  std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(trimmed.substr(digits)));
  if (digits == 0 || !absl::SimpleAtoi(trimmed.substr(0, digits), &number)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' is not a byte size; write a whole number with an optional unit, e.g. 10GiB or 512MiB",
        text));
  }
  for (const auto& [suffix, multiplier] : kUnits) {
    if (unit != suffix) continue;
    if (number > std::numeric_limits<uint64_t>::max() / multiplier) {
      return absl::InvalidArgumentError(absl::StrFormat("byte size '%s' is too large", text));
    }
    return number * multiplier;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "'%s' has an unknown unit '%s'; use B, KiB, MiB, GiB or TiB", text, unit));
}

std::string FormatByteSize(uint64_t bytes) {
  constexpr std::array<absl::string_view, 5> kNames = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < kNames.size()) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return absl::StrFormat("%d B", bytes);
  return absl::StrFormat("%.1f %s", value, kNames[unit]);
}

}  // namespace kiln
