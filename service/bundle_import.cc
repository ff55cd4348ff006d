#include "service/bundle_import.h"

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cpp/bundle.h"
#include "common/fmt_absl.h"
#include "common/platform.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "service/compile_coordinator.h"
#include "service/request_validation.h"
#include "spdlog/spdlog.h"

namespace kiln::service {
namespace {

using cache::kKeyInputsBlob;  // what the Python client keeps with each kernel

// Namespaces no bundle writes: the Python client's memos hold for the machine
// that made them; "shared.*" are kilnd's own (the launchers it builds).
constexpr absl::string_view kMachineLocalNamespace = "kiln-memos";
constexpr absl::string_view kKilndOwnPrefix = "shared.";
constexpr absl::string_view kTritonNamespace = "triton";
constexpr absl::string_view kSourceSuffix = ".source";

// What one call of the store takes of a trusted bundle: its costs shared by
// many entries, while a batch's bytes stay a small part of kilnd's memory.
constexpr size_t kEntriesPerBatch = 256;
constexpr size_t kBytesPerBatch = 8 << 20;
// Kernels of an untrusted bundle compiling at once: enough to keep kilnd's
// workers busy, few enough that clients' own compiles are not queued behind
// a whole bundle.
constexpr int kCompilesInFlight = 4;
constexpr int kCompileFailuresListed = 20;

constexpr uint16_t kElfMachineCuda = 190;  // EM_CUDA: a cubin

uint32_t LittleEndianAt(absl::string_view data, size_t offset, size_t bytes) {
  uint32_t value = 0;
  for (size_t i = 0; i < bytes; ++i) value |= static_cast<uint32_t>(static_cast<uint8_t>(data[offset + i])) << (8 * i);
  return value;
}

// Whether `data` is a program or library for a CPU: an ELF file of any
// machine but CUDA's, PE (Windows: "MZ" and the "PE\0\0" its header points
// to; "MZ" alone begins one in 65,536 random blobs), or Mach-O. A cubin is
// ELF too, for EM_CUDA.
bool IsNativeCode(absl::string_view data) {
  if (absl::StartsWith(data, "\x7f" "ELF") && data.size() >= 20) {
    return LittleEndianAt(data, 18, 2) != kElfMachineCuda;
  }
  if (absl::StartsWith(data, "MZ") && data.size() >= 0x40) {
    const uint32_t pe_header = LittleEndianAt(data, 0x3c, 4);
    return pe_header <= data.size() - 4 && data.substr(pe_header, 4) == absl::string_view("PE\0\0", 4);
  }
  for (absl::string_view magic : {"\xfe\xed\xfa\xce", "\xce\xfa\xed\xfe", "\xfe\xed\xfa\xcf",
                                  "\xcf\xfa\xed\xfe", "\xca\xfe\xba\xbe"}) {
    if (absl::StartsWith(data, magic)) return true;
  }
  return false;
}

// A file name a Python extension module or a native library takes.
bool HasNativeName(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (absl::string_view suffix : {".so", ".pyd", ".dll", ".dylib", ".exe"}) {
    if (absl::EndsWith(lower, suffix)) return true;
  }
  return absl::StrContains(lower, ".so.") || absl::StrContains(lower, "__triton_launcher") ||
         absl::StartsWith(lower, "cuda_utils");
}

bool IsTritonKernel(const v1::BundleEntry& entry) {
  if (entry.namespace_() != kTritonNamespace) return false;
  bool source = false;
  bool key_inputs = false;
  for (const v1::Blob& blob : entry.blobs()) {
    source = source || absl::EndsWith(blob.name(), kSourceSuffix);
    key_inputs = key_inputs || blob.name() == kKeyInputsBlob;
  }
  return source && key_inputs;
}

std::string NameOf(const v1::BundleEntry& entry) {
  return absl::StrCat(entry.namespace_(), "/", entry.key());
}

// The entry as a Put of it, its blobs moved (not copied: an entry may be 32 MiB).
v1::PutRequest AsPut(v1::BundleEntry&& entry) {
  v1::PutRequest put;
  put.set_namespace_(entry.namespace_());
  put.set_key(entry.key());
  put.mutable_blobs()->Swap(entry.mutable_blobs());
  return put;
}

// The import's counts of refused entries, by reason, in the order first met.
class Refusals {
 public:
  void Add(const std::string& reason, const v1::BundleEntry& entry) {
    auto [found, added] = index_.try_emplace(reason, response_refused_.size());
    if (added) {
      v1::RefusedEntries& refused = response_refused_.emplace_back();
      refused.set_reason(reason);
      refused.set_example(NameOf(entry));
    }
    v1::RefusedEntries& refused = response_refused_[found->second];
    refused.set_count(refused.count() + 1);
  }
  void MoveTo(v1::ImportBundleResponse& response) {
    for (v1::RefusedEntries& refused : response_refused_) *response.add_refused() = std::move(refused);
  }

 private:
  std::map<std::string, size_t> index_;
  std::vector<v1::RefusedEntries> response_refused_;
};

absl::Status NothingImported(const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(status.message(), "; nothing was imported"));
}

// Stores a trusted bundle's entries, journaled under one import id; takes
// them back on an error or a stop.
class TrustedStore {
 public:
  TrustedStore(const BundleImportContext& context, v1::ImportBundleResponse& response)
      : context_(context), response_(response) {
    mode_.id = static_cast<int64_t>(std::random_device()() & 0x7fffffff) << 31 |
               static_cast<int64_t>(std::random_device()() & 0x7fffffff);
    mode_.replace = context.replace;
  }
  // An import that ends otherwise (the bundle could not be read again) stores nothing either.
  ~TrustedStore() {
    if (!done_) Abandon(absl::DataLossError("the import did not finish")).IgnoreError();
  }

  absl::Status Add(v1::BundleEntry&& entry) {
    batch_bytes_ += entry.ByteSizeLong();
    cache::ArtifactStore::EntryInput& input = batch_.emplace_back();
    bundle_namespaces_.push_back(entry.namespace_());
    input.ns = context_.scoped(entry.namespace_());
    input.key = entry.key();
    for (v1::Blob& blob : *entry.mutable_blobs()) {
      input.blobs.push_back({blob.name(), std::move(*blob.mutable_data()), blob.sha256()});
    }
    if (batch_.size() < kEntriesPerBatch && batch_bytes_ < kBytesPerBatch) return absl::OkStatus();
    return Flush();
  }

  absl::Status Finish() {
    RETURN_IF_ERROR(Flush());
    if (absl::Status finished = context_.store.FinishImport(mode_.id); !finished.ok()) {
      return Abandon(finished);
    }
    done_ = true;
    if (context_.stored) {
      for (const auto& [ns, key] : stored_) context_.stored(ns, key);
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Flush() {
    if (batch_.empty()) return absl::OkStatus();
    if (context_.store.stop_requested()) {
      return Abandon(absl::UnavailableError("kilnd is stopping"));
    }
    std::vector<std::string> names;
    std::vector<std::pair<std::string, std::string>> entries;  // bundle namespace, key
    for (const auto& input : batch_) names.push_back(absl::StrCat(input.ns, " ", input.key));
    for (size_t i = 0; i < batch_.size(); ++i) entries.emplace_back(bundle_namespaces_[i], batch_[i].key);
    bundle_namespaces_.clear();
    std::vector<cache::ArtifactStore::ImportedAs> how;
    const std::vector<absl::Status> results =
        context_.store.PutMany(std::move(batch_), &mode_, &how);
    batch_.clear();
    batch_bytes_ = 0;
    for (size_t i = 0; i < results.size(); ++i) {
      if (!results[i].ok()) {
        return Abandon(absl::Status(results[i].code(),
                                    absl::StrCat(names[i], ": ", results[i].message())));
      }
      switch (how[i]) {
        case cache::ArtifactStore::ImportedAs::kStored:
          response_.set_stored(response_.stored() + 1);
          if (stored_.size() < kServedAheadOfImport) stored_.push_back(std::move(entries[i]));
          break;
        case cache::ArtifactStore::ImportedAs::kUnchanged:
          response_.set_unchanged(response_.unchanged() + 1);
          break;
        case cache::ArtifactStore::ImportedAs::kConflict:
          response_.set_conflicts(response_.conflicts() + 1);
          break;
        case cache::ArtifactStore::ImportedAs::kReplaced:
          response_.set_conflicts(response_.conflicts() + 1);
          response_.set_replaced(response_.replaced() + 1);
          if (stored_.size() < kServedAheadOfImport) stored_.push_back(std::move(entries[i]));
          break;
      }
    }
    return absl::OkStatus();
  }

  // What the import stored goes (what a stop leaves of it, the next start
  // takes back); `why` as the caller is told.
  absl::Status Abandon(const absl::Status& why) {
    done_ = true;
    absl::StatusOr<uint64_t> removed = context_.store.AbandonImport(mode_.id);
    spdlog::warn("import: stopped ({}); took back {} entries it stored", why.message(),
                 removed.ok() ? absl::StrCat(*removed) : std::string(removed.status().message()));
    return absl::Status(why.code(), absl::StrCat(why.message(), "; nothing was imported (the "
                                                 "entries stored so far were taken back)"));
  }

  const BundleImportContext& context_;
  v1::ImportBundleResponse& response_;
  cache::ArtifactStore::ImportMode mode_;
  std::vector<cache::ArtifactStore::EntryInput> batch_;
  std::vector<std::string> bundle_namespaces_;  // of batch_'s entries, as the bundle names them
  size_t batch_bytes_ = 0;
  // What the import stored (bundle namespace, key), for context_.stored.
  std::vector<std::pair<std::string, std::string>> stored_;
  bool done_ = false;  // finished, or taken back
};

// Compiles an untrusted bundle's kernels, kCompilesInFlight at a time.
class KernelCompiles {
 public:
  KernelCompiles(const BundleImportContext& context, v1::ImportBundleResponse& response)
      : context_(context), response_(response) {}
  ~KernelCompiles() { Wait(); }

  void Add(const v1::BundleEntry& entry) {
    v1::PrewarmRequest request;
    request.set_namespace_(entry.namespace_());
    request.set_priority(v1::PRIORITY_BACKGROUND);
    const v1::Blob* key_inputs_blob = nullptr;
    for (const v1::Blob& blob : entry.blobs()) {
      if (absl::EndsWith(blob.name(), kSourceSuffix) || blob.name() == kKeyInputsBlob) {
        *request.add_recorded() = blob;
      }
      if (blob.name() == kKeyInputsBlob) key_inputs_blob = &blob;
    }
    // The kernel is compiled for the target it was recorded for: the entry
    // a client of that target looks up.
    v1::KeyInputs key_inputs;
    google::protobuf::util::JsonParseOptions lenient;
    lenient.ignore_unknown_fields = true;
    if (key_inputs_blob == nullptr ||
        !google::protobuf::util::JsonStringToMessage(key_inputs_blob->data(), &key_inputs, lenient)
             .ok() ||
        !key_inputs.has_target()) {
      return Failed(NameOf(entry), absl::InvalidArgumentError(absl::StrCat(
                                       kKeyInputsBlob, " is not kiln.v1.KeyInputs JSON with a target")));
    }
    *request.mutable_target() = key_inputs.target();
    std::unique_lock lock(mutex_);
    room_.wait(lock, [this] { return in_flight_ < kCompilesInFlight; });
    ++in_flight_;
    lock.unlock();
    context_.compile(std::move(request), [this, name = NameOf(entry)](absl::Status status) {
      if (!status.ok()) Failed(name, status);
      std::lock_guard done(mutex_);
      if (status.ok()) response_.set_compiled(response_.compiled() + 1);
      --in_flight_;
      room_.notify_all();
    });
  }

  void Wait() {
    std::unique_lock lock(mutex_);
    room_.wait(lock, [this] { return in_flight_ == 0; });
  }

 private:
  void Failed(const std::string& name, const absl::Status& status) {
    std::lock_guard lock(mutex_);
    response_.set_compile_failures_count(response_.compile_failures_count() + 1);
    if (response_.compile_failures_size() < kCompileFailuresListed) {
      response_.add_compile_failures(absl::StrCat(name, ": ", status.message()));
    }
  }

  const BundleImportContext& context_;
  v1::ImportBundleResponse& response_;  // guarded by mutex_ while compiles run
  std::mutex mutex_;
  std::condition_variable room_;
  int in_flight_ = 0;  // guarded by mutex_
};

}  // namespace

BundleEntryAdmission AdmitBundleEntry(const v1::BundleEntry& entry, bool trusted) {
  if (entry.namespace_() == kMachineLocalNamespace) {
    return {BundleEntryAdmission::kRefused,
            "a memo of the machine that made it (kiln-memos): it holds for that machine only"};
  }
  if (absl::StartsWith(entry.namespace_(), kKilndOwnPrefix)) {
    return {BundleEntryAdmission::kRefused, "kilnd's own namespace (shared.*): kilnd makes those"};
  }
  if (entry.namespace_() == kLauncherRecipeNamespace) {
    absl::StatusOr<v1::BuildLauncherRequest> recipe = LauncherRecipeOf(entry);
    if (!recipe.ok()) return {BundleEntryAdmission::kRefused, std::string(recipe.status().message())};
    return {BundleEntryAdmission::kLauncherRecipe, ""};
  }
  bool native = HasNativeName(entry.key());
  for (const v1::Blob& blob : entry.blobs()) {
    native = native || HasNativeName(blob.name()) || IsNativeCode(blob.data());
  }
  if (native) {
    return {BundleEntryAdmission::kRefused,
            "native code (a launcher or other module for the CPU): launchers are built on "
            "this machine, never taken from a bundle"};
  }
  if (trusted) return {BundleEntryAdmission::kAsIs, ""};
  if (IsTritonKernel(entry)) return {BundleEntryAdmission::kCompile, ""};
  return {BundleEntryAdmission::kRefused,
          "not signed by a key of trusted_bundle_keys: such a bundle brings only Triton "
          "kernels, which kilnd compiles itself from their recorded TTIR"};
}

absl::StatusOr<v1::BuildLauncherRequest> LauncherRecipeOf(const v1::BundleEntry& entry) {
  const auto refused = [] {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a launcher recipe (%s) that is not one blob %s holding a module name, a Triton key and "
        "make_launcher's arguments",
        kLauncherRecipeNamespace, kLauncherRecipeBlob));
  };
  v1::BuildLauncherRequest recipe;
  if (entry.blobs_size() != 1 || entry.blobs(0).name() != kLauncherRecipeBlob ||
      !recipe.ParseFromString(entry.blobs(0).data()) || recipe.module_name().empty() ||
      recipe.triton_key().empty() || recipe.origin().generator_case() == v1::LauncherOrigin::GENERATOR_NOT_SET ||
      !recipe.c_source().empty() || recipe.include_dirs_size() > 0 || recipe.library_dirs_size() > 0 ||
      recipe.libraries_size() > 0 || recipe.has_python_abi()) {
    return refused();
  }
  return recipe;
}

std::filesystem::path ImportsDir(const std::filesystem::path& data_dir) {
  return (data_dir.empty() ? std::filesystem::temp_directory_path() : data_dir) / "imports";
}

absl::StatusOr<std::vector<Ed25519PublicKey>> ParseTrustedBundleKeys(absl::string_view text,
                                                                     const std::string& file) {
  std::vector<Ed25519PublicKey> keys;
  constexpr absl::string_view kEnd = "-----END PUBLIC KEY-----";
  size_t from = 0;
  while (true) {
    const size_t begin = text.find("-----BEGIN PUBLIC KEY-----", from);
    if (begin == absl::string_view::npos) break;
    const size_t end = text.find(kEnd, begin);
    if (end == absl::string_view::npos) break;
    from = end + kEnd.size();
    ASSIGN_OR_RETURN(Ed25519PublicKey key,
                     Ed25519PublicKey::FromPem(text.substr(begin, from - begin),
                                               absl::StrCat("a key of trusted_bundle_keys (", file, ")")));
    keys.push_back(std::move(key));
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "trusted_bundle_keys: %s holds no PEM public key; write each publisher's key as "
        "`openssl pkey -in KEY.pem -pubout` prints it",
        file));
  }
  return keys;
}

absl::StatusOr<std::vector<Ed25519PublicKey>> LoadTrustedBundleKeys(const std::string& file) {
  if (file.empty()) return std::vector<Ed25519PublicKey>();
  absl::StatusOr<std::string> text = platform::ReadWholeFile(file);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "trusted_bundle_keys: cannot read %s (%s); name a file of PEM public keys", file,
        text.status().message()));
  }
  return ParseTrustedBundleKeys(*text, file);
}

absl::StatusOr<v1::ImportBundleResponse> ImportBundleFile(const BundleImportContext& context,
                                                          const std::filesystem::path& bundle) {
  v1::ImportBundleResponse response;
  // Everything is checked before anything is stored.
  absl::StatusOr<BundleReader> checked = ForEachBundleEntry(bundle, [&](v1::BundleEntry&& entry) {
    response.set_entries(response.entries() + 1);
    const std::string name = NameOf(entry);
    if (absl::Status valid = ValidatePut(AsPut(std::move(entry))); !valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("entry %d (%s): %s", response.entries(), name, valid.message()));
    }
    return absl::OkStatus();
  });
  if (!checked.ok()) return NothingImported(checked.status());
  bool trusted = false;
  if (const std::optional<BundleSignature>& signature = checked->signature()) {
    response.set_signed_by(signature->key_id);
    for (const Ed25519PublicKey& key : context.trusted_keys) {
      if (key.id() != signature->key_id) continue;
      if (!key.Verifies(BundleSignedMessage(checked->digest()), signature->signature)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "the bundle's signature by trusted key %s does not verify: it was changed after it "
            "was signed, or forged; nothing was imported",
            signature->key_id));
      }
      trusted = true;
    }
  }
  response.set_trusted(trusted);

  Refusals refusals;
  std::vector<v1::BuildLauncherRequest> recipes;
  TrustedStore store(context, response);
  std::optional<KernelCompiles> compiles;
  if (!trusted) compiles.emplace(context, response);
  absl::StatusOr<BundleReader> read = ForEachBundleEntry(bundle, [&](v1::BundleEntry&& entry) {
    const BundleEntryAdmission admission = AdmitBundleEntry(entry, trusted);
    switch (admission.kind) {
      case BundleEntryAdmission::kRefused:
        refusals.Add(admission.reason, entry);
        return absl::OkStatus();
      case BundleEntryAdmission::kCompile:
        if (context.store.stop_requested()) return absl::UnavailableError("kilnd is stopping");
        compiles->Add(entry);
        return absl::OkStatus();
      case BundleEntryAdmission::kAsIs:
        return store.Add(std::move(entry));
      case BundleEntryAdmission::kLauncherRecipe:
        if (absl::StatusOr<v1::BuildLauncherRequest> recipe = LauncherRecipeOf(entry); recipe.ok()) {
          recipes.push_back(*std::move(recipe));
        }
        return absl::OkStatus();
    }
    return absl::OkStatus();
  });
  if (compiles.has_value()) compiles->Wait();
  // The file changed between the reads (it is kilnd's own copy: a disk error).
  if (!read.ok() && absl::IsInvalidArgument(read.status())) {
    return absl::DataLossError(absl::StrCat("the received bundle could not be read again: ",
                                            read.status().message()));
  }
  RETURN_IF_ERROR(read.status());
  RETURN_IF_ERROR(store.Finish());
  refusals.MoveTo(response);
  response.set_launchers_ahead(recipes.size());
  if (!recipes.empty() && context.build_launchers) context.build_launchers(std::move(recipes));
  return response;
}

}  // namespace kiln::service
