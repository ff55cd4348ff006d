#ifndef KILN_COMPILER_TOOLCHAINS_H_
#define KILN_COMPILER_TOOLCHAINS_H_

// Triton toolchains (a Python interpreter with a given `triton`) and their pools
// of worker processes. Knows nothing of gRPC or of the cache.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "compiler/build_environment.h"
#include "compiler/toolchain_info.h"
#include "compiler/toolchain_memo.h"
#include "compiler/worker_process.h"

namespace kiln::compiler {

struct PoolOptions {
  std::filesystem::path worker_script;
  int max_workers = 0;  // per toolchain; 0 = CPU count
  absl::Duration idle_timeout = absl::Minutes(10);
  absl::Duration job_timeout = absl::Minutes(10);
};

// A caller blocked on the result goes before background work (prefetch,
// multi-target fan-out) when workers are scarce.
enum class Priority { kInteractive, kBackground };

struct CompileJob {
  Priority priority = Priority::kInteractive;
  worker::Target target;
  std::string stage = "ttir";  // stage of `ir`
  std::string ir;
  std::string options_json;
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> tool_env;  // the client's ptxas (kiln.v1.CompileRequest.tool_paths)
  std::string hash;  // the client's Triton cache key, recorded in metadata
  // Triton's metadata as the client's earlier stages left it; empty: start
  // from the options (see kiln.v1.CompileRequest.metadata_json).
  std::string metadata_json;
  // Whose job it is (a process of a trust domain): workers are shared fairly
  // among requesters when scarce.
  std::string requester;
};

// Artifacts named as Triton's cache names them: "<kernel>.ttgir", "<kernel>.json", ...
struct CompileOutput {
  Parts artifacts;
  std::string ptxas_log;  // ptxas -v: registers, spills, shared memory
  std::map<std::string, double> stage_seconds;
  std::vector<std::string> warnings;  // what the worker mended on the way, for the log
};

// A compile that failed because of the kernel (or killed its worker).
struct CompileFailure {
  enum class Kind { kCompilationError, kPtxasError, kOutOfResources, kWorkerCrashed, kTimeout };
  Kind kind;
  std::string message;
  std::string log;
};

using CompileResult = std::variant<CompileOutput, CompileFailure>;

// A launcher to make from what the client's Triton generated it from
// (kiln.v1.LauncherOrigin): make_launcher's arguments, or cuda_utils.
struct LauncherSourceJob {
  std::string make_launcher_args;
  bool cuda_utils = false;
};

// The source a toolchain's Triton generates for a launcher, and how its
// Python builds it: ready to be a LauncherRequest.
struct GeneratedLauncher {
  std::string source;
  PythonAbi abi;
  std::vector<std::string> include_dirs;
  std::vector<std::string> library_dirs;
  std::vector<std::string> libraries;
};

// A kernel recorded for one target (its frontend TTIR and kiln.v1.KeyInputs
// as JSON), to compile for `target`.
struct RetargetJob {
  std::string key_inputs_json;
  worker::Target target;
  std::string frontend_ir;
};

// What a compile of a recorded kernel for another target takes, or why the
// recording does not serve that target (`skipped`).
struct Retargeted {
  std::string skipped;
  std::string cache_key;  // the key a client of the target computes
  std::string options_json;
  std::string key_inputs_json;  // of the new entry
  std::string frontend_ir;  // to compile (loop variables keep their names)
  std::map<std::string, std::string> tool_env;  // the ptxas its key names, when not Triton's own
};

// A torch.compile kernel: the Python module inductor generated for it, whose
// every config a worker compiles as inductor's compile pool does. The module
// is the client's program: kilnd runs it only for its own user.
struct InductorKernelJob {
  Priority priority = Priority::kInteractive;
  std::string kernel_name;
  std::string source;
  std::string inductor_cache_dir;  // the client's: the cubins' line info names the module's file there
  std::map<int, std::string> ptxas_versions;  // the client's, per arch: its kernels' keys hold them
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> tool_env;
  std::string requester;
};

// Each config's kernel as stock Triton caches it: its key (hex, as kilnd keys
// Triton's kernels) and its files, named as in Triton's cache.
struct InductorKernels {
  std::map<std::string, Parts> files_by_key;
  double seconds = 0;  // the worker's time on the module
};

struct PoolStats {
  uint64_t jobs = 0;
  uint64_t workers_started = 0;
  uint64_t workers_lost = 0;  // crashed or killed on timeout
  uint64_t workers_retired = 0;
  uint64_t live_workers = 0;
};

// Long-lived workers of one toolchain, at most max_workers at once, started on
// demand and retired after idle_timeout, but for the last one. Compile()
// blocks its caller (one of kilnd's compile threads, never a gRPC thread).
class WorkerPool {
 public:
  WorkerPool(ToolchainInfo info, PoolOptions options);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // INVALID_ARGUMENT when the worker rejects the request itself (e.g. an
  // unknown target); FAILED_PRECONDITION when no worker can be started.
  absl::StatusOr<CompileResult> Compile(const CompileJob& job);

  // INVALID_ARGUMENT when this Triton generates no launcher from the job's
  // arguments; UNAVAILABLE when no worker could answer.
  absl::StatusOr<GeneratedLauncher> LauncherSource(const LauncherSourceJob& job);

  // INVALID_ARGUMENT when the recording is malformed; UNAVAILABLE when no
  // worker could answer.
  absl::StatusOr<Retargeted> Retarget(const RetargetJob& job, Priority priority);

  // A CompileFailure when the module fails to load or no config compiles;
  // INVALID_ARGUMENT when the worker refuses the job; UNAVAILABLE when no
  // worker could answer.
  absl::StatusOr<std::variant<InductorKernels, CompileFailure>> InductorKernel(
      const InductorKernelJob& job);

  // Adds an already started worker (registration's identifying worker) as idle.
  void Adopt(std::unique_ptr<WorkerProcess> worker);
  // Starts a worker now unless one is live or starting: the first job then
  // waits for what is left of its start, not all of it.
  void Warm();
  // Whether a worker has started and lives (busy or not): a job would not
  // wait for an interpreter's start.
  bool HasStartedWorker();
  // Whether a job asking now would get a worker without waiting: more are
  // idle than jobs wait for one.
  bool HasIdleWorker();

  // For kilnd's stop, which must take seconds whatever is compiling: kills the
  // workers running jobs, whose callers get UNAVAILABLE (never a
  // CompileFailure: nothing is recorded of an abandoned compile), and so do
  // all later jobs.
  void Stop();

  const ToolchainInfo& info() const { return info_; }
  PoolStats Stats();

 private:
  // Runs one job on a worker: on another one if the worker it got had died
  // idle (the job never ran there).
  absl::StatusOr<WorkerReply> Call(const worker::Request& request, const Parts& parts,
                                   Priority priority, const std::string& requester = "");
  // Call for a compiling job: a timeout, a lost worker and the kernel's own
  // failures (as the worker classed them) are a CompileFailure; any other
  // failure the worker declares is INVALID_ARGUMENT.
  absl::StatusOr<std::variant<WorkerReply, CompileFailure>> CompileOnWorker(
      const worker::Request& request, const Parts& parts, Priority priority,
      const std::string& requester);
  // Call for a job whose refusal is the request's fault: INVALID_ARGUMENT with
  // the worker's message; UNAVAILABLE naming `what` when no worker answered.
  absl::StatusOr<WorkerReply> Ask(const worker::Request& request, const Parts& parts,
                                  Priority priority, absl::string_view what);
  // A worker for a job of `requester`: when workers are scarce, interactive
  // jobs first, and among them the requester with the fewest jobs on workers
  // (then the longest waiting), so one process's burst of compiles does not
  // make another's single compile wait behind all of it.
  absl::StatusOr<std::unique_ptr<WorkerProcess>> Acquire(Priority priority,
                                                         const std::string& requester);
  void Release(std::unique_ptr<WorkerProcess> worker, const std::string& requester);
  // Whether the waiter of `ticket` is the one a free worker goes to next.
  bool IsNextLocked(uint64_t ticket) const;
  bool InteractiveWaitsLocked() const;
  void RetireIdleLoop();
  // Starts one more worker on a thread of its own; it joins idle_ once it has
  // imported triton. Called with mutex_ held.
  void StartWorkerLocked();
  absl::StatusOr<std::unique_ptr<WorkerProcess>> StartReadyWorker();

  const ToolchainInfo info_;
  const PoolOptions options_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::unique_ptr<WorkerProcess>> idle_;  // guarded by mutex_
  int live_ = 0;                                      // guarded by mutex_ (starting ones too)
  int starting_ = 0;                                  // guarded by mutex_
  uint64_t start_failures_ = 0;                       // guarded by mutex_
  absl::Status last_start_failure_;                   // guarded by mutex_
  struct Waiter {
    uint64_t ticket;
    std::string requester;
    bool interactive;
  };
  std::list<Waiter> waiting_;                          // guarded by mutex_, oldest first
  uint64_t next_ticket_ = 0;                           // guarded by mutex_
  struct Requester {
    int on_workers = 0;       // its jobs running now
    int64_t last_served = 0;  // when a worker last went to it (a grant count)
  };
  absl::flat_hash_map<std::string, Requester> requesters_;  // guarded by mutex_
  uint64_t next_grant_ = 0;                                  // guarded by mutex_
  bool stopping_ = false;  // guarded by mutex_: Stop() or the destructor
  // Workers running a job (owned by its caller until Release).
  absl::flat_hash_set<WorkerProcess*> busy_;  // guarded by mutex_
  PoolStats stats_;                                   // guarded by mutex_
  std::thread retirer_;
};

class ToolchainRegistry {
 public:
  // Probes are remembered in `probe_memo_file` (ToolchainMemo) when given.
  explicit ToolchainRegistry(PoolOptions options, std::filesystem::path probe_memo_file = {});
  // StopWorkers.
  ~ToolchainRegistry();

  // Runs `python_executable` once to identify its Triton and registers it.
  // Registering the same toolchain twice is a no-op. FAILED_PRECONDITION when
  // the path is not an absolute, existing file or its Python cannot import
  // triton (with the interpreter's error).
  // A probe remembered from an earlier start stands for the run, unless
  // `expected_triton_key` (a client's) says the interpreter's triton changed
  // since: its pool starts a worker at once, so that the first compile finds
  // one ready or starting.
  absl::StatusOr<ToolchainInfo> Register(const std::filesystem::path& python_executable,
                                         absl::string_view expected_triton_key = "");
  // Register without waiting for a probe: a remembered or registered
  // toolchain (or a path that is none) is answered to `registered` at once
  // (true); else the probe runs on a thread of its own, which calls
  // `registered` when it ends (false), unless one of this interpreter is
  // under way already (false, and `registered` is never called). Meanwhile
  // a Register of it waits for that probe.
  bool RegisterInBackground(const std::filesystem::path& python_executable,
                            absl::string_view expected_triton_key,
                            std::function<void(const absl::StatusOr<ToolchainInfo>&)> registered);
  bool AnyProbeUnderWay();
  // Returns once no probe is under way (a background one's `registered` done too).
  void WaitForProbes();

  // The pool of the toolchain with this triton key; FAILED_PRECONDITION lists
  // the registered ones and how to register another. One not registered yet
  // is looked for again once the probes under way end, `wait_for_probes`.
  absl::StatusOr<WorkerPool*> Find(absl::string_view triton_key, bool wait_for_probes = true);

  // True when `python_executable` was registered and still has `triton_key`
  // as far as we know (used to skip re-identifying on every request).
  bool IsRegisteredAs(const std::string& python_executable, absl::string_view triton_key);

  // Those registered; with `wait_for_probes`, once the probes under way end.
  std::vector<ToolchainInfo> List(bool wait_for_probes = false);
  PoolStats TotalStats();
  // WorkerPool::Stop of every pool, and of any registered later; abandons the
  // probes under way and waits for their threads (and `registered` callbacks).
  void StopWorkers();

 private:
  // The pool of `info`, made when it is new (`is_new`); with mutex_ held.
  WorkerPool& PoolOfLocked(const ToolchainInfo& info, bool& is_new);
  // `given` normalized, or FAILED_PRECONDITION when it is no absolute path to a file.
  static absl::StatusOr<std::filesystem::path> InterpreterPath(const std::filesystem::path& given);
  // Registers the memo's toolchain of `python_executable`, if it has one and
  // its key is `expected_triton_key` (when given).
  std::optional<ToolchainInfo> RegisterRemembered(const std::filesystem::path& python_executable,
                                                  absl::string_view expected_triton_key);
  std::optional<ToolchainInfo> RegisteredLocked(const std::filesystem::path& python_executable,
                                                absl::string_view expected_triton_key);
  // Runs the interpreter's worker to identify its Triton, and registers it;
  // its entry in probes_ is made by the caller, and ended by EndProbe.
  absl::StatusOr<ToolchainInfo> Probe(const std::filesystem::path& python_executable);
  // Those waiting for the probe look again.
  void EndProbe(const std::filesystem::path& python_executable);
  // Returns, with mutex_ held by `lock`, once no probe is under way or
  // `enough` holds (each time one ends, it is asked again).
  template <typename Enough>
  void AwaitProbesLocked(std::unique_lock<std::mutex>& lock, Enough enough) {
    probe_ended_.wait(lock, [&] { return probes_.empty() || enough(); });
  }
  void AwaitProbesLocked(std::unique_lock<std::mutex>& lock) {
    AwaitProbesLocked(lock, [] { return false; });
  }

  const PoolOptions options_;
  ToolchainMemo memo_;
  std::mutex mutex_;
  absl::flat_hash_map<std::string, std::unique_ptr<WorkerPool>> pools_;  // by triton key
  absl::flat_hash_map<std::string, std::string> key_by_python_;
  bool workers_stopped_ = false;  // guarded by mutex_
  // Probes under way, by interpreter: their worker once started (StopWorkers
  // abandons it). Guarded by mutex_, ended ones signalled by probe_ended_.
  absl::flat_hash_map<std::string, WorkerProcess*> probes_;
  std::condition_variable probe_ended_;
  std::vector<std::thread> probe_threads_;  // guarded by mutex_
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_TOOLCHAINS_H_
