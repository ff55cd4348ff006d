#include "service/compile_coordinator.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <future>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/fmt_absl.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "spdlog/spdlog.h"

namespace kiln::service {
namespace {

// Compile and launcher results live under keys the service derives from every
// input of the job, so they are shared by all trust domains: nobody can choose
// such a key for different content. Client-chosen keys are only aliases inside
// the client's own trust domain.
constexpr absl::string_view kCompileNamespace = "shared.compile";
constexpr absl::string_view kLauncherNamespace = "shared.launcher";
using cache::kKeyInputsBlob;  // what the Python client keeps with each kernel: kiln.v1.KeyInputs

std::string CompileKey(const v1::CompileRequest& request) {
  std::vector<std::string> env;
  for (const auto& [name, value] : request.env()) env.push_back(absl::StrCat(name, "=", value));
  std::sort(env.begin(), env.end());
  const std::string material = absl::StrJoin(
      {request.triton_key(), v1::Stage_Name(request.stage()), request.target().backend(),
       request.target().arch(), absl::StrCat(request.target().warp_size()), request.options_json(),
       request.cache_key(), absl::StrJoin(env, "\n"), request.metadata_json(), request.ir()},
      std::string(1, '\0'));
  return DigestHex(DigestBytes(Sha256(material)));
}

// The variables that choose the ptxas Triton runs.
constexpr std::array<absl::string_view, 2> kToolPathVariables = {"TRITON_PTXAS_PATH",
                                                                 "TRITON_PTXAS_BLACKWELL_PATH"};

// Whether a compile may run the ptxas the client's Triton runs: always for the
// service's own local user (it could run it anyway); for anyone else only a
// ptxas installed in the toolchain's own environment (its site-packages, as
// torch's is), which whoever registered the toolchain put there: a caller must
// not make kilnd run a program of its choosing.
absl::Status CheckToolPaths(const google::protobuf::Map<std::string, std::string>& tool_paths,
                            bool same_local_user, const std::filesystem::path& triton_dir) {
  for (const auto& [name, value] : tool_paths) {
    if (std::find(kToolPathVariables.begin(), kToolPathVariables.end(), name) ==
        kToolPathVariables.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tool_paths names %s; kilnd takes only TRITON_PTXAS_PATH and TRITON_PTXAS_BLACKWELL_PATH",
          name));
    }
    if (same_local_user) continue;
    std::error_code error;
    const std::filesystem::path ptxas = std::filesystem::weakly_canonical(value, error);
    const std::filesystem::path environment =
        std::filesystem::weakly_canonical(triton_dir.parent_path(), error);
    const auto [outside, inside] =
        std::mismatch(environment.begin(), environment.end(), ptxas.begin(), ptxas.end());
    if (error || triton_dir.empty() || !ptxas.is_absolute() || outside != environment.end()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "this process's Triton runs the ptxas at %s=%s, which kilnd runs only for its own "
          "user or from the toolchain's environment (%s); unset %s, or use a kilnd of your own "
          "user",
          name, value, environment.string(), name));
    }
  }
  return absl::OkStatus();
}

compiler::Priority PriorityOf(v1::Priority priority) {
  return priority == v1::PRIORITY_BACKGROUND ? compiler::Priority::kBackground
                                             : compiler::Priority::kInteractive;
}

compiler::LauncherRequest ToLauncherRequest(const v1::BuildLauncherRequest& request) {
  const v1::PythonAbi& abi = request.python_abi();
  return {request.module_name(),
          request.c_source(),
          {abi.version(), abi.abiflags(), abi.ext_suffix(), abi.platform(), abi.include_dir()},
          {request.include_dirs().begin(), request.include_dirs().end()},
          {request.library_dirs().begin(), request.library_dirs().end()},
          {request.libraries().begin(), request.libraries().end()}};
}

}  // namespace

std::string ScopedNamespace(const Caller& caller, absl::string_view ns) {
  return absl::StrCat(caller.trust_domain, "/", ns);
}

std::string CompileAliasNamespace(const Caller& caller, const v1::CompileRequest& request) {
  return ScopedNamespace(caller, request.namespace_().empty() ? "triton" : request.namespace_());
}

CompileCoordinator::CompileCoordinator(cache::ArtifactStore& store,
                                       compiler::ToolchainRegistry& toolchains,
                                       std::unique_ptr<compiler::LauncherBuilder> launcher_builder,
                                       absl::Status launcher_unavailable, int threads,
                                       cache::SharedTier* shared_tier,
                                       absl::Duration fleet_patience)
    : store_(store),
      results_(store, shared_tier),
      fleet_patience_(fleet_patience),
      toolchains_(toolchains),
      launcher_builder_(std::move(launcher_builder)),
      launcher_unavailable_(std::move(launcher_unavailable)),
      storing_(threads, ThreadPool::kLoweredCpu),
      threads_(threads) {}

void CompileCoordinator::Compile(v1::CompileRequest request, Caller caller, Done done,
                                 std::function<void()> recorded) {
  threads_.Schedule(
      [this, request = std::move(request), caller = std::move(caller), done = std::move(done),
       recorded = std::move(recorded)] { CompileOnThread(request, caller, done, recorded); },
      request.priority() == v1::PRIORITY_BACKGROUND ? ThreadPool::kBackground
                                                     : ThreadPool::kInteractive);
}

void CompileCoordinator::BuildLauncher(v1::BuildLauncherRequest request, Caller caller,
                                       Done done) {
  threads_.Schedule(
      [this, request = std::move(request), caller = std::move(caller), done = std::move(done)] {
        BuildLauncherOnThread(request, caller, done);
      },
      ThreadPool::kInteractive);
}

void CompileCoordinator::PlanPrewarm(v1::PrewarmRequest request,
                                     std::function<void(absl::StatusOr<PrewarmPlan>)> done) {
  threads_.Schedule(
      [this, request = std::move(request), done = std::move(done)] {
        done(PlanPrewarmOnThread(request));
      },
      request.priority() == v1::PRIORITY_BACKGROUND ? ThreadPool::kBackground
                                                     : ThreadPool::kInteractive);
}

void CompileCoordinator::CompileInductorKernel(
    v1::CompileInductorKernelRequest request, Caller caller,
    std::function<void(absl::StatusOr<InductorKernelOutcome>)> done) {
  threads_.Schedule(
      [this, request = std::move(request), caller = std::move(caller), done = std::move(done)] {
        done(CompileInductorKernelOnThread(request, caller));
      },
      ThreadPool::kInteractive);
}

absl::StatusOr<InductorKernelOutcome> CompileCoordinator::CompileInductorKernelOnThread(
    const v1::CompileInductorKernelRequest& request, const Caller& caller) {
  // The toolchain and the tools are found and checked as a Compile of the
  // same client's finds them.
  ASSIGN_OR_RETURN(compiler::WorkerPool * pool,
                   ResolveToolchain(request.triton_key(), request.local_python_executable(),
                                    "cuda", caller));
  RETURN_IF_ERROR(
      CheckToolPaths(request.tool_paths(), caller.same_local_user, pool->info().triton_dir));

  compiler::InductorKernelJob job;
  job.kernel_name = request.kernel_name();
  job.source = request.source();
  job.inductor_cache_dir = request.inductor_cache_dir();
  job.ptxas_versions.insert(request.ptxas_versions().begin(), request.ptxas_versions().end());
  job.env.insert(request.env().begin(), request.env().end());
  job.tool_env.insert(request.tool_paths().begin(), request.tool_paths().end());
  job.requester = absl::StrCat(caller.trust_domain, "/", request.requester());
  ASSIGN_OR_RETURN(auto compiled, pool->InductorKernel(job));
  InductorKernelOutcome outcome;
  if (auto* failure = std::get_if<compiler::CompileFailure>(&compiled)) {
    outcome.failure = std::move(*failure);
    return outcome;
  }
  auto& kernels = std::get<compiler::InductorKernels>(compiled);
  outcome.worker_seconds = kernels.seconds;
  const std::string ns = ScopedNamespace(caller, "triton");
  for (auto& [key, files] : kernels.files_by_key) {
    std::vector<cache::BlobInput> blobs;
    for (auto& [name, data] : files) blobs.push_back({name, std::move(data), ""});
    // As a client's Put of a kernel it compiled itself: in its trust domain.
    RETURN_IF_ERROR(store_.Put(ns, key, std::move(blobs)).status());
    outcome.keys.push_back(key);
  }
  return outcome;
}

absl::StatusOr<PrewarmPlan> CompileCoordinator::PlanPrewarmOnThread(
    const v1::PrewarmRequest& request) {
  const v1::Blob* source = nullptr;
  const v1::Blob* key_inputs_blob = nullptr;
  for (const v1::Blob& blob : request.recorded()) {
    if (absl::EndsWith(blob.name(), ".source")) source = &blob;
    if (blob.name() == kKeyInputsBlob) key_inputs_blob = &blob;
  }
  if (source == nullptr || key_inputs_blob == nullptr) {
    return PrewarmPlan{absl::StrFormat(
        "the entry has no %s: it was not compiled through kilnd by the kiln Python client "
        "(or by one older than prewarm)",
        source == nullptr ? "frontend TTIR (<kernel>.source)" : kKeyInputsBlob), {}};
  }
  v1::KeyInputs key_inputs;
  google::protobuf::util::JsonParseOptions lenient;
  lenient.ignore_unknown_fields = true;
  if (!google::protobuf::util::JsonStringToMessage(key_inputs_blob->data(), &key_inputs, lenient)
           .ok() ||
      key_inputs.triton_key().empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("recorded: %s is not kiln.v1.KeyInputs JSON", kKeyInputsBlob));
  }
  v1::CompileRequest compile;
  compile.set_triton_key(key_inputs.triton_key());
  *compile.mutable_target() = request.target();
  ASSIGN_OR_RETURN(compiler::WorkerPool * pool,
                   ResolveToolchain(compile.triton_key(), "", request.target().backend(), Caller{}));
  compiler::RetargetJob job;
  job.key_inputs_json = key_inputs_blob->data();
  job.target.set_backend(request.target().backend());
  job.target.set_arch(request.target().arch());
  job.target.set_warp_size(request.target().warp_size());
  job.frontend_ir = source->data();
  ASSIGN_OR_RETURN(compiler::Retargeted retargeted,
                   pool->Retarget(job, PriorityOf(request.priority())));
  if (!retargeted.skipped.empty()) return PrewarmPlan{std::move(retargeted.skipped), {}};
  compile.set_stage(v1::STAGE_TTIR);
  compile.set_ir(std::move(retargeted.frontend_ir));
  compile.set_options_json(std::move(retargeted.options_json));
  compile.mutable_env()->insert(key_inputs.env().begin(), key_inputs.env().end());
  // Checked again by the compile as any client's: only a ptxas of the
  // toolchain's own environment.
  compile.mutable_tool_paths()->insert(retargeted.tool_env.begin(), retargeted.tool_env.end());
  compile.set_namespace_(request.namespace_());
  compile.set_cache_key(std::move(retargeted.cache_key));
  compile.set_priority(request.priority());
  // The new entry holds what a client's compile would have stored: the
  // frontend output it started from, and the key inputs for the next prewarm.
  *compile.add_client_artifacts() = *source;
  v1::Blob* inputs = compile.add_client_artifacts();
  inputs->set_name(std::string(kKeyInputsBlob));
  inputs->set_data(std::move(retargeted.key_inputs_json));
  return PrewarmPlan{"", std::move(compile)};
}

absl::StatusOr<compiler::WorkerPool*> CompileCoordinator::ResolveToolchain(
    const std::string& triton_key, const std::string& local_python, absl::string_view backend,
    const Caller& caller, bool no_wait_for_probe) {
  const auto log_registration = [local_python](const absl::StatusOr<compiler::ToolchainInfo>& info) {
    if (info.ok()) {
      spdlog::info("registered toolchain triton {} at {}", info->triton_version, local_python);
    } else {
      spdlog::warn("client interpreter {} not registered: {}", local_python,
                   info.status().message());
    }
  };
  // An interpreter path is run only for the service's own user: a remote
  // client could otherwise make kilnd execute any program on this machine.
  if (!local_python.empty() && caller.same_local_user &&
      !toolchains_.IsRegisteredAs(local_python, triton_key)) {
    if (!no_wait_for_probe) {
      log_registration(toolchains_.Register(local_python, triton_key));
    } else if (!toolchains_.RegisterInBackground(local_python, triton_key, log_registration)) {
      return nullptr;  // being probed
    }
  }
  absl::StatusOr<compiler::WorkerPool*> found =
      toolchains_.Find(triton_key, /*wait_for_probes=*/!no_wait_for_probe);
  // One of kilnd's own toolchains may be the one, its probe under way.
  if (!found.ok() && no_wait_for_probe && toolchains_.AnyProbeUnderWay()) return nullptr;
  ASSIGN_OR_RETURN(compiler::WorkerPool * pool, std::move(found));
  const auto& backends = pool->info().backends;
  if (backend != "cuda" || std::find(backends.begin(), backends.end(), "nvidia") == backends.end()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "target backend '%s' is not supported by this toolchain; Kiln compiles for 'cuda'",
        backend));
  }
  return pool;
}

void CompileCoordinator::RecordAlias(const cache::CacheEntry& entry, const Alias& alias) {
  if (alias.key.empty()) return;
  // A file the client made itself stands: a compile from its frontend TTIR
  // makes a .ttir too, whose loop variables lost their names in the text.
  absl::flat_hash_set<absl::string_view> clients;
  for (const cache::BlobInput& blob : alias.client_artifacts) clients.insert(blob.name);
  cache::ArtifactStore::BlobReferences shared;
  for (const cache::StoredBlob& blob : entry.blobs) {
    if (!clients.contains(blob.name)) shared.push_back({blob.name, blob.digest, blob.store_key});
  }
  // A lost alias only costs the client a later Compile; the result stands.
  // A full disk the store reports itself, once.
  if (absl::Status status = store_.Put(alias.ns, alias.key, alias.client_artifacts, shared).status();
      !status.ok() && !absl::IsResourceExhausted(status)) {
    spdlog::warn("cannot record {}/{}: {}", alias.ns, alias.key, status.message());
  }
}

absl::StatusOr<std::optional<cache::CacheEntry>> CompileCoordinator::LookupShared(
    absl::string_view shared_ns, const std::string& shared_key,
    const absl::flat_hash_set<std::string>& have, const Alias& alias) {
  absl::StatusOr<cache::CacheEntry> entry = results_.Lookup(shared_ns, shared_key, have);
  if (absl::IsNotFound(entry.status())) return std::nullopt;
  RETURN_IF_ERROR(entry.status());
  RecordAlias(*entry, alias);
  return *std::move(entry);
}

absl::StatusOr<cache::CacheEntry> CompileCoordinator::StoreShared(absl::string_view shared_ns,
                                                                  const std::string& shared_key,
                                                                  compiler::Parts artifacts) {
  ASSIGN_OR_RETURN(std::vector<cache::StoredBlob> manifest,
                   results_.Put(shared_ns, shared_key, artifacts));
  cache::CacheEntry entry;
  entry.created = absl::Now();
  for (cache::StoredBlob& blob : manifest) {
    // Serve the bytes we hold rather than reading back what we just wrote.
    auto artifact = std::find_if(artifacts.begin(), artifacts.end(),
                                 [&](const auto& named) { return named.first == blob.name; });
    blob.data = std::move(artifact->second);
    entry.blobs.push_back(std::move(blob));
  }
  return entry;
}

absl::StatusOr<cache::CacheEntry> CompileCoordinator::StoreSharedAtLoweredCpu(
    absl::string_view shared_ns, const std::string& shared_key, compiler::Parts artifacts) {
  auto stored = std::make_shared<std::promise<absl::StatusOr<cache::CacheEntry>>>();
  std::future<absl::StatusOr<cache::CacheEntry>> result = stored->get_future();
  storing_.Schedule(
      [this, stored, shared_ns, &shared_key, artifacts = std::move(artifacts)]() mutable {
        stored->set_value(StoreShared(shared_ns, shared_key, std::move(artifacts)));
      });
  return result.get();
}

cache::CacheEntry CompileCoordinator::UnstoredEntry(const compiler::Parts& artifacts,
                                                    const absl::flat_hash_set<std::string>& have) {
  cache::CacheEntry entry;
  entry.created = absl::Now();
  for (const auto& [name, data] : artifacts) {
    cache::StoredBlob blob{name, DigestBytes(Sha256(data)), data.size(), "", std::nullopt, std::nullopt};
    if (!have.contains(blob.digest)) blob.data = data;
    entry.blobs.push_back(std::move(blob));
  }
  std::sort(entry.blobs.begin(), entry.blobs.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return entry;
}

cache::CacheEntry CompileCoordinator::ForCaller(const cache::CacheEntry& entry,
                                                const absl::flat_hash_set<std::string>& have,
                                                const Alias& alias) {
  RecordAlias(entry, alias);
  cache::CacheEntry copy = entry;
  for (cache::StoredBlob& blob : copy.blobs) {
    if (have.contains(blob.digest)) blob.data.reset();
  }
  return copy;
}

void CompileCoordinator::RunOnce(const std::string& shared_key, Finish finish, bool* joined,
                                 const std::function<absl::StatusOr<Produced>()>& produce) {
  {
    std::lock_guard lock(flights_mutex_);
    auto [flight, created] = flights_.try_emplace(shared_key);
    *joined = !created;
    if (created) flight->second = std::make_unique<Flight>();
    flight->second->waiters.push_back(std::move(finish));
    if (!created) return;
  }
  absl::StatusOr<Produced> produced = produce();
  std::unique_ptr<Flight> flight;
  {
    // The entry is stored before the flight ends, so a request arriving after
    // this point finds it in the cache rather than compiling again.
    std::lock_guard lock(flights_mutex_);
    auto node = flights_.extract(shared_key);
    flight = std::move(node.mapped());
  }
  for (Finish& waiter : flight->waiters) waiter(produced);
}

void CompileCoordinator::CompileOnThread(const v1::CompileRequest& request, const Caller& caller,
                                         Done done, const std::function<void()>& recorded) {
  absl::StatusOr<compiler::WorkerPool*> pool =
      ResolveToolchain(request.triton_key(), request.local_python_executable(),
                       request.target().backend(), caller, request.no_wait_for_worker_start());
  if (!pool.ok()) {
    done(pool.status());
    return recorded();
  }
  // The client compiles it itself, as stock Triton would, and stores it.
  const auto no_worker_ready = [&] {
    CompileOutcome compile_here;
    compile_here.no_worker_ready = true;
    done(std::move(compile_here));
    recorded();
  };
  if (*pool == nullptr) return no_worker_ready();  // its toolchain is still being probed
  if (absl::Status tools =
          CheckToolPaths(request.tool_paths(), caller.same_local_user, (*pool)->info().triton_dir);
      !tools.ok()) {
    done(tools);
    return recorded();
  }
  const std::string shared_key = CompileKey(request);
  const absl::flat_hash_set<std::string> have(request.have_sha256().begin(),
                                              request.have_sha256().end());
  Alias alias{CompileAliasNamespace(caller, request), request.cache_key(), {}};
  for (const v1::Blob& blob : request.client_artifacts()) {
    alias.client_artifacts.push_back({blob.name(), blob.data(), blob.sha256()});
  }

  absl::StatusOr<std::optional<cache::CacheEntry>> hit =
      LookupShared(kCompileNamespace, shared_key, have, alias);
  if (!hit.ok() || hit->has_value()) {
    if (hit.ok()) compile_cache_hits_.fetch_add(1);
    done(hit.ok() ? absl::StatusOr<CompileOutcome>(CompileOutcome{**std::move(hit), true, "", {}})
                  : absl::StatusOr<CompileOutcome>(hit.status()));
    return recorded();
  }

  if (request.no_wait_for_worker_start() && !(*pool)->HasStartedWorker()) return no_worker_ready();
  // Seen idle, a worker may still be taken by another job first: this one
  // then waits for the next, as any job does.
  if (request.no_wait_for_busy_workers() && !(*pool)->HasIdleWorker()) return no_worker_ready();

  // The caller that starts the job is answered from the worker's output before
  // anything is stored; callers that join it are answered once it is stored.
  auto answered = std::make_shared<std::atomic<bool>>(false);
  auto answer = [answered, done](absl::StatusOr<CompileOutcome> outcome) {
    if (!answered->exchange(true)) done(std::move(outcome));
  };
  auto finish = [this, have, alias = std::move(alias), answer,
                 recorded](const absl::StatusOr<Produced>& produced) {
    if (!produced.ok()) {
      answer(produced.status());
    } else if (produced->failure.has_value()) {
      answer(CompileOutcome{*produced->failure, false, "", {}});
    } else {
      answer(CompileOutcome{ForCaller(produced->entry, have, alias), false, produced->ptxas_log,
                            produced->stage_seconds});
    }
    recorded();
  };
  compiler::CompileJob job;
  job.priority = PriorityOf(request.priority());
  job.stage = absl::AsciiStrToLower(v1::Stage_Name(request.stage()).substr(6));  // STAGE_TTGIR -> ttgir
  job.target.set_backend(request.target().backend());
  job.target.set_arch(request.target().arch());
  job.target.set_warp_size(request.target().warp_size());
  job.ir = request.ir();
  job.options_json = request.options_json();
  job.env.insert(request.env().begin(), request.env().end());
  job.tool_env.insert(request.tool_paths().begin(), request.tool_paths().end());
  job.hash = request.cache_key();
  job.metadata_json = request.metadata_json();
  job.requester = absl::StrCat(caller.trust_domain, "/", request.requester());
  bool joined = false;
  RunOnce(shared_key, std::move(finish), &joined, [&]() -> absl::StatusOr<Produced> {
    if (std::optional<cache::CacheEntry> fleet = AwaitFleetCompile(shared_key, have)) {
      Produced produced;
      produced.entry = *std::move(fleet);
      return produced;
    }
    compiles_.fetch_add(1);
    const absl::Time start = absl::Now();
    absl::StatusOr<compiler::CompileResult> compiled = (*pool)->Compile(job);
    compile_micros_.fetch_add(absl::ToInt64Microseconds(absl::Now() - start));
    if (!compiled.ok() || std::holds_alternative<compiler::CompileFailure>(*compiled)) {
      results_.Release(kCompileNamespace, shared_key);
    }
    ASSIGN_OR_RETURN(compiler::CompileResult result, std::move(compiled));
    Produced produced;
    if (auto* failure = std::get_if<compiler::CompileFailure>(&result)) {
      compile_failures_.fetch_add(1);
      produced.failure = *failure;
      return produced;
    }
    auto& output = std::get<compiler::CompileOutput>(result);
    for (const std::string& warning : output.warnings) {
      spdlog::warn("compile of {}: {}", shared_key, warning);
    }
    produced.ptxas_log = output.ptxas_log;
    produced.stage_seconds = output.stage_seconds;
    answer(CompileOutcome{UnstoredEntry(output.artifacts, have), false, produced.ptxas_log,
                          produced.stage_seconds});
    absl::StatusOr<cache::CacheEntry> stored =
        StoreSharedAtLoweredCpu(kCompileNamespace, shared_key, std::move(output.artifacts));
    if (!stored.ok()) results_.Release(kCompileNamespace, shared_key);  // never offered
    ASSIGN_OR_RETURN(produced.entry, std::move(stored));
    return produced;
  });
  if (joined) single_flight_joins_.fetch_add(1);
}

std::optional<cache::CacheEntry> CompileCoordinator::AwaitFleetCompile(
    const std::string& shared_key, const absl::flat_hash_set<std::string>& have) {
  const cache::SharedTier::Turn turn =
      results_.AwaitTurn(kCompileNamespace, shared_key, fleet_patience_);
  if (turn != cache::SharedTier::Turn::kDone) return std::nullopt;
  // The other kilnd's result, checked, into this kilnd's store.
  absl::StatusOr<std::optional<cache::CacheEntry>> fetched =
      LookupShared(kCompileNamespace, shared_key, have, Alias{});
  // Evicted or rejected since it was written: compiled here.
  if (!fetched.ok() || !fetched->has_value()) return std::nullopt;
  return **std::move(fetched);
}

void CompileCoordinator::UseLauncherBuilder(std::unique_ptr<compiler::LauncherBuilder> launcher_builder,
                                            absl::Status launcher_unavailable) {
  std::lock_guard lock(launcher_mutex_);
  launcher_builder_ = std::move(launcher_builder);
  launcher_unavailable_ = std::move(launcher_unavailable);
}

void CompileCoordinator::BuildLauncherOnThread(const v1::BuildLauncherRequest& request,
                                               const Caller& caller, Done done) {
  const auto current_builder = [this](absl::Status& unavailable) {
    std::lock_guard lock(launcher_mutex_);
    unavailable = launcher_unavailable_;
    return launcher_builder_;
  };
  absl::Status unavailable;
  std::shared_ptr<const compiler::LauncherBuilder> builder = current_builder(unavailable);
  if (builder == nullptr && toolchains_.AnyProbeUnderWay()) {
    // A toolchain being probed may bring the C compiler (Triton for Windows
    // bundles TinyCC): found again once it registers.
    toolchains_.WaitForProbes();
    builder = current_builder(unavailable);
  }
  if (builder == nullptr) return done(unavailable);
  absl::StatusOr<compiler::LauncherRequest> launcher =
      caller.same_local_user ? ToLauncherRequest(request) : RemoteLauncherRequest(request, *builder);
  if (!launcher.ok()) return done(launcher.status());
  BuildLauncher(*std::move(launcher), *builder,
                [this, request, caller, done = std::move(done)](absl::StatusOr<CompileOutcome> outcome) {
                  if (outcome.ok() && std::holds_alternative<cache::CacheEntry>(outcome->result)) {
                    KeepLauncherRecipe(request, caller);
                  }
                  done(std::move(outcome));
                });
}

void CompileCoordinator::KeepLauncherRecipe(const v1::BuildLauncherRequest& request, const Caller& caller) {
  if (request.triton_key().empty() || request.origin().generator_case() == v1::LauncherOrigin::GENERATOR_NOT_SET) {
    return;  // not one of Triton's own launchers: nothing to make it again from
  }
  v1::BuildLauncherRequest recipe;
  recipe.set_module_name(request.module_name());
  recipe.set_triton_key(request.triton_key());
  *recipe.mutable_origin() = request.origin();
  std::string bytes;
  recipe.SerializeToString(&bytes);
  const std::string key = DigestHex(DigestBytes(Sha256(bytes)));
  const std::string ns = ScopedNamespace(caller, kLauncherRecipeNamespace);
  {
    std::lock_guard lock(recipes_mutex_);
    if (!recipes_kept_.insert(absl::StrCat(ns, "/", key)).second) return;
  }
  // Off the caller's path: a recipe lost is a launcher built at first use.
  storing_.Schedule([this, ns, key, bytes = std::move(bytes)]() mutable {
    std::vector<cache::BlobInput> blobs;
    blobs.push_back({std::string(kLauncherRecipeBlob), std::move(bytes), ""});
    if (absl::Status kept = store_.Put(ns, key, std::move(blobs)).status(); !kept.ok()) {
      spdlog::debug("launcher recipe {}/{} not kept: {}", ns, key, kept.message());
    }
  });
}

void CompileCoordinator::BuildLauncherAhead(v1::BuildLauncherRequest recipe,
                                            std::function<void(absl::Status)> done) {
  threads_.Schedule(
      [this, recipe = std::move(recipe), done = std::move(done)] {
        std::shared_ptr<const compiler::LauncherBuilder> builder;
        {
          std::lock_guard lock(launcher_mutex_);
          builder = launcher_builder_;
        }
        if (builder == nullptr) return done(absl::FailedPreconditionError("this kilnd builds no launchers"));
        absl::StatusOr<LauncherFromOrigin> generated = GeneratedLauncherRequest(recipe, *builder);
        if (!generated.ok()) return done(generated.status());
        BuildLauncher(std::move(generated->launcher), *builder, [done](absl::StatusOr<CompileOutcome> outcome) {
          if (!outcome.ok()) return done(outcome.status());
          if (auto* failure = std::get_if<compiler::CompileFailure>(&outcome->result)) {
            return done(absl::AbortedError(failure->message));
          }
          done(absl::OkStatus());
        });
      },
      ThreadPool::kBackground);
}

absl::StatusOr<CompileCoordinator::LauncherFromOrigin> CompileCoordinator::GeneratedLauncherRequest(
    const v1::BuildLauncherRequest& request, const compiler::LauncherBuilder& builder) {
  ASSIGN_OR_RETURN(compiler::WorkerPool * pool, toolchains_.Find(request.triton_key()));
  compiler::LauncherSourceJob job;
  job.make_launcher_args = request.origin().make_launcher_args();
  job.cuda_utils = request.origin().cuda_utils();
  ASSIGN_OR_RETURN(compiler::GeneratedLauncher generated, pool->LauncherSource(job));
  LauncherFromOrigin made{{request.module_name(), std::move(generated.source), std::move(generated.abi),
                           std::move(generated.include_dirs), std::move(generated.library_dirs),
                           std::move(generated.libraries)},
                          pool->info().triton_version};
  RETURN_IF_ERROR(LinkStubWithoutDriver(builder.environment(), made.launcher));
  return made;
}

absl::StatusOr<compiler::LauncherRequest> CompileCoordinator::RemoteLauncherRequest(
    const v1::BuildLauncherRequest& request, const compiler::LauncherBuilder& builder) {
  // A remote client's C is never compiled here (an #include of this machine's
  // files would hand them over): its Triton's generator runs here instead.
  if (request.triton_key().empty() ||
      request.origin().generator_case() == v1::LauncherOrigin::GENERATOR_NOT_SET) {
    return absl::FailedPreconditionError(
        "kilnd builds a remote client's launcher only from what generated its source: send "
        "triton_key and origin (the kiln Python client does for Triton's own launchers); build "
        "this one on the client");
  }
  ASSIGN_OR_RETURN(LauncherFromOrigin generated, GeneratedLauncherRequest(request, builder));
  const v1::PythonAbi& client = request.python_abi();
  const compiler::PythonAbi& farm = generated.launcher.abi;
  if (client.version() != farm.version || client.abiflags() != farm.abiflags ||
      client.ext_suffix() != farm.ext_suffix || client.platform() != farm.platform) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "this kilnd's toolchain of your Triton (%s) is Python %s%s on %s (%s); you run Python "
        "%s%s on %s (%s). Register a toolchain of your Python and Triton version on this machine "
        "(toolchain = PATH in kilnd.conf), or build launchers on the client",
        generated.triton_version, farm.version, farm.abiflags, farm.platform, farm.ext_suffix,
        client.version(), client.abiflags(), client.platform(), client.ext_suffix()));
  }
  if (generated.launcher.c_source != request.c_source()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the launcher source sent is not what this kilnd's Triton %s generates from its origin; "
        "kilnd builds a remote client's launcher only from source it generated itself (is the "
        "client's Triton patched?)",
        generated.triton_version));
  }
  return std::move(generated.launcher);
}

void CompileCoordinator::BuildLauncher(compiler::LauncherRequest launcher,
                                       const compiler::LauncherBuilder& builder, Done done) {
  const std::string shared_key = builder.CacheKey(launcher);
  absl::StatusOr<std::optional<cache::CacheEntry>> hit =
      LookupShared(kLauncherNamespace, shared_key, {}, Alias{});
  if (!hit.ok()) return done(hit.status());
  if (hit->has_value()) {
    launcher_cache_hits_.fetch_add(1);
    return done(CompileOutcome{**std::move(hit), true, "", {}});
  }
  auto finish = [done](const absl::StatusOr<Produced>& produced) {
    if (!produced.ok()) return done(produced.status());
    if (produced->failure.has_value()) return done(CompileOutcome{*produced->failure, false, "", {}});
    done(CompileOutcome{produced->entry, false, "", {}});
  };
  bool joined = false;
  RunOnce(absl::StrCat("launcher:", shared_key), std::move(finish), &joined,
          [&]() -> absl::StatusOr<Produced> {
            launcher_builds_.fetch_add(1);
            ASSIGN_OR_RETURN(auto built, builder.Build(launcher));
            Produced produced;
            if (auto* failure = std::get_if<compiler::CompileFailure>(&built)) {
              produced.failure = *failure;
              return produced;
            }
            ASSIGN_OR_RETURN(produced.entry,
                             StoreShared(kLauncherNamespace, shared_key,
                                         {{launcher.module_name + launcher.abi.ext_suffix,
                                           std::move(std::get<std::string>(built))}}));
            return produced;
          });
}

void CompileCoordinator::RequestStop() {
  results_.StopWaiting();
  toolchains_.StopWorkers();
}

std::optional<cache::SharedTierStats> CompileCoordinator::SharedTierStats() const {
  return results_.SharedStats();
}

CoordinatorStats CompileCoordinator::Stats() const {
  return {compiles_.load(),
          compile_cache_hits_.load(),
          single_flight_joins_.load(),
          compile_failures_.load(),
          launcher_builds_.load(),
          launcher_cache_hits_.load(),
          static_cast<double>(compile_micros_.load()) / 1e6};
}

}  // namespace kiln::service
