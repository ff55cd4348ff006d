// Feeds kilnd.conf text (service/config.h): ApplyConfigText onto the
// defaults, then ValidateConfig of what it made. Either may refuse; each
// refusal must be INVALID_ARGUMENT naming the file (the origin given here)
// or the setting, as the header promises. Traps otherwise.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "service/config.h"

namespace {

constexpr absl::string_view kOrigin = "fuzzed.conf";

void ExpectInvalidArgument(const absl::Status& status, const char* what) {
  if (status.ok() || absl::IsInvalidArgument(status)) return;
  std::fprintf(stderr, "config_fuzzer: %s returned %s, not INVALID_ARGUMENT\n", what,
               status.ToString().c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Read once: the defaults come from the environment, which does not change.
  static const kiln::service::Config kDefaults = kiln::service::DefaultConfig();
  kiln::service::Config config = kDefaults;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const absl::Status applied = kiln::service::ApplyConfigText(text, kOrigin, config);
  ExpectInvalidArgument(applied, "ApplyConfigText");
  if (!applied.ok()) {
    if (applied.message().find(kOrigin) == absl::string_view::npos) {
      std::fprintf(stderr, "config_fuzzer: an error that names no file: %s\n", applied.ToString().c_str());
      std::abort();
    }
    return 0;
  }
  ExpectInvalidArgument(kiln::service::ValidateConfig(config), "ValidateConfig");
  return 0;
}
