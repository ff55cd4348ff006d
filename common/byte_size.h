#ifndef KILN_COMMON_BYTE_SIZE_H_
#define KILN_COMMON_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace kiln {

// Parses "1048576", "64MiB", "10 GiB", "512k" (binary multiples: k = KiB).
// INVALID_ARGUMENT names the text and the accepted forms.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

// "10.0 GiB", "512 B": for logs and stats output.
std::string FormatByteSize(uint64_t bytes);

}  // namespace kiln

#endif  // KILN_COMMON_BYTE_SIZE_H_
