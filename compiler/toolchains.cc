#include "compiler/toolchains.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace kiln::compiler {
namespace {

namespace fs = std::filesystem;

// Identifying a toolchain imports triton (a few seconds when cold).
constexpr absl::Duration kHelloTimeout = absl::Minutes(2);

using Kind = CompileFailure::Kind;

const std::map<std::string, Kind, std::less<>>& FailureKinds() {
  static const auto* kinds = new std::map<std::string, Kind, std::less<>>{
      {"compilation_error", Kind::kCompilationError},
      {"ptxas_error", Kind::kPtxasError},
      {"out_of_resources", Kind::kOutOfResources},
  };
  return *kinds;
}

int DefaultWorkers() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

// The reply's part of that name, or null.
const std::string* PartNamed(const Parts& parts, absl::string_view name) {
  const auto found = std::find_if(parts.begin(), parts.end(),
                                  [name](const auto& part) { return part.first == name; });
  return found == parts.end() ? nullptr : &found->second;
}

}  // namespace

WorkerPool::WorkerPool(ToolchainInfo info, PoolOptions options)
    : info_(std::move(info)), options_(std::move(options)) {
  retirer_ = std::thread([this] { RetireIdleLoop(); });
}

WorkerPool::~WorkerPool() {
  {
    std::unique_lock lock(mutex_);
    stopping_ = true;
    changed_.wait(lock, [this] { return starting_ == 0; });  // their threads use this pool
  }
  changed_.notify_all();
  retirer_.join();
  // Workers see end of input and exit; the destructors reap them.
  idle_.clear();
}

void WorkerPool::Stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    for (WorkerProcess* worker : busy_) worker->Abandon();
  }
  changed_.notify_all();
}

void WorkerPool::Warm() {
  std::lock_guard lock(mutex_);
  if (live_ == 0 && !stopping_) StartWorkerLocked();
}

bool WorkerPool::HasIdleWorker() {
  std::lock_guard lock(mutex_);
  return idle_.size() > waiting_.size();
}

bool WorkerPool::HasStartedWorker() {
  std::lock_guard lock(mutex_);
  return live_ > starting_;
}

void WorkerPool::Adopt(std::unique_ptr<WorkerProcess> worker) {
  {
    std::lock_guard lock(mutex_);
    ++live_;
    ++stats_.workers_started;
    idle_.push_back(std::move(worker));
  }
  changed_.notify_all();
}

bool WorkerPool::InteractiveWaitsLocked() const {
  return std::any_of(waiting_.begin(), waiting_.end(), [](const Waiter& waiter) { return waiter.interactive; });
}

bool WorkerPool::IsNextLocked(uint64_t ticket) const {
  const bool interactive_waits = InteractiveWaitsLocked();
  // The requester with the fewest jobs on workers, then the one served least
  // lately (never: first), then the longest waiting job: round robin among
  // the processes waiting.
  const Waiter* next = nullptr;
  std::pair<int, int64_t> next_rank;
  for (const Waiter& waiter : waiting_) {  // oldest first
    // Background jobs take a worker only while no interactive job waits for one.
    if (interactive_waits && !waiter.interactive) continue;
    const auto requester = requesters_.find(waiter.requester);
    const std::pair<int, int64_t> rank =
        requester == requesters_.end()
            ? std::pair<int, int64_t>{0, -1}
            : std::pair<int, int64_t>{requester->second.on_workers, requester->second.last_served};
    if (next == nullptr || rank < next_rank) {
      next = &waiter;
      next_rank = rank;
    }
  }
  return next != nullptr && next->ticket == ticket;
}

absl::StatusOr<std::unique_ptr<WorkerProcess>> WorkerPool::Acquire(Priority priority,
                                                                    const std::string& requester) {
  const int max_workers = options_.max_workers > 0 ? options_.max_workers : DefaultWorkers();
  std::unique_lock lock(mutex_);
  const bool interactive = priority == Priority::kInteractive;
  const uint64_t ticket = next_ticket_++;
  const auto me = waiting_.insert(waiting_.end(), Waiter{ticket, requester, interactive});
  const uint64_t failures_before = start_failures_;
  bool grew = false;
  absl::Status unservable;
  while (true) {
    if (stopping_) {
      unservable = absl::UnavailableError("kilnd is stopping: no compile starts now");
      break;
    }
    if (!idle_.empty() && IsNextLocked(ticket)) break;
    // A job that finds no idle worker grows the pool by one, but takes whichever
    // worker is ready first: a busy one usually finishes its job long before a
    // new one has imported triton (seconds, on a machine busy compiling).
    const bool may_grow = interactive || !InteractiveWaitsLocked();
    if (may_grow && !grew && live_ < max_workers) {
      StartWorkerLocked();
      grew = true;
    }
    if (live_ == 0 && start_failures_ != failures_before) {  // nothing left to wait for
      unservable = last_start_failure_;
      break;
    }
    changed_.wait(lock);
  }
  waiting_.erase(me);
  changed_.notify_all();  // the next waiter may be one that was behind this one
  if (!unservable.ok()) return unservable;
  Requester& served = requesters_[requester];
  ++served.on_workers;
  served.last_served = static_cast<int64_t>(next_grant_++);
  std::unique_ptr<WorkerProcess> worker = std::move(idle_.back());
  idle_.pop_back();
  busy_.insert(worker.get());
  return worker;
}

void WorkerPool::StartWorkerLocked() {
  ++live_;
  ++starting_;
  std::thread([this] {
    absl::StatusOr<std::unique_ptr<WorkerProcess>> started = StartReadyWorker();
    std::lock_guard lock(mutex_);
    --starting_;
    if (started.ok()) {
      ++stats_.workers_started;
      idle_.push_back(*std::move(started));
    } else {
      --live_;
      ++start_failures_;
      last_start_failure_ = started.status();
    }
    changed_.notify_all();  // last use of the pool: its destructor waits for this
  }).detach();
}

absl::StatusOr<std::unique_ptr<WorkerProcess>> WorkerPool::StartReadyWorker() {
  ASSIGN_OR_RETURN(std::unique_ptr<WorkerProcess> worker,
                   WorkerProcess::Start(info_.python_executable, options_.worker_script));
  // It answers once its imports are done.
  worker::Request ping;
  ping.set_op("ping");
  absl::StatusOr<WorkerReply> reply = worker->Call(ping, {}, kHelloTimeout);
  if (!reply.ok() || !reply->header.ok()) {
    return absl::UnavailableError(absl::StrFormat(
        "a new compile worker of %s did not start: %s", info_.python_executable,
        reply.ok() ? reply->header.message() : reply.status().message()));
  }
  return worker;
}

void WorkerPool::Release(std::unique_ptr<WorkerProcess> worker, const std::string& requester) {
  {
    std::lock_guard lock(mutex_);
    busy_.erase(worker.get());
    if (auto served = requesters_.find(requester);
        served != requesters_.end() && --served->second.on_workers == 0 &&
        std::none_of(waiting_.begin(), waiting_.end(),
                     [&](const Waiter& waiter) { return waiter.requester == requester; })) {
      requesters_.erase(served);  // nothing of it left: a later job starts afresh
    }
    if (worker->broken()) {
      --live_;
      ++stats_.workers_lost;
    } else {
      idle_.push_back(std::move(worker));
    }
  }
  // All waiters re-check: an interactive one may be behind a background one.
  changed_.notify_all();
}

void WorkerPool::RetireIdleLoop() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    changed_.wait_for(lock, absl::ToChronoSeconds(std::max(absl::Seconds(1),
                                                           options_.idle_timeout / 4)));
    const absl::Time cutoff = absl::Now() - options_.idle_timeout;
    const auto expired = std::stable_partition(idle_.begin(), idle_.end(), [&](const auto& worker) {
      return worker->last_used() > cutoff;
    });
    // The pool keeps one worker however long it idles: a compile after a quiet
    // spell would otherwise wait seconds for a new worker to import triton,
    // which a stock Triton process that has run once never pays again.
    const int retired = std::max(0, std::min(static_cast<int>(idle_.end() - expired), live_ - 1));
    idle_.erase(expired, expired + retired);
    live_ -= retired;
    stats_.workers_retired += static_cast<uint64_t>(retired);
  }
}

absl::StatusOr<std::variant<WorkerReply, CompileFailure>> WorkerPool::CompileOnWorker(
    const worker::Request& request, const Parts& parts, Priority priority,
    const std::string& requester) {
  absl::StatusOr<WorkerReply> reply = Call(request, parts, priority, requester);
  if (!reply.ok()) {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      return absl::UnavailableError("kilnd is stopping: the compile was abandoned");
    }
  }
  if (absl::IsDeadlineExceeded(reply.status())) {
    return CompileFailure{Kind::kTimeout, std::string(reply.status().message()), ""};
  }
  if (absl::IsUnavailable(reply.status()) || absl::IsAborted(reply.status())) {
    return CompileFailure{Kind::kWorkerCrashed, std::string(reply.status().message()), ""};
  }
  RETURN_IF_ERROR(reply.status());
  const worker::Reply& header = reply->header;
  if (header.ok()) return *std::move(reply);
  const auto kind = FailureKinds().find(header.kind());
  if (kind == FailureKinds().end()) {
    return absl::InvalidArgumentError(header.message());
  }
  return CompileFailure{kind->second, header.message(), header.log()};
}

absl::StatusOr<CompileResult> WorkerPool::Compile(const CompileJob& job) {
  worker::Request request;
  request.set_op("compile");
  *request.mutable_target() = job.target;
  request.set_stage(job.stage);
  request.set_options_json(job.options_json);
  request.mutable_env()->insert(job.env.begin(), job.env.end());
  request.mutable_tool_env()->insert(job.tool_env.begin(), job.tool_env.end());
  request.set_hash(job.hash);
  request.set_metadata_json(job.metadata_json);
  ASSIGN_OR_RETURN(auto compiled,
                   CompileOnWorker(request, {{"ir", job.ir}}, job.priority, job.requester));
  if (auto* failure = std::get_if<CompileFailure>(&compiled)) return std::move(*failure);
  auto& reply = std::get<WorkerReply>(compiled);
  CompileOutput output;
  output.artifacts = std::move(reply.parts);
  output.ptxas_log = reply.header.ptxas_log();
  output.stage_seconds.insert(reply.header.timings().begin(), reply.header.timings().end());
  output.warnings.assign(reply.header.warnings().begin(), reply.header.warnings().end());
  return output;
}

absl::StatusOr<std::variant<InductorKernels, CompileFailure>> WorkerPool::InductorKernel(
    const InductorKernelJob& job) {
  worker::Request request;
  request.set_op("inductor_kernel");
  request.set_kernel_name(job.kernel_name);
  request.set_inductor_cache_dir(job.inductor_cache_dir);
  request.mutable_ptxas_versions()->insert(job.ptxas_versions.begin(), job.ptxas_versions.end());
  request.mutable_env()->insert(job.env.begin(), job.env.end());
  request.mutable_tool_env()->insert(job.tool_env.begin(), job.tool_env.end());
  ASSIGN_OR_RETURN(auto compiled,
                   CompileOnWorker(request, {{"source", job.source}}, job.priority, job.requester));
  if (auto* failure = std::get_if<CompileFailure>(&compiled)) return std::move(*failure);
  auto& reply = std::get<WorkerReply>(compiled);
  InductorKernels kernels;
  for (auto& [name, data] : reply.parts) {
    const size_t slash = name.find('/');
    if (slash == std::string::npos || slash == 0 || slash + 1 == name.size()) {
      return absl::InternalError(
          absl::StrFormat("the worker named a kernel's file '%s', not KEY/FILE", name));
    }
    kernels.files_by_key[name.substr(0, slash)].emplace_back(name.substr(slash + 1),
                                                             std::move(data));
  }
  const auto& timings = reply.header.timings();
  if (const auto seconds = timings.find("inductor_kernel"); seconds != timings.end()) {
    kernels.seconds = seconds->second;
  }
  return kernels;
}

absl::StatusOr<WorkerReply> WorkerPool::Call(const worker::Request& request, const Parts& parts,
                                             Priority priority, const std::string& requester) {
  absl::StatusOr<WorkerReply> reply = absl::AbortedError("no worker tried");
  // An idle worker may have died (killed, OOM) since its last job; the job
  // then never ran, so it moves on to another worker.
  for (int attempt = 0; attempt < 3 && absl::IsAborted(reply.status()); ++attempt) {
    ASSIGN_OR_RETURN(std::unique_ptr<WorkerProcess> worker, Acquire(priority, requester));
    reply = worker->Call(request, parts, options_.job_timeout);
    Release(std::move(worker), requester);
  }
  std::lock_guard lock(mutex_);
  ++stats_.jobs;
  return reply;
}

absl::StatusOr<WorkerReply> WorkerPool::Ask(const worker::Request& request, const Parts& parts,
                                            Priority priority, absl::string_view what) {
  absl::StatusOr<WorkerReply> reply = Call(request, parts, priority);
  if (!reply.ok()) {
    return absl::UnavailableError(absl::StrFormat("the %s toolchain's worker did not answer for %s: %s",
                                                  info_.python_executable, what,
                                                  reply.status().message()));
  }
  if (!reply->header.ok()) return absl::InvalidArgumentError(reply->header.message());
  return reply;
}

absl::StatusOr<GeneratedLauncher> WorkerPool::LauncherSource(const LauncherSourceJob& job) {
  worker::Request request;
  request.set_op("launcher_source");
  request.set_make_launcher_args(job.make_launcher_args);
  request.set_cuda_utils(job.cuda_utils);
  ASSIGN_OR_RETURN(WorkerReply reply,
                   Ask(request, {}, Priority::kInteractive, "the launcher source"));
  const std::string* source = PartNamed(reply.parts, "source");
  if (source == nullptr) return absl::InternalError("the worker sent no launcher source");
  const worker::LauncherBuild& build = reply.header.launcher();
  GeneratedLauncher launcher;
  launcher.source = *source;
  launcher.abi = {build.python_version(), build.abiflags(), build.ext_suffix(), build.platform(),
                  build.python_include_dir()};
  launcher.include_dirs.assign(build.include_dirs().begin(), build.include_dirs().end());
  launcher.library_dirs.assign(build.library_dirs().begin(), build.library_dirs().end());
  launcher.libraries.assign(build.libraries().begin(), build.libraries().end());
  return launcher;
}

absl::StatusOr<Retargeted> WorkerPool::Retarget(const RetargetJob& job, Priority priority) {
  worker::Request request;
  request.set_op("retarget");
  request.set_key_inputs_json(job.key_inputs_json);
  *request.mutable_target() = job.target;
  ASSIGN_OR_RETURN(WorkerReply reply,
                   Ask(request, {{"ir", job.frontend_ir}}, priority, "the recorded kernel"));
  const worker::Reply& header = reply.header;
  Retargeted retargeted{header.skipped(), header.cache_key(), header.options_json(),
                        header.key_inputs_json(), "",
                        {header.tool_env().begin(), header.tool_env().end()}};
  if (!retargeted.skipped.empty()) return retargeted;
  const std::string* ir = PartNamed(reply.parts, "ir");
  if (ir == nullptr || retargeted.cache_key.empty()) {
    return absl::InternalError("the worker's retarget reply lacks the key or the TTIR");
  }
  retargeted.frontend_ir = *ir;
  return retargeted;
}

PoolStats WorkerPool::Stats() {
  std::lock_guard lock(mutex_);
  PoolStats stats = stats_;
  stats.live_workers = static_cast<uint64_t>(live_);
  return stats;
}

ToolchainRegistry::ToolchainRegistry(PoolOptions options, fs::path probe_memo_file)
    : options_(std::move(options)), memo_(std::move(probe_memo_file)) {}

WorkerPool& ToolchainRegistry::PoolOfLocked(const ToolchainInfo& info, bool& is_new) {
  key_by_python_[info.python_executable] = info.triton_key;
  auto [pool, inserted] = pools_.try_emplace(info.triton_key);
  is_new = inserted;
  if (inserted) {
    pool->second = std::make_unique<WorkerPool>(info, options_);
    if (workers_stopped_) pool->second->Stop();
  }
  return *pool->second;
}

ToolchainRegistry::~ToolchainRegistry() { StopWorkers(); }

absl::StatusOr<fs::path> ToolchainRegistry::InterpreterPath(const fs::path& given_python) {
  // One interpreter, one name: a client's sys.executable may be
  // /venv/bin/../bin/python, and kilnd's configuration normalizes its own.
  fs::path python_executable = given_python.lexically_normal();
  std::error_code error;
  if (!python_executable.is_absolute() || !fs::is_regular_file(python_executable, error)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "toolchain interpreter '%s' is not an absolute path to an existing file; give the full "
        "path of the Python that has triton installed (e.g. /path/to/venv/bin/python)",
        python_executable.string()));
  }
  return python_executable;
}

std::optional<ToolchainInfo> ToolchainRegistry::RegisterRemembered(const fs::path& python_executable,
                                                                   absl::string_view expected_triton_key) {
  std::optional<ToolchainInfo> known = memo_.Recall(python_executable);
  if (!known || (!expected_triton_key.empty() && known->triton_key != expected_triton_key)) {
    return std::nullopt;
  }
  std::lock_guard lock(mutex_);
  bool is_new = false;
  WorkerPool& pool = PoolOfLocked(*known, is_new);
  pool.Warm();
  return pool.info();
}

std::optional<ToolchainInfo> ToolchainRegistry::RegisteredLocked(const fs::path& python_executable,
                                                                 absl::string_view expected_triton_key) {
  const auto known = key_by_python_.find(python_executable.string());
  if (known == key_by_python_.end()) return std::nullopt;
  if (!expected_triton_key.empty() && known->second != expected_triton_key) return std::nullopt;
  return pools_.at(known->second)->info();
}

absl::StatusOr<ToolchainInfo> ToolchainRegistry::Register(const fs::path& given_python,
                                                          absl::string_view expected_triton_key) {
  ASSIGN_OR_RETURN(const fs::path python_executable, InterpreterPath(given_python));
  if (std::optional<ToolchainInfo> known = RegisterRemembered(python_executable, expected_triton_key)) {
    return *known;
  }
  {
    // A probe of this interpreter under way (one begun in the background)
    // is waited for, not run twice.
    std::unique_lock lock(mutex_);
    AwaitProbesLocked(lock, [&] { return !probes_.contains(python_executable.string()); });
    if (std::optional<ToolchainInfo> probed = RegisteredLocked(python_executable, expected_triton_key)) {
      return *probed;
    }
    probes_[python_executable.string()] = nullptr;
  }
  absl::StatusOr<ToolchainInfo> outcome = Probe(python_executable);
  EndProbe(python_executable);
  return outcome;
}

bool ToolchainRegistry::RegisterInBackground(
    const fs::path& given_python, absl::string_view expected_triton_key,
    std::function<void(const absl::StatusOr<ToolchainInfo>&)> registered) {
  absl::StatusOr<fs::path> python_executable = InterpreterPath(given_python);
  if (!python_executable.ok()) {
    registered(python_executable.status());
    return true;
  }
  if (std::optional<ToolchainInfo> known = RegisterRemembered(*python_executable, expected_triton_key)) {
    registered(*known);
    return true;
  }
  std::optional<ToolchainInfo> probed;
  {
    std::lock_guard lock(mutex_);
    if (probes_.contains(python_executable->string())) return false;
    probed = RegisteredLocked(*python_executable, expected_triton_key);
    if (!probed) {
      probes_[python_executable->string()] = nullptr;
      // The probe ends once `registered` is done, so that what waits for it
      // finds what `registered` did (the launchers' compilers) done too.
      probe_threads_.emplace_back([this, python = *std::move(python_executable),
                                   registered = std::move(registered)] {
        registered(Probe(python));
        EndProbe(python);
      });
      return false;
    }
  }
  registered(*probed);
  return true;
}

bool ToolchainRegistry::AnyProbeUnderWay() {
  std::lock_guard lock(mutex_);
  return !probes_.empty();
}

void ToolchainRegistry::WaitForProbes() {
  std::unique_lock lock(mutex_);
  AwaitProbesLocked(lock);
}

void ToolchainRegistry::EndProbe(const fs::path& python_executable) {
  std::lock_guard lock(mutex_);
  probes_.erase(python_executable.string());
  probe_ended_.notify_all();
}

absl::StatusOr<ToolchainInfo> ToolchainRegistry::Probe(const fs::path& python_executable) {
  const std::string name = python_executable.string();
  std::unique_ptr<WorkerProcess> worker;
  absl::StatusOr<std::unique_ptr<WorkerProcess>> started =
      WorkerProcess::Start(python_executable, options_.worker_script);
  absl::StatusOr<ToolchainInfo> outcome = absl::UnknownError("not probed");
  if (!started.ok()) {
    outcome = started.status();
  } else {
    worker = *std::move(started);
    {
      std::lock_guard lock(mutex_);
      if (workers_stopped_) worker->Abandon();  // a stop came first: no probe to wait for
      probes_[name] = worker.get();
    }
    worker::Request hello;
    hello.set_op("hello");
    absl::StatusOr<WorkerReply> reply = worker->Call(hello, {}, kHelloTimeout);
    if (!reply.ok() || !reply->header.ok()) {
      outcome = absl::FailedPreconditionError(absl::StrFormat(
          "%s cannot run Kiln's worker (is triton installed for it?): %s", name,
          reply.ok() ? reply->header.message() : std::string(reply.status().message())));
    } else {
      const worker::Reply& header = reply->header;
      outcome = ToolchainInfo{header.triton_key(), header.triton_version(), name,
                              header.python_version(),
                              std::vector<std::string>(header.backends().begin(), header.backends().end()),
                              header.triton_dir()};
      memo_.Remember(*outcome);
    }
  }
  std::lock_guard lock(mutex_);
  // Its worker goes to the pool or away: a stop has nothing of it to abandon.
  probes_[name] = nullptr;
  if (!outcome.ok()) return outcome;
  bool is_new = false;
  WorkerPool& pool = PoolOfLocked(*outcome, is_new);
  if (is_new) pool.Adopt(std::move(worker));  // the probe's worker is the pool's first
  return pool.info();
}

absl::StatusOr<WorkerPool*> ToolchainRegistry::Find(absl::string_view triton_key,
                                                    bool wait_for_probes) {
  std::unique_lock lock(mutex_);
  const auto found = [&] { return pools_.find(triton_key) != pools_.end(); };
  if (wait_for_probes) AwaitProbesLocked(lock, found);
  if (auto pool = pools_.find(triton_key); pool != pools_.end()) return pool->second.get();
  std::vector<std::string> available;
  for (const auto& [key, pool] : pools_) {
    available.push_back(absl::StrFormat("triton %s at %s (key %s...)", pool->info().triton_version,
                                        pool->info().python_executable, key.substr(0, 24)));
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "no registered toolchain has triton key %s...; available: %s. Register the client's Python "
      "with `toolchain = /path/to/python` in kilnd.conf or --toolchain",
      triton_key.substr(0, 24), available.empty() ? "none" : absl::StrJoin(available, "; ")));
}

bool ToolchainRegistry::IsRegisteredAs(const std::string& python_executable,
                                       absl::string_view triton_key) {
  std::lock_guard lock(mutex_);
  const auto known = key_by_python_.find(fs::path(python_executable).lexically_normal().string());
  return known != key_by_python_.end() && known->second == triton_key;
}

std::vector<ToolchainInfo> ToolchainRegistry::List(bool wait_for_probes) {
  std::unique_lock lock(mutex_);
  if (wait_for_probes) AwaitProbesLocked(lock);
  std::vector<ToolchainInfo> infos;
  for (const auto& [key, pool] : pools_) infos.push_back(pool->info());
  return infos;
}

void ToolchainRegistry::StopWorkers() {
  std::vector<std::thread> probe_threads;
  {
    std::lock_guard lock(mutex_);
    workers_stopped_ = true;
    for (const auto& [python, probe] : probes_) {
      if (probe != nullptr) probe->Abandon();
    }
    for (const auto& [key, pool] : pools_) pool->Stop();
    probe_threads.swap(probe_threads_);
  }
  // Abandoned, they end at once; their callbacks are done when this returns.
  for (std::thread& probe : probe_threads) probe.join();
}

PoolStats ToolchainRegistry::TotalStats() {
  std::vector<WorkerPool*> pools;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [key, pool] : pools_) pools.push_back(pool.get());
  }
  PoolStats total;
  for (WorkerPool* pool : pools) {
    const PoolStats stats = pool->Stats();
    total.jobs += stats.jobs;
    total.workers_started += stats.workers_started;
    total.workers_lost += stats.workers_lost;
    total.workers_retired += stats.workers_retired;
    total.live_workers += stats.live_workers;
  }
  return total;
}

}  // namespace kiln::compiler
