#ifndef KILN_CLIENT_CLIENT_H_
#define KILN_CLIENT_CLIENT_H_

// The C++ SDK of kilnd. Every call has a deadline and returns absl::Status or
// absl::StatusOr; calls are retried only when kilnd answers UNAVAILABLE or
// ABORTED (it is starting, stopping, or the database was busy), never after
// another error. A Client is thread-safe.
//
//   kiln::Client client({});                       // the per-user local socket
//   kiln::CompileInput input;
//   input.ir = ReadFile("add_kernel.ttir");
//   input.target = *kiln::ParseTarget("cuda:90");
//   absl::StatusOr<kiln::CompiledKernel> kernel = client.Compile(input);
//   if (kernel.ok()) LoadCubin(kernel->cubin());

#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "kiln/v1/kiln.grpc.pb.h"

namespace kiln {

struct ClientOptions {
  // A gRPC target, or several kilnds of a fleet, comma-separated
  // ("grpcs://a:7733,b:7733"): calls then go round robin over all their
  // addresses (as over every address of one HOST:PORT), and a call that finds
  // its kilnd gone is retried on another. Empty means `endpoint_file`, else $KILN_ENDPOINT, else
  // $KILN_ENDPOINT_FILE, else the user's kilnd: its local socket (POSIX) or
  // its endpoint file (Windows), falling back to the machine service's.
  std::string endpoint;
  // A kilnd endpoint file ("127.0.0.1:PORT\nTOKEN\n"): the target and the
  // access token to send are read from it.
  std::filesystem::path endpoint_file;
  // Sent as "x-kiln-token" with every call; read from the endpoint file when
  // that is what names the target.
  std::string token;
  // Deadline of a quick call (lookup, stats, ...), its retries included.
  absl::Duration timeout = absl::Seconds(30);
  // Deadline of a compile, which may queue behind others, retries included.
  // A kilnd that stops answering ends any call sooner, in about 8 s, by
  // keepalive PINGs.
  absl::Duration compile_timeout = absl::Minutes(15);
  int max_attempts = 3;
  absl::Duration retry_backoff = absl::Milliseconds(200);
  // Null: plaintext, right for the local socket and loopback; for an
  // endpoint "grpcs://HOST:PORT" (a farm's kilnd behind TLS), TLS with the CA
  // bundle $KILN_CA_FILE (default: the system's), the client certificate
  // $KILN_CLIENT_CERT and key $KILN_CLIENT_KEY, and/or the bearer token in
  // $KILN_TOKEN_FILE. Set to use other credentials for that endpoint.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

// Where a client connects, and with which token.
struct ResolvedEndpoint {
  std::string target;   // a gRPC target
  std::string token;    // empty: none
  std::string problem;  // why there is no usable target (e.g. no endpoint file), or empty
  // The user's own kilnd, found where it listens by default: the one a
  // client may start (StartUserKilndIfNotServing), unlike a named endpoint,
  // a farm's, or the machine service's.
  bool is_user_default = false;
};
ResolvedEndpoint ResolveEndpoint(const ClientOptions& options);

// The kilnds an endpoint lists, each as an endpoint of its own (a list under
// grpcs:// gives each the scheme); one for an endpoint of one kilnd.
std::vector<std::string> FleetEndpoints(absl::string_view endpoint);

// A GPU target as "cuda:90" (backend:arch[:warp size]). INVALID_ARGUMENT
// otherwise, naming the accepted form.
absl::StatusOr<v1::Target> ParseTarget(absl::string_view text);

struct CompileInput {
  // The toolchain that compiles: a triton key, a Triton version ("3.6.0"),
  // or empty for the only registered one.
  std::string toolchain;
  v1::Stage stage = v1::STAGE_TTIR;
  std::string ir;
  v1::Target target;
  std::string options_json = "{}";  // Triton backend options, e.g. {"num_warps": 8}
  std::map<std::string, std::string> env;
  std::string cache_key;  // empty: derived from the inputs
  v1::Priority priority = v1::PRIORITY_INTERACTIVE;
};

struct CompiledKernel {
  std::string name;
  // Artifacts by kind: "cubin", "ptx", "llir", "ttgir", "ttir", "json".
  std::map<std::string, std::string> artifacts;
  std::string ptxas_log;
  bool cache_hit = false;

  const std::string& cubin() const { return artifacts.at("cubin"); }
  const std::string& metadata_json() const { return artifacts.at("json"); }
};

// When a Compile status is a kernel's own failure (not a transport or request
// problem), the failure as kilnd reported it: kind, message, compiler log.
std::optional<v1::CompileError> CompileErrorOf(const absl::Status& status);

class ThreadPool;

class Client {
 public:
  explicit Client(ClientOptions options);
  // Waits for the CompileAsync and CompileFuture calls still running.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& endpoint() const { return endpoint_; }

  // OK when kilnd reports SERVING; UNAVAILABLE otherwise.
  absl::Status CheckHealth();
  // Polls CheckHealth() until it succeeds or `deadline` passes, resolving the
  // endpoint again between tries: a kilnd that starts meanwhile writes its
  // endpoint file then, on a port of its choosing. Not while other calls on
  // this client are in flight.
  absl::Status WaitUntilServing(absl::Duration deadline);

  // Compiles (or fetches from the cache). A kernel that fails to compile is
  // INVALID_ARGUMENT carrying a CompileError (see CompileErrorOf); an unknown
  // toolchain is FAILED_PRECONDITION listing the registered ones.
  absl::StatusOr<CompiledKernel> Compile(const CompileInput& input);
  // The same without blocking: every call starts at once, on a thread of this
  // client's, and `done` gets the result there (it must not destroy the client).
  void CompileAsync(CompileInput input,
                    std::function<void(absl::StatusOr<CompiledKernel>)> done);
  std::future<absl::StatusOr<CompiledKernel>> CompileFuture(CompileInput input);

  // Stores named artifacts under (ns, key).
  absl::Status Put(absl::string_view ns, absl::string_view key,
                   const std::vector<std::pair<std::string, std::string>>& named_blobs);
  // Stores many entries in one call (at most 10,000, and within kilnd's
  // request size limit), each as Put would: what a bulk writer sends. The
  // call's status, then each entry's, in order.
  struct EntryToPut {
    std::string ns;
    std::string key;
    std::vector<std::pair<std::string, std::string>> named_blobs;
  };
  absl::StatusOr<std::vector<absl::Status>> PutMany(const std::vector<EntryToPut>& entries);
  // The entry, or nullopt on a miss.
  absl::StatusOr<std::optional<v1::CacheEntry>> Lookup(absl::string_view ns,
                                                       absl::string_view key);
  absl::StatusOr<v1::GetStatsResponse> Stats();
  absl::StatusOr<std::vector<v1::Toolchain>> Toolchains();
  // Evicts least recently used entries down to `target_bytes` (local user only).
  absl::StatusOr<v1::EvictResponse> Evict(uint64_t target_bytes);
  // Re-hashes every stored blob (local user only).
  absl::StatusOr<v1::VerifyResponse> Verify();
  // This client's trust domain's latest `last` misses and their reasons.
  absl::StatusOr<v1::ListMissesResponse> ListMisses(uint32_t last);
  // One page of the keys of this user's entries (local user only).
  absl::StatusOr<v1::ListEntriesResponse> ListEntries(const v1::ListEntriesRequest& request);
  // Compiles a recorded kernel for another target (see kiln.v1.PrewarmRequest).
  absl::StatusOr<v1::PrewarmResponse> Prewarm(const v1::PrewarmRequest& request);
  // Sends the bundle file `file` to kilnd to import (local user only; see
  // kiln.v1.Kiln.ImportBundle), a chunk at a time, calling `sent` with the
  // bytes sent so far. No deadline: kilnd may compile the bundle's kernels.
  absl::StatusOr<v1::ImportBundleResponse> ImportBundle(
      const std::filesystem::path& file, bool replace,
      const std::function<void(uint64_t)>& sent = nullptr);

 private:
  // Takes `resolved` as this client's endpoint and opens a channel to it
  // (none when it is unresolved or its TLS settings cannot be read).
  void Connect(ResolvedEndpoint resolved);
  // Runs `call` with a fresh context per attempt, retrying UNAVAILABLE,
  // ABORTED and a connection broken under it; converts the final status.
  template <typename Call>
  absl::Status WithRetries(absl::string_view method, absl::Duration timeout, Call call);
  // One retried unary call of `rpc` (a synchronous Stub method).
  template <typename Response, typename Request, typename Rpc>
  absl::StatusOr<Response> Unary(absl::string_view method, absl::Duration timeout,
                                 const Request& request, Rpc rpc);
  absl::StatusOr<std::string> ResolveToolchain(const std::string& wanted);

  ClientOptions options_;
  std::string endpoint_;
  std::string token_;
  std::string endpoint_problem_;  // set when no endpoint could be resolved
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Kiln::Stub> stub_;
  // Last, so that it drains before the channel goes. Its threads stay until the
  // client goes: see CompileAsync in client.cc.
  std::unique_ptr<ThreadPool> call_threads_;
};

// Human-readable stats, as printed by `kilnd --stats` and `kiln stats`.
std::string FormatStats(const v1::GetStatsResponse& stats);
// The same as one JSON object.
std::string FormatStatsJson(const v1::GetStatsResponse& stats);
// Any API message as JSON, fields under their proto names.
std::string FormatJson(const google::protobuf::Message& message);

}  // namespace kiln

#endif  // KILN_CLIENT_CLIENT_H_
