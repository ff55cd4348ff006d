#ifndef KILN_COMPILER_WORKER_PROCESS_H_
#define KILN_COMPILER_WORKER_PROCESS_H_

#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "kiln/worker/worker.pb.h"

namespace kiln::compiler {

// Named binary payloads that follow a message's JSON header.
using Parts = std::vector<std::pair<std::string, std::string>>;

struct WorkerReply {
  worker::Reply header;
  Parts parts;
};

// One long-lived kiln_worker.py process of a toolchain, driven over its pipes
// (protocol in kiln_worker.py's docstring). Not thread-safe: one job at a
// time; only Abandon() may be called from another thread.
class WorkerProcess {
 public:
  // Starts `python -I script`. FAILED_PRECONDITION if it cannot be started.
  static absl::StatusOr<std::unique_ptr<WorkerProcess>> Start(
      const std::filesystem::path& python, const std::filesystem::path& script);

  // Sends a request and waits for its reply until `timeout`. ABORTED if the
  // worker was already dead (the job never ran), UNAVAILABLE if it died during
  // the job (message carries its exit status and stderr tail),
  // DEADLINE_EXCEEDED on timeout (the worker is killed). After either, the
  // worker is unusable.
  absl::StatusOr<WorkerReply> Call(worker::Request request, const Parts& parts,
                                   absl::Duration timeout);

  // Kills the worker, from any thread, mid-job: its Call returns UNAVAILABLE
  // at once. For kilnd's stop, which must not wait for a compile to end.
  void Abandon();

  int pid() const { return process_->pid(); }
  bool broken() const { return broken_; }
  absl::Time last_used() const { return last_used_; }

 private:
  explicit WorkerProcess(std::unique_ptr<Subprocess> process) : process_(std::move(process)) {}
  absl::StatusOr<WorkerReply> ReadReply(absl::Time deadline);
  // Kills it; UNAVAILABLE with its exit and JobStderr().
  absl::Status Died(absl::string_view during);
  // Kills it and collects its exit, once (Abandon may race the job's end).
  std::string KillAndReap();
  // The end of what it wrote to stderr since the current job began: a report
  // of a job shows that job's output, never an earlier job's.
  std::string JobStderr();

  std::unique_ptr<Subprocess> process_;
  // Held to kill or reap it: a kill after the reap could hit a reused pid.
  std::mutex reap_mutex_;
  bool reaped_ = false;  // guarded by reap_mutex_
  std::string exit_;     // guarded by reap_mutex_, once reaped_
  bool answered_ = false;         // a reply has come: it is past its start
  uint64_t job_stderr_mark_ = 0;  // its StderrWritten() as the current job began
  bool broken_ = false;
  absl::Time last_used_ = absl::Now();
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_WORKER_PROCESS_H_
