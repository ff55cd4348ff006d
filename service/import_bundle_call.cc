// KilnService::ImportBundle: a bundle's bytes, received into a file of
// kilnd's own (memory holds one message), then imported from that file on a
// thread of the call's own (service/bundle_import.h): an import that compiles
// a bundle's kernels may take minutes, and must not hold a thread of the pool
// that serves puts. The import itself (ImportBundleFileFor) is also what a
// subscription runs (ImportBundleAsOwner).

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fmt_absl.h"
#include "service/bundle_import.h"
#include "service/compile_coordinator.h"
#include "service/kiln_service.h"
#include "spdlog/spdlog.h"

namespace kiln::service {
namespace {

namespace fs = std::filesystem;

std::string RandomHex() {
  std::random_device random;
  return absl::StrFormat("%08x%08x", random(), random());
}

}  // namespace

class KilnService::ImportBundleCall final
    : public grpc::ServerReadReactor<v1::ImportBundleChunk> {
 public:
  ImportBundleCall(KilnService& service, grpc::CallbackServerContext* context,
                   v1::ImportBundleResponse* response)
      : service_(service), context_(context), response_(response) {
    service_.activity_.Begin();
    absl::StatusOr<Caller> caller = service_.Authenticate(*context);
    absl::Status status =
        caller.ok() ? service_.RequireLocalUser(*caller, "bundle imports are") : caller.status();
    if (!status.ok()) {
      Done(status);
      return;
    }
    caller_ = *std::move(caller);
    const fs::path dir = ImportsDir(fs::path(service_.data_dir_));
    std::error_code error;
    fs::create_directories(dir, error);
    spool_ = dir / absl::StrCat(RandomHex(), ".kilnbundle");
    out_.open(spool_, std::ios::binary | std::ios::trunc);
    if (!out_) {
      Done(absl::FailedPreconditionError(absl::StrFormat(
          "kilnd cannot write the bundle it receives to %s; check that its data_dir is "
          "writable",
          spool_.string())));
      return;
    }
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      if (first_) replace_ = chunk_.replace();
      first_ = false;
      out_.write(chunk_.data().data(), static_cast<std::streamsize>(chunk_.data().size()));
      if (!out_) {
        Done(absl::ResourceExhaustedError(absl::StrFormat(
            "kilnd could not write the bundle to %s (a full disk?); free space in its data_dir "
            "and import again; nothing was imported",
            spool_.string())));
        return;
      }
      StartRead(&chunk_);
      return;
    }
    // The client sent all of it, or went away.
    out_.close();
    if (context_->IsCancelled()) {
      Done(absl::CancelledError("the client cancelled the import; nothing was imported"));
      return;
    }
    if (!out_) {
      Done(absl::ResourceExhaustedError(absl::StrFormat(
          "kilnd could not write the bundle to %s (a full disk?); nothing was imported",
          spool_.string())));
      return;
    }
    std::thread([this] { Import(); }).detach();
  }

  void OnDone() override {
    std::error_code error;
    if (!spool_.empty()) fs::remove(spool_, error);
    service_.activity_.End();
    delete this;
  }

 private:
  void Import() {
    absl::StatusOr<v1::ImportBundleResponse> imported = service_.ImportBundleFileFor(caller_, spool_, replace_);
    if (imported.ok()) *response_ = *std::move(imported);
    Done(imported.status());
  }

  void Done(const absl::Status& status) {
    service_.rpc_stats_.Record(Rpc::kImportBundle, absl::Now() - start_, status.ok());
    if (!status.ok()) spdlog::info("import refused: {}", status.message());
    Finish(ToGrpcStatus(status));
  }

  KilnService& service_;
  grpc::CallbackServerContext* context_;  // gRPC's, until OnDone
  v1::ImportBundleResponse* response_;
  const absl::Time start_ = absl::Now();
  Caller caller_;
  fs::path spool_;
  std::ofstream out_;
  v1::ImportBundleChunk chunk_;
  bool first_ = true;
  bool replace_ = false;
};

absl::StatusOr<v1::ImportBundleResponse> KilnService::ImportBundleFileFor(const Caller& caller,
                                                                         const fs::path& file, bool replace) {
  absl::StatusOr<std::vector<Ed25519PublicKey>> keys = LoadTrustedBundleKeys(trusted_bundle_keys_);
  if (!keys.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(keys.status().message(), "; nothing was imported"));
  }
  BundleImportContext context{
      .store = store_,
      .scoped = [&caller](absl::string_view ns) { return ScopedNamespace(caller, ns); },
      .compile =
          [this, &caller](v1::PrewarmRequest request, std::function<void(absl::Status)> done) {
            auto prewarm = std::make_shared<v1::PrewarmResponse>();
            StartPrewarm(caller, std::move(request), prewarm.get(),
                         [prewarm, done](const absl::Status& status) {
                           if (!status.ok()) return done(status);
                           if (!prewarm->skipped().empty()) {
                             return done(absl::FailedPreconditionError(prewarm->skipped()));
                           }
                           if (prewarm->compile().has_error()) {
                             return done(absl::AbortedError(prewarm->compile().error().message()));
                           }
                           done(absl::OkStatus());
                         });
          },
      .trusted_keys = *std::move(keys),
      .replace = replace,
      // Served before the import answers: the process started after it
      // finds them.
      .stored =
          [this, &caller](const std::string& bundle_ns, const std::string& key) {
            if (!caller.same_local_user) return;  // only kilnd's own user reads served files
            const absl::Status served = store_.ServeAsFiles(ScopedNamespace(caller, bundle_ns), key,
                                                            cache::ArtifactStore::AsFiles{bundle_ns});
            if (!served.ok() && !absl::IsNotFound(served)) {
              spdlog::warn("import: {}/{} not served as files: {}", bundle_ns, key, served.message());
            }
          },
      .build_launchers =
          [this](std::vector<v1::BuildLauncherRequest> recipes) {
            for (v1::BuildLauncherRequest& recipe : recipes) {
              const std::string module = recipe.module_name();
              coordinator_.BuildLauncherAhead(std::move(recipe), [module](const absl::Status& built) {
                if (!built.ok()) spdlog::info("import: launcher {} not built ahead: {}", module, built.message());
              });
            }
          },
  };
  absl::StatusOr<v1::ImportBundleResponse> imported = ImportBundleFile(context, file);
  if (imported.ok()) {
    spdlog::info("import: {} entries{}{}: {} stored, {} compiled, {} unchanged, {} conflicts, {} launchers to build",
                 imported->entries(), imported->signed_by().empty() ? "" : ", signed by key ",
                 imported->signed_by(), imported->stored(), imported->compiled(), imported->unchanged(),
                 imported->conflicts(), imported->launchers_ahead());
  }
  return imported;
}

absl::StatusOr<v1::ImportBundleResponse> KilnService::ImportBundleAsOwner(const fs::path& file) {
  activity_.Begin();  // an idle kilnd does not stop in the middle of it
  absl::StatusOr<v1::ImportBundleResponse> imported =
      ImportBundleFileFor(Caller{.trust_domain = std::string(kLocalDomain), .same_local_user = true}, file,
                          /*replace=*/false);
  activity_.End();
  return imported;
}

grpc::ServerReadReactor<v1::ImportBundleChunk>* KilnService::ImportBundle(
    grpc::CallbackServerContext* context, v1::ImportBundleResponse* response) {
  return new ImportBundleCall(*this, context, response);
}

}  // namespace kiln::service
