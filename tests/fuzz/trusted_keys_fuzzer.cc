// Feeds a trusted_bundle_keys file's text to ParseTrustedBundleKeys
// (service/bundle_import.h), which cuts out its PEM blocks for OpenSSL to
// read. A refusal must be INVALID_ARGUMENT naming the file, and every key
// read must have an id (the SHA-256 hex of its raw key); traps otherwise.
// OpenSSL is not instrumented: coverage is of the cutting, ASan's checks
// reach OpenSSL's reads only through the bytes it is handed.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "service/bundle_import.h"

namespace {

constexpr char kFile[] = "/fuzzed/trusted_bundle_keys.pem";

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "trusted_keys_fuzzer: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<std::vector<kiln::Ed25519PublicKey>> keys =
      kiln::service::ParseTrustedBundleKeys(text, kFile);
  if (!keys.ok()) {
    if (!absl::IsInvalidArgument(keys.status())) Fail("not INVALID_ARGUMENT", keys.status().ToString());
    if (keys.status().message().find(kFile) == absl::string_view::npos) {
      Fail("an error that names no file", keys.status().ToString());
    }
    return 0;
  }
  if (keys->empty()) Fail("no key, and no error", "");
  for (const kiln::Ed25519PublicKey& key : *keys) {
    if (key.id().size() != 64) Fail("a key id that is no SHA-256 hex", key.id());
  }
  return 0;
}
