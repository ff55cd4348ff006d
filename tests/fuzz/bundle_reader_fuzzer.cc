// Feeds kilnd's import of a bundle (client/cpp/bundle.h's reader, then
// service/bundle_import.h's checks) what a stranger may send:
//  - an input that starts as a bundle does ("KILNBUNDLE") is a whole bundle
//    file: written to a temp file and read entry by entry, every entry put
//    through the import's checks (ValidatePut of it as ImportBundleFile
//    makes it, and AdmitBundleEntry at either trust), and a signature
//    verified as the import verifies it, by kTrustedKey;
//  - anything else is one kiln.v1.BundleEntry: its blobs' digests and sizes
//    are filled in (a mutated blob would otherwise never pass the reader's
//    check of them) and it goes through the same checks, so that they see
//    entries no mutation of a whole file reaches.
// A refusal is fine; a crash, undefined behaviour, a leak or a hang is a
// finding.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/cpp/bundle.h"
#include "common/ed25519.h"
#include "common/sha256.h"
#include "google/protobuf/stubs/logging.h"
#include "kiln/v1/kiln.pb.h"
#include "service/bundle_import.h"
#include "service/request_validation.h"

namespace {

namespace v1 = kiln::v1;
namespace fs = std::filesystem;

// The publisher key that signed the seeds (corpus/bundle_reader_fuzzer/signed_*).
constexpr absl::string_view kTrustedKey =
    "-----BEGIN PUBLIC KEY-----\n"
    "MCowBQYDK2VwAyEAK04Y3hd1jccnmAV5mZV3GplTFzbMkPIC6Zt+g04r6ME=\n"
    "-----END PUBLIC KEY-----\n";

// One file for the whole run, in the temporary directory, removed at exit.
class BundleFile {
 public:
  BundleFile()
      : path_(fs::temp_directory_path() / absl::StrCat("bundle_reader_fuzzer.", getpid(), ".kilnbundle")) {}
  ~BundleFile() {
    std::error_code ignored;
    fs::remove(path_, ignored);
  }
  const fs::path& Write(absl::string_view bytes) {
    std::ofstream(path_, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path_;
  }

 private:
  fs::path path_;
};

// What ImportBundleFile's first pass checks of an entry, and the admission
// of its second pass at either trust.
absl::Status CheckEntry(const v1::BundleEntry& entry) {
  kiln::service::AdmitBundleEntry(entry, /*trusted=*/true);
  kiln::service::AdmitBundleEntry(entry, /*trusted=*/false);
  v1::PutRequest put;
  put.set_namespace_(entry.namespace_());
  put.set_key(entry.key());
  *put.mutable_blobs() = entry.blobs();
  return kiln::service::ValidatePut(put);
}

void ReadBundle(absl::string_view bytes) {
  static BundleFile file;
  static const absl::StatusOr<kiln::Ed25519PublicKey> trusted =
      kiln::Ed25519PublicKey::FromPem(kTrustedKey, "kTrustedKey");
  absl::StatusOr<kiln::BundleReader> read =
      kiln::ForEachBundleEntry(file.Write(bytes), [](v1::BundleEntry&& entry) { return CheckEntry(entry); });
  if (!read.ok() || !read->signature().has_value() || !trusted.ok()) return;
  const kiln::BundleSignature& signature = *read->signature();
  if (signature.key_id == trusted->id()) {
    trusted->Verifies(kiln::BundleSignedMessage(read->digest()), signature.signature);
  }
}

void CheckOneEntry(absl::string_view bytes) {
  v1::BundleEntry entry;
  if (!entry.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  for (v1::Blob& blob : *entry.mutable_blobs()) {
    blob.set_sha256(kiln::DigestBytes(kiln::Sha256(blob.data())));
    blob.set_size(blob.data().size());
  }
  CheckEntry(entry).IgnoreError();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // protobuf logs each string field that is not UTF-8 it parses: noise here.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (absl::StartsWith(bytes, "KILNBUNDLE")) {
    ReadBundle(bytes);
  } else {
    CheckOneEntry(bytes);
  }
  return 0;
}
