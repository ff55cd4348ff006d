#ifndef KILN_SERVICE_BUNDLE_IMPORT_H_
#define KILN_SERVICE_BUNDLE_IMPORT_H_

// kilnd's side of `kiln import` (ImportBundle in kiln.proto): what a bundle
// may bring into the store, by whom it is signed, and its import, checked
// whole before anything is stored. Knows nothing of gRPC.
//
// Trust levels:
//  - signed by a key of trusted_bundle_keys: entries come as they are, but
//    for native code (a launcher module: the client or kilnd builds those on
//    this machine) and kilnd's own or machine-local namespaces;
//  - anything else (unsigned, or a key not trusted): only Triton kernels,
//    each compiled by kilnd from its recorded frontend output (TTIR) and key
//    inputs, as `kiln prewarm` compiles them; nothing else of it is stored.

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cache/artifact_store.h"
#include "common/ed25519.h"
#include "kiln/v1/kiln.pb.h"

namespace kiln::service {

// Where bundles are received, then imported: `imports` in kilnd's data dir
// (the system's temporary directory without one). A start empties it of
// what a stopped kilnd was receiving.
std::filesystem::path ImportsDir(const std::filesystem::path& data_dir);

// How an entry of a bundle comes in: stored as it is, compiled by kilnd
// from what it recorded, or refused (`reason` says why).
struct BundleEntryAdmission {
  // kLauncherRecipe: what generated a launcher (kLauncherRecipeNamespace):
  // not stored; its launcher is built here after the import, at any trust
  // (only arguments to this machine's own Triton come from the bundle).
  enum Kind { kAsIs, kCompile, kLauncherRecipe, kRefused };
  Kind kind = kRefused;
  std::string reason;
};
BundleEntryAdmission AdmitBundleEntry(const v1::BundleEntry& entry, bool trusted);

// A launcher recipe entry's request: its module name, Triton key and origin
// only (no source, directories or ABI: those are this machine's).
// INVALID_ARGUMENT saying what a recipe holds otherwise.
absl::StatusOr<v1::BuildLauncherRequest> LauncherRecipeOf(const v1::BundleEntry& entry);

// The keys trusted_bundle_keys names: the PEM public keys in `file`, one or
// more. None when `file` is empty. Read at each import, so a change of the
// file holds from the next import on. INVALID_ARGUMENT naming the file when
// it cannot be read or holds no key.
absl::StatusOr<std::vector<Ed25519PublicKey>> LoadTrustedBundleKeys(const std::string& file);
// The PEM public keys in `text`, the contents of `file` (named in messages):
// what lies around and between them is ignored. INVALID_ARGUMENT when one
// is not an Ed25519 key or there is none.
absl::StatusOr<std::vector<Ed25519PublicKey>> ParseTrustedBundleKeys(absl::string_view text,
                                                                     const std::string& file);

struct BundleImportContext {
  cache::ArtifactStore& store;
  // The store's namespace for a bundle's namespace (the caller's trust domain's).
  std::function<std::string(absl::string_view)> scoped;
  // Compiles a kernel as Prewarm does, calling `done` once, from any thread:
  // OK when it is stored, or why not.
  std::function<void(v1::PrewarmRequest, std::function<void(absl::Status)> done)> compile;
  std::vector<Ed25519PublicKey> trusted_keys;
  bool replace = false;
  // Once a trusted import has committed: each entry it stored (its bundle
  // namespace and key), up to kServedAheadOfImport of them, for kilnd to
  // serve to its local clients as files ahead of their lookups. A client's
  // first compile looks only there (compiled_here.py): without them, the
  // first kernel of every process after a pull was compiled again.
  std::function<void(const std::string& bundle_ns, const std::string& key)> stored;
  // Once the import has committed: the launcher recipes it brought, to build
  // in the background (never waited for).
  std::function<void(std::vector<v1::BuildLauncherRequest>)> build_launchers;
};

// What `stored` is told of an import at most: a bundle's kernels a process
// asks for first are few, and a lookup serves the rest when asked.
inline constexpr size_t kServedAheadOfImport = 256;

// Imports the bundle file `bundle`. It is read whole first: a damaged
// bundle, an entry a Put would refuse, or a signature that does not verify
// stores nothing (INVALID_ARGUMENT saying so). Then what its trust lets in is
// stored, all or nothing: an error or a stop takes back what was stored.
absl::StatusOr<v1::ImportBundleResponse> ImportBundleFile(const BundleImportContext& context,
                                                          const std::filesystem::path& bundle);

}  // namespace kiln::service

#endif  // KILN_SERVICE_BUNDLE_IMPORT_H_
