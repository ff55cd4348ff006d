#ifndef KILN_SERVICE_COMPILE_COORDINATOR_H_
#define KILN_SERVICE_COMPILE_COORDINATOR_H_

// Joins the compiler and the cache: answers Compile and BuildLauncher requests
// from the cache when it can, otherwise runs each distinct job once however
// many callers ask for it at the same time (single flight), stores the result
// and answers every caller. Never blocks the calling (gRPC) thread.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "cache/artifact_store.h"
#include "cache/shared_tier.h"
#include "cache/tiered_store.h"
#include "common/thread_pool.h"
#include "compiler/launcher_builder.h"
#include "compiler/toolchains.h"
#include "kiln/v1/kiln.pb.h"

namespace kiln::service {

// Who is asking. Writes go to the caller's trust domain; only a caller that is
// provably the service's own user may have an interpreter path run.
struct Caller {
  std::string trust_domain;  // kLocalDomain, "net" (TCP), or a farm tenant's
  bool same_local_user = false;
};

// Where kilnd keeps, in each caller's trust domain, what generated each
// launcher it built for them ("launcher recipes": no code, only Triton's and
// make_launcher's arguments), so that a bundle carries them.
inline constexpr absl::string_view kLauncherRecipeNamespace = "kiln.launchers";
inline constexpr absl::string_view kLauncherRecipeBlob = "kiln.launcher-recipe.pb";

// The trust domain of kilnd's own account: its Unix socket, or the token of its
// endpoint file. Only it reads served files.
inline constexpr absl::string_view kLocalDomain = "local";
// The trust domain of a farm tenant: its store namespaces are "tenant:NAME/...".
inline constexpr absl::string_view kTenantDomainPrefix = "tenant:";

// "local/triton": the store namespace of a client namespace in a trust domain.
std::string ScopedNamespace(const Caller& caller, absl::string_view ns);

// Where a compile's result is recorded under the client's own key (and where
// clients wait on it): the request's namespace, "triton" when it names none.
std::string CompileAliasNamespace(const Caller& caller, const v1::CompileRequest& request);

struct CompileOutcome {
  std::variant<cache::CacheEntry, compiler::CompileFailure> result;
  bool cache_hit = false;
  std::string ptxas_log;
  std::map<std::string, double> stage_seconds;
  // Nothing compiled: the caller asked not to wait for a worker's start.
  bool no_worker_ready = false;
};

// A torch.compile kernel a worker compiled from its generated module: the
// Triton keys its configs' kernels are now stored under in the caller's
// namespace "triton", or why the module did not compile.
struct InductorKernelOutcome {
  std::vector<std::string> keys;
  std::optional<compiler::CompileFailure> failure;
  double worker_seconds = 0;
};

// What a PrewarmRequest comes to: a Compile of the recorded frontend TTIR
// for the new target under the key its clients compute, or why not.
struct PrewarmPlan {
  std::string skipped;
  v1::CompileRequest compile;
};

struct CoordinatorStats {
  uint64_t compiles = 0;
  uint64_t compile_cache_hits = 0;
  uint64_t single_flight_joins = 0;
  uint64_t compile_failures = 0;
  uint64_t launcher_builds = 0;
  uint64_t launcher_cache_hits = 0;
  double compile_seconds = 0;
};

class CompileCoordinator {
 public:
  using Done = std::function<void(absl::StatusOr<CompileOutcome>)>;

  // `launcher_builder` may be null when no C compiler was found; launcher
  // requests then fail with its reason, `launcher_unavailable`.
  // `shared_tier` (may be null): the fleet's cache behind `store` for kilnd's
  // own results (shared_tier.h); a compile another kilnd of the fleet is
  // running is waited for up to `fleet_patience`, then compiled here.
  CompileCoordinator(cache::ArtifactStore& store, compiler::ToolchainRegistry& toolchains,
                     std::unique_ptr<compiler::LauncherBuilder> launcher_builder,
                     absl::Status launcher_unavailable, int threads,
                     cache::SharedTier* shared_tier = nullptr,
                     absl::Duration fleet_patience = absl::Minutes(10));

  // Calls `done` exactly once, on one of the coordinator's threads, then
  // `recorded` once the result is also stored under the caller's key (or the
  // compile failed): callers waiting on that key may look from then on. A
  // fresh compile answers `done` as soon as the worker returns; storing it is
  // off the caller's critical path. Errors: INVALID_ARGUMENT (bad request or
  // target), FAILED_PRECONDITION (no such toolchain, listing the registered
  // ones). A kernel that fails to compile is an OK outcome holding a
  // CompileFailure.
  void Compile(v1::CompileRequest request, Caller caller, Done done,
               std::function<void()> recorded);
  void BuildLauncher(v1::BuildLauncherRequest request, Caller caller, Done done);
  // Builds, in the background, the launcher a launcher recipe (an imported
  // bundle's kLauncherRecipeNamespace entry: its module name, Triton and
  // make_launcher's arguments) makes on this machine: its source generated
  // by this machine's toolchain of that Triton, its build as a local
  // client of that toolchain would ask for it, so that the client's first
  // launch finds it built. `done` is called once: OK when it is built (or
  // was), or why not.
  void BuildLauncherAhead(v1::BuildLauncherRequest recipe, std::function<void(absl::Status)> done);
  // Launchers are built by `launcher_builder` from now on; null: none are,
  // failing with `launcher_unavailable`.
  void UseLauncherBuilder(std::unique_ptr<compiler::LauncherBuilder> launcher_builder,
                          absl::Status launcher_unavailable);
  // Calls `done` once, on one of the coordinator's threads, with the compile a
  // prewarm of a recorded kernel takes (worked out by the toolchain that
  // recorded it). INVALID_ARGUMENT for a malformed recording,
  // FAILED_PRECONDITION when no toolchain of its Triton is registered.
  void PlanPrewarm(v1::PrewarmRequest request,
                   std::function<void(absl::StatusOr<PrewarmPlan>)> done);

  // Calls `done` once, on one of the coordinator's threads, once the
  // kernels are stored. The module is the caller's program: the service lets
  // only its own user ask. Errors as Compile's.
  void CompileInductorKernel(v1::CompileInductorKernelRequest request, Caller caller,
                             std::function<void(absl::StatusOr<InductorKernelOutcome>)> done);

  // kilnd is stopping: compiles running on workers are abandoned, and they
  // and every later one answer UNAVAILABLE at once (a client then compiles
  // itself, as when kilnd is gone); waits for another kilnd's compile end.
  // Nothing of an abandoned compile is stored. Returns at once.
  void RequestStop();

  CoordinatorStats Stats() const;
  // The shared tier's, when there is one.
  std::optional<cache::SharedTierStats> SharedTierStats() const;

 private:
  // What a job produced, already stored: the entry with every blob's data, or
  // the kernel's failure.
  struct Produced {
    cache::CacheEntry entry;
    std::optional<compiler::CompileFailure> failure;
    std::string ptxas_log;
    std::map<std::string, double> stage_seconds;
  };
  // Called once the job's blobs are in the store (or it failed).
  using Finish = std::function<void(const absl::StatusOr<Produced>&)>;
  struct Flight {
    std::vector<Finish> waiters;
  };

  // Runs `produce` for `shared_key` unless a run is in flight, in which case
  // `finish` joins it. Runs on the caller's thread; waiters return at once.
  void RunOnce(const std::string& shared_key, Finish finish, bool* joined,
               const std::function<absl::StatusOr<Produced>()>& produce);
  // Where a result is also recorded for the caller: its own key in its trust
  // domain, with the artifacts it produced itself (its earlier stages).
  struct Alias {
    std::string ns;
    std::string key;  // empty: no alias
    std::vector<cache::BlobInput> client_artifacts;
  };
  void CompileOnThread(const v1::CompileRequest& request, const Caller& caller, Done done,
                       const std::function<void()>& recorded);
  void BuildLauncherOnThread(const v1::BuildLauncherRequest& request, const Caller& caller,
                             Done done);
  absl::StatusOr<PrewarmPlan> PlanPrewarmOnThread(const v1::PrewarmRequest& request);
  absl::StatusOr<InductorKernelOutcome> CompileInductorKernelOnThread(
      const v1::CompileInductorKernelRequest& request, const Caller& caller);
  // Stores `artifacts` under the shared key; the entry holds their data.
  absl::StatusOr<cache::CacheEntry> StoreShared(absl::string_view shared_ns,
                                                const std::string& shared_key,
                                                compiler::Parts artifacts);
  // StoreShared on a thread of storing_, waiting for it.
  absl::StatusOr<cache::CacheEntry> StoreSharedAtLoweredCpu(absl::string_view shared_ns,
                                                            const std::string& shared_key,
                                                            compiler::Parts artifacts);
  // The worker's artifacts as an entry, before they are stored: blobs the
  // caller has lose their data.
  static cache::CacheEntry UnstoredEntry(const compiler::Parts& artifacts,
                                         const absl::flat_hash_set<std::string>& have);
  // The caller's copy of a stored entry: blobs it has lose their data, and the
  // entry is aliased under the caller's key when it has one.
  cache::CacheEntry ForCaller(const cache::CacheEntry& entry,
                              const absl::flat_hash_set<std::string>& have, const Alias& alias);
  // What to build for a client on another machine: the source its Triton's
  // generator makes here (which must equal what it sent), with this machine's
  // Python and CUDA files. FAILED_PRECONDITION names what the farm lacks.
  absl::StatusOr<compiler::LauncherRequest> RemoteLauncherRequest(
      const v1::BuildLauncherRequest& request, const compiler::LauncherBuilder& builder);
  // The launcher this machine's toolchain of `request.triton_key()` generates
  // from `request.origin()`, built with that toolchain's Python and CUDA
  // files; and that toolchain's Triton version, for messages.
  struct LauncherFromOrigin {
    compiler::LauncherRequest launcher;
    std::string triton_version;
  };
  absl::StatusOr<LauncherFromOrigin> GeneratedLauncherRequest(const v1::BuildLauncherRequest& request,
                                                              const compiler::LauncherBuilder& builder);
  // Keeps what generated a launcher a local client had built (its recipe),
  // once per kilnd run, in the caller's kLauncherRecipeNamespace: bundles
  // carry it, and an import builds the launcher ahead from it.
  void KeepLauncherRecipe(const v1::BuildLauncherRequest& request, const Caller& caller);
  std::mutex recipes_mutex_;
  absl::flat_hash_set<std::string> recipes_kept_;  // guarded by recipes_mutex_
  void BuildLauncher(compiler::LauncherRequest launcher, const compiler::LauncherBuilder& builder,
                     Done done);
  // The worker pool of the toolchain whose Triton has `triton_key`, registering
  // `local_python` (the client's interpreter) first for the service's own user.
  // With `no_wait_for_probe`, nullptr while the toolchain is still being
  // probed (its probe then runs in the background); else that probe is waited for.
  absl::StatusOr<compiler::WorkerPool*> ResolveToolchain(const std::string& triton_key,
                                                         const std::string& local_python,
                                                         absl::string_view backend,
                                                         const Caller& caller,
                                                         bool no_wait_for_probe = false);
  // Records `entry` under the caller's own key too, if it sent one.
  void RecordAlias(const cache::CacheEntry& entry, const Alias& alias);
  // The result of a compile of `shared_key` that another kilnd of the fleet
  // made (waiting for it if it is compiling); nullopt: compile here (claimed
  // in the fleet when the tier is up).
  std::optional<cache::CacheEntry> AwaitFleetCompile(const std::string& shared_key,
                                                     const absl::flat_hash_set<std::string>& have);
  // A hit for `shared_key`, aliased under the caller's key when it has one.
  absl::StatusOr<std::optional<cache::CacheEntry>> LookupShared(
      absl::string_view shared_ns, const std::string& shared_key,
      const absl::flat_hash_set<std::string>& have, const Alias& alias);

  // Client namespaces' entries (aliases, launcher recipes): this kilnd's alone.
  cache::ArtifactStore& store_;
  // kilnd's own results, through the fleet's tier where there is one.
  cache::TieredStore results_;
  const absl::Duration fleet_patience_;
  compiler::ToolchainRegistry& toolchains_;
  // What builds launchers, or why none does: replaced when a toolchain
  // probed after the start brings a C compiler (UseLauncherBuilder).
  std::mutex launcher_mutex_;
  std::shared_ptr<const compiler::LauncherBuilder> launcher_builder_;  // guarded
  absl::Status launcher_unavailable_;                                  // guarded

  std::mutex flights_mutex_;
  absl::flat_hash_map<std::string, std::unique_ptr<Flight>> flights_;  // guarded

  std::atomic<uint64_t> compiles_{0};
  std::atomic<uint64_t> compile_cache_hits_{0};
  std::atomic<uint64_t> single_flight_joins_{0};
  std::atomic<uint64_t> compile_failures_{0};
  std::atomic<uint64_t> launcher_builds_{0};
  std::atomic<uint64_t> launcher_cache_hits_{0};
  std::atomic<int64_t> compile_micros_{0};

  // Stores what a compile produced after its first caller was answered, at a
  // lowered CPU priority while a coordinator thread waits: the answer is still
  // on its way, and hashing, compressing and syncing would take the CPU that
  // needs (on 2 cores, 0.5 ms more per cold compile). As many threads as the
  // coordinator's, so stores waiting on fsync never queue behind each other.
  ThreadPool storing_;
  ThreadPool threads_;  // last: drains before the members its tasks use go
};

}  // namespace kiln::service

#endif  // KILN_SERVICE_COMPILE_COORDINATOR_H_
