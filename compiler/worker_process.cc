#include "compiler/worker_process.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace kiln::compiler {
namespace {

// Frames larger than this mean a desynchronized or corrupt stream.
constexpr uint32_t kMaxFrame = 1u << 30;
constexpr size_t kStderrTailInMessages = 4000;

std::string Frame(absl::string_view payload) {
  const auto size = static_cast<uint32_t>(payload.size());
  char length[4];
  for (int i = 0; i < 4; ++i) length[i] = static_cast<char>((size >> (8 * i)) & 0xff);
  return absl::StrCat(absl::string_view(length, 4), payload);
}

uint32_t DecodeLength(absl::string_view bytes) {
  uint32_t size = 0;
  for (int i = 3; i >= 0; --i) size = (size << 8) | static_cast<unsigned char>(bytes[i]);
  return size;
}

std::string Tail(const std::string& text) {
  return text.size() <= kStderrTailInMessages ? text
                                              : text.substr(text.size() - kStderrTailInMessages);
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerProcess>> WorkerProcess::Start(
    const std::filesystem::path& python, const std::filesystem::path& script) {
  // -I: isolated mode, so the user's site customizations and a `kiln` or
  // `triton` directory in the working directory cannot shadow the toolchain.
  ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> process,
                   Subprocess::Spawn({python.string(), "-I", script.string()}));
  return std::unique_ptr<WorkerProcess>(new WorkerProcess(std::move(process)));
}

std::string WorkerProcess::KillAndReap() {
  std::lock_guard lock(reap_mutex_);
  if (!reaped_) {
    process_->Kill();
    exit_ = process_->Wait();
    reaped_ = true;
  }
  return exit_;
}

void WorkerProcess::Abandon() {
  std::lock_guard lock(reap_mutex_);
  if (!reaped_) process_->Kill();  // its Call sees end of output, then reaps it
}

absl::Status WorkerProcess::Died(absl::string_view during) {
  broken_ = true;
  const std::string exit = KillAndReap();
  return absl::UnavailableError(absl::StrFormat("compile worker (pid %d) died %s (%s); stderr:\n%s",
                                                process_->pid(), during, exit,
                                                JobStderr()));
}

std::string WorkerProcess::JobStderr() { return Tail(process_->StderrTailSince(job_stderr_mark_)); }

absl::StatusOr<WorkerReply> WorkerProcess::Call(worker::Request request, const Parts& parts,
                                                absl::Duration timeout) {
  if (broken_) return absl::FailedPreconditionError("worker is no longer usable");
  last_used_ = absl::Now();
  // The first job's report keeps what the worker wrote while it started.
  if (answered_) job_stderr_mark_ = process_->StderrWritten();
  for (const auto& [name, data] : parts) request.add_parts(name);
  std::string header;
  google::protobuf::util::JsonPrintOptions print_options;
  print_options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(request, &header, print_options).ok()) {
    return absl::InternalError("cannot encode a worker request");
  }
  std::string message = Frame(header);
  for (const auto& [name, data] : parts) absl::StrAppend(&message, Frame(data));
  if (!process_->Write(message).ok()) {
    // Nothing was run: the caller may retry on another worker.
    const absl::Status died = Died("before it took the job");
    return absl::AbortedError(died.message());
  }
  absl::StatusOr<WorkerReply> reply = ReadReply(absl::Now() + timeout);
  last_used_ = absl::Now();
  if (absl::IsDeadlineExceeded(reply.status())) {
    broken_ = true;
    KillAndReap();
    return absl::DeadlineExceededError(absl::StrFormat(
        "compile worker (pid %d) exceeded the %s job timeout and was killed; stderr:\n%s",
        process_->pid(), absl::FormatDuration(timeout),
        JobStderr()));
  }
  if (absl::IsUnavailable(reply.status())) return Died("during the job");
  answered_ = true;
  return reply;
}

absl::StatusOr<WorkerReply> WorkerProcess::ReadReply(absl::Time deadline) {
  auto read_frame = [&]() -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(std::string length, process_->ReadExactly(4, deadline));
    const uint32_t size = DecodeLength(length);
    if (size > kMaxFrame) {
      return absl::UnavailableError(absl::StrCat("worker sent a frame of ", size, " bytes"));
    }
    return process_->ReadExactly(size, deadline);
  };
  ASSIGN_OR_RETURN(std::string header, read_frame());
  WorkerReply reply;
  google::protobuf::util::JsonParseOptions parse_options;
  parse_options.ignore_unknown_fields = true;
  if (!google::protobuf::util::JsonStringToMessage(header, &reply.header, parse_options).ok()) {
    return absl::UnavailableError(absl::StrCat("worker sent an unreadable header: ",
                                               header.substr(0, 200)));
  }
  for (const std::string& name : reply.header.parts()) {
    ASSIGN_OR_RETURN(std::string data, read_frame());
    reply.parts.emplace_back(name, std::move(data));
  }
  return reply;
}

}  // namespace kiln::compiler
