#include "kiln/client.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/byte_size.h"
#include "common/platform.h"
#include "common/sha256.h"
#include "common/thread_pool.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace kiln {

namespace {

// The scheme of an endpoint reached over TLS.
constexpr absl::string_view kTlsScheme = "grpcs://";
// The largest answer read: kilnd's own largest request (max_request_size's
// default), which bounds what it stores and so what it answers; as the
// Python client's (local_grpc.MAX_MESSAGE).
constexpr int kMaxAnswerBytes = 64 << 20;
// A kilnd that stops answering ends a call that waits (a compile, an import)
// by keepalive: a PING once the call has waited this long, the connection
// closed if its answer takes longer than the PING timeout (gRPC since 1.57
// times keepalive PINGs by grpc.http2.ping_timeout_ms, a minute by default;
// before, by keepalive_timeout_ms: both are set). kilnd allows a PING a second
// during calls (service/server.cc); gRPC sends two at most without data
// between them unless max_pings_without_data is 0. As the Python client's
// (grpc_channel.py).
constexpr int kKeepaliveMs = 2000;
constexpr int kPingTimeoutMs = 3000;
constexpr char kPingTimeoutArgument[] = "grpc.http2.ping_timeout_ms";
// A handshake gives up after this long (gRPC's minimum connect timeout, 20 s
// by default): a retry after a stopped kilnd's PING went unanswered connects
// to a kernel that still accepts for it, and a kilnd that never answers.
constexpr int kConnectTimeoutMs = 4000;

ResolvedEndpoint ReadEndpointFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  ResolvedEndpoint resolved;
  if (!in || !std::getline(in, resolved.target) || !std::getline(in, resolved.token) ||
      resolved.target.empty()) {
    resolved.target.clear();
    std::error_code error;
    resolved.problem =
        std::filesystem::exists(path, error) && !in
            ? absl::StrFormat(
                  "this account may not read kilnd's endpoint file %s: the machine's kilnd serves "
                  "only the accounts its kilnd.conf names with allowed_user = DOMAIN\\user",
                  path.string())
            : absl::StrFormat(
                  "no kilnd endpoint file at %s: is kilnd running? (start it with `kilnd`, or "
                  "`kilnd start` for the Windows service)",
                  path.string());
  }
  return resolved;
}

std::string EnvOrEmpty(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// The content of the file $`variable` names; empty when it is unset.
absl::StatusOr<std::string> FileNamedBy(const char* variable) {
  const std::string path = EnvOrEmpty(variable);
  if (path.empty()) return std::string();
  absl::StatusOr<std::string> content = platform::ReadWholeFile(path);
  if (!content.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s=%s cannot be read; fix the path", variable, path));
  }
  return content;
}

// TLS to a farm's kilnd: the CA bundle that signed its certificate
// (KILN_CA_FILE; default: the system's), this client's certificate
// (KILN_CLIENT_CERT, KILN_CLIENT_KEY) and/or its token (KILN_TOKEN_FILE),
// which say which tenant it is.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsCredentialsFromEnvironment() {
  grpc::SslCredentialsOptions ssl;
  absl::StatusOr<std::string> ca = FileNamedBy("KILN_CA_FILE");
  absl::StatusOr<std::string> certificate = FileNamedBy("KILN_CLIENT_CERT");
  absl::StatusOr<std::string> key = FileNamedBy("KILN_CLIENT_KEY");
  absl::StatusOr<std::string> token = FileNamedBy("KILN_TOKEN_FILE");
  for (const auto* file : {&ca, &certificate, &key, &token}) {
    if (!file->ok()) return file->status();
  }
  if (certificate->empty() != key->empty()) {
    return absl::InvalidArgumentError(
        "KILN_CLIENT_CERT and KILN_CLIENT_KEY go together: set both or neither");
  }
  ssl.pem_root_certs = *ca;
  ssl.pem_cert_chain = *certificate;
  ssl.pem_private_key = *key;
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(ssl);
  const std::string bearer(absl::StripAsciiWhitespace(*token));
  if (bearer.empty()) return credentials;
  return grpc::CompositeChannelCredentials(credentials, grpc::AccessTokenCredentials(bearer));
}

// Calls to a TCP endpoint, which may be a fleet of kilnds, go round robin over
// its addresses, and one that finds its kilnd gone is tried on another.
constexpr absl::string_view kFleetServiceConfig = R"({
  "loadBalancingConfig": [{"round_robin": {}}],
  "methodConfig": [{
    "name": [{"service": "kiln.v1.Kiln"}],
    "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}
  }]
})";

// An endpoint as a channel opens it.
struct ChannelTarget {
  std::string target;     // a gRPC target, without grpcs://
  bool tls = false;
  bool tcp = false;       // balanced and retried over its addresses
  std::string tls_name;   // the name the certificates must carry, when it is not the target's
};

// One endpoint ("HOST:PORT", "grpcs://HOST:PORT", "unix:PATH", ...) as is; a
// list of kilnds as the addresses of all of them in one target (gRPC takes one
// address family per target: IPv4 when any has one).
absl::StatusOr<ChannelTarget> ChannelTargetOf(absl::string_view endpoint) {
  ChannelTarget channel;
  channel.tls = absl::StartsWith(endpoint, kTlsScheme);
  const std::vector<std::string> kilnds = FleetEndpoints(endpoint);
  if (kilnds.size() <= 1) {
    channel.target = kilnds.empty() ? std::string(endpoint) : kilnds[0];
    if (absl::StartsWith(channel.target, kTlsScheme)) {
      channel.target = channel.target.substr(kTlsScheme.size());
    }
    channel.tcp = !absl::StartsWith(channel.target, "unix");
    return channel;
  }
  platform::TcpAddresses all;
  for (std::string kilnd : kilnds) {
    if (absl::StartsWith(kilnd, kTlsScheme)) kilnd = kilnd.substr(kTlsScheme.size());
    const std::optional<platform::HostPort> split = platform::SplitHostPort(kilnd);
    if (!split.has_value() || split->port == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the endpoint lists '%s', which is not HOST:PORT; list kilnds as HOST:PORT,HOST:PORT",
          kilnd));
    }
    absl::StatusOr<platform::TcpAddresses> found =
        platform::ResolveTcpAddresses(split->host, split->port);
    if (!found.ok()) {
      return absl::UnavailableError(absl::StrFormat(
          "the endpoint lists %s: %s; list HOST:PORT entries that resolve", kilnd,
          found.status().message()));
    }
    for (auto [from, to] : {std::pair{&found->ipv4, &all.ipv4}, std::pair{&found->ipv6, &all.ipv6}}) {
      for (const std::string& address : *from) {
        if (std::find(to->begin(), to->end(), address) == to->end()) to->push_back(address);
      }
    }
    // The fleet's certificate names the first kilnd listed (usually a name all share).
    if (channel.tls_name.empty()) channel.tls_name = split->host;
  }
  const bool ipv4 = !all.ipv4.empty();
  channel.target = absl::StrCat(ipv4 ? "ipv4:" : "ipv6:", absl::StrJoin(ipv4 ? all.ipv4 : all.ipv6, ","));
  channel.tcp = true;
  if (!channel.tls) channel.tls_name.clear();
  return channel;
}

}  // namespace

std::vector<std::string> FleetEndpoints(absl::string_view endpoint) {
  const bool tls = absl::StartsWith(endpoint, kTlsScheme);
  std::vector<std::string> kilnds;
  for (absl::string_view part : absl::StrSplit(endpoint, ',', absl::SkipWhitespace())) {
    std::string kilnd(absl::StripAsciiWhitespace(part));
    if (tls && !absl::StartsWith(kilnd, kTlsScheme)) kilnd = absl::StrCat(kTlsScheme, kilnd);
    kilnds.push_back(std::move(kilnd));
  }
  return kilnds;
}

ResolvedEndpoint ResolveEndpoint(const ClientOptions& options) {
  if (!options.endpoint.empty()) return {options.endpoint, options.token, ""};
  if (!options.endpoint_file.empty()) return ReadEndpointFile(options.endpoint_file);
  if (std::string endpoint = EnvOrEmpty("KILN_ENDPOINT"); !endpoint.empty()) {
    return {endpoint, options.token, ""};
  }
  if (std::string file = EnvOrEmpty("KILN_ENDPOINT_FILE"); !file.empty()) {
    return ReadEndpointFile(file);
  }
  std::error_code error;
  if (std::string local = platform::DefaultLocalEndpoint(); !local.empty()) {
    // The system unit's socket, when this account may reach it (group kiln).
    const std::filesystem::path machine = platform::DefaultSocketPath(platform::Scope::kMachine);
    if (!std::filesystem::exists(platform::DefaultSocketPath(), error) &&
        std::filesystem::exists(machine, error)) {
      return {"unix:" + machine.string(), options.token, ""};
    }
    return {local, options.token, "", /*is_user_default=*/true};
  }
  // No Unix socket here (Windows): the user's own kilnd, else the machine's service.
  const std::filesystem::path user_file = platform::DefaultEndpointFile(platform::Scope::kUser);
  const std::filesystem::path machine_file =
      platform::DefaultEndpointFile(platform::Scope::kMachine);
  if (!std::filesystem::exists(user_file, error) && std::filesystem::exists(machine_file, error)) {
    return ReadEndpointFile(machine_file);
  }
  ResolvedEndpoint user = ReadEndpointFile(user_file);
  user.is_user_default = true;
  return user;
}

namespace {

// The type URL of the CompileError payload on a kernel's compile failure.
constexpr absl::string_view kCompileErrorPayload = "type.googleapis.com/kiln.v1.CompileError";

// Kiln's calls may all be made again: a compile that is running or done is
// joined or found, and the rest read or write by content.
bool Retryable(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::ABORTED:
      return true;
    case grpc::StatusCode::UNKNOWN:
      // A connection that broke under a call: gRPC 1.51 reports it so, not as
      // UNAVAILABLE (grpc/grpc#34076). Seen under Wine, where kiln.exe lost
      // one of four targets compiling at once in about one run of 30.
      return status.error_message() == "Stream removed";
    default:
      return false;
  }
}

// "add_kernel.cubin" -> {"add_kernel", "cubin"}.
std::pair<std::string, std::string> SplitName(const std::string& file_name) {
  const size_t dot = file_name.rfind('.');
  if (dot == std::string::npos) return {file_name, ""};
  return {file_name.substr(0, dot), file_name.substr(dot + 1)};
}

}  // namespace

absl::StatusOr<v1::Target> ParseTarget(absl::string_view text) {
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  v1::Target target;
  int warp_size = 32;
  const bool arch_ok = parts.size() >= 2 && !parts[1].empty() && parts[1].size() <= 4 &&
                       absl::ascii_isdigit(static_cast<unsigned char>(parts[1][0]));
  if (parts.size() < 2 || parts.size() > 3 || parts[0].empty() || !arch_ok ||
      (parts.size() == 3 && (!absl::SimpleAtoi(parts[2], &warp_size) || warp_size <= 0))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bad target '%s': write BACKEND:ARCH[:WARP_SIZE], e.g. cuda:90 or cuda:80", text));
  }
  target.set_backend(parts[0]);
  target.set_arch(parts[1]);
  target.set_warp_size(warp_size);
  return target;
}

std::optional<v1::CompileError> CompileErrorOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kCompileErrorPayload);
  v1::CompileError error;
  if (!payload.has_value() || !error.ParseFromString(std::string(*payload))) return std::nullopt;
  return error;
}

Client::Client(ClientOptions options)
    : options_(std::move(options)),
      call_threads_(std::make_unique<ThreadPool>(ThreadPool::GrowWithDemand{})) {
  Connect(ResolveEndpoint(options_));
}

Client::~Client() = default;

void Client::Connect(ResolvedEndpoint resolved) {
  endpoint_ = std::move(resolved.target);
  token_ = std::move(resolved.token);
  endpoint_problem_ = std::move(resolved.problem);
  channel_.reset();
  stub_.reset();
  if (!endpoint_problem_.empty()) return;
  std::shared_ptr<grpc::ChannelCredentials> credentials = options_.credentials;
  absl::StatusOr<ChannelTarget> target = ChannelTargetOf(endpoint_);
  if (!target.ok()) {
    endpoint_problem_ = std::string(target.status().message());
    return;
  }
  if (target->tls) {
    if (credentials == nullptr) {
      absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> from_environment =
          TlsCredentialsFromEnvironment();
      if (!from_environment.ok()) {
        endpoint_problem_ = std::string(from_environment.status().message());
        return;
      }
      credentials = *std::move(from_environment);
    }
  }
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(kMaxAnswerBytes);
  arguments.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kPingTimeoutMs);
  arguments.SetInt(kPingTimeoutArgument, kPingTimeoutMs);
  arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kConnectTimeoutMs);
  arguments.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  if (target->tcp) arguments.SetServiceConfigJSON(std::string(kFleetServiceConfig));
  if (!target->tls_name.empty()) arguments.SetSslTargetNameOverride(target->tls_name);
  channel_ = grpc::CreateCustomChannel(
      target->target, credentials ? credentials : grpc::InsecureChannelCredentials(), arguments);
  stub_ = v1::Kiln::NewStub(channel_);
}

template <typename Call>
absl::Status Client::WithRetries(absl::string_view method, absl::Duration timeout, Call call) {
  if (!endpoint_problem_.empty()) {
    return absl::UnavailableError(absl::StrCat(method, ": ", endpoint_problem_));
  }
  grpc::Status status;
  // The deadline is the call's, its retries included: a kilnd that stops
  // answering costs the caller `timeout` at most, not one per attempt.
  const absl::Time give_up = absl::Now() + timeout;
  for (int attempt = 1; attempt <= std::max(1, options_.max_attempts); ++attempt) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(give_up));
    if (!token_.empty()) context.AddMetadata("x-kiln-token", token_);
    status = call(&context);
    if (status.ok() || !Retryable(status)) break;
    if (attempt < options_.max_attempts) absl::SleepFor(options_.retry_backoff * attempt);
    if (absl::Now() >= give_up) break;
  }
  if (status.ok()) return absl::OkStatus();
  std::string message = absl::StrCat(method, ": ", status.error_message());
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    absl::StrAppend(&message, " (is kilnd running at ", endpoint_, "?)");
  }
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), message);
}

absl::Status Client::CheckHealth() {
  if (!endpoint_problem_.empty()) {
    return absl::UnavailableError(absl::StrCat("health check: ", endpoint_problem_));
  }
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::health::v1::HealthCheckResponse response;
  absl::Status status = WithRetries("health check", options_.timeout, [&](grpc::ClientContext* c) {
    return health->Check(c, grpc::health::v1::HealthCheckRequest(), &response);
  });
  if (!status.ok()) return status;
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError(absl::StrCat("kilnd at ", endpoint_, " is not serving"));
  }
  return absl::OkStatus();
}

absl::Status Client::WaitUntilServing(absl::Duration deadline) {
  const absl::Time give_up = absl::Now() + deadline;
  while (true) {
    const absl::Time try_until = std::min(give_up, absl::Now() + absl::Milliseconds(200));
    // Blocks until the channel connects or the try's deadline passes, rather
    // than sleeping between tries.
    if (channel_ != nullptr) channel_->WaitForConnected(absl::ToChronoTime(try_until));
    absl::Status status = CheckHealth();
    if (status.ok() || absl::Now() >= give_up) return status;
    absl::SleepFor(try_until - absl::Now());
    if (ResolvedEndpoint now = ResolveEndpoint(options_);
        now.target != endpoint_ || now.token != token_ || !now.problem.empty()) {
      Connect(std::move(now));
    }
  }
}

absl::StatusOr<std::string> Client::ResolveToolchain(const std::string& wanted) {
  // A full triton key is used as is; kilnd names the alternatives if unknown.
  if (wanted.size() > 32) return wanted;
  absl::StatusOr<std::vector<v1::Toolchain>> toolchains = Toolchains();
  if (!toolchains.ok()) return toolchains.status();
  std::vector<std::string> matches, known;
  for (const v1::Toolchain& toolchain : *toolchains) {
    known.push_back(absl::StrCat("triton ", toolchain.triton_version(), " (",
                                 toolchain.python_executable(), ")"));
    if (wanted.empty() || toolchain.triton_version() == wanted) {
      matches.push_back(toolchain.triton_key());
    }
  }
  if (matches.size() == 1) return matches.front();
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s; registered: %s. Choose one by Triton version, or register one with kilnd "
      "--toolchain=/path/to/python",
      matches.empty() ? absl::StrCat("no registered toolchain matches '", wanted, "'")
                      : "several toolchains are registered",
      known.empty() ? "none" : absl::StrJoin(known, ", ")));
}

absl::StatusOr<CompiledKernel> Client::Compile(const CompileInput& input) {
  absl::StatusOr<std::string> triton_key = ResolveToolchain(input.toolchain);
  if (!triton_key.ok()) return triton_key.status();
  v1::CompileRequest request;
  request.set_triton_key(*triton_key);
  request.set_stage(input.stage);
  request.set_ir(input.ir);
  *request.mutable_target() = input.target;
  request.set_options_json(input.options_json);
  request.mutable_env()->insert(input.env.begin(), input.env.end());
  request.set_namespace_("sdk");
  request.set_priority(input.priority);
  // Triton puts the key in the metadata as "hash"; without one, the inputs name it.
  request.set_cache_key(
      input.cache_key.empty()
          ? DigestHex(DigestBytes(Sha256(absl::StrCat(input.ir, "\n", input.target.ShortDebugString(),
                                                      "\n", input.options_json))))
          : input.cache_key);
  v1::CompileResponse response;
  absl::Status status = WithRetries("compile", options_.compile_timeout, [&](grpc::ClientContext* c) {
    return stub_->Compile(c, request, &response);
  });
  if (!status.ok()) return status;
  if (response.has_error()) {
    absl::Status failure = absl::InvalidArgumentError(
        absl::StrCat(v1::CompileError::Kind_Name(response.error().kind()), ": ",
                     response.error().message()));
    failure.SetPayload(kCompileErrorPayload, absl::Cord(response.error().SerializeAsString()));
    return failure;
  }
  CompiledKernel kernel;
  kernel.cache_hit = response.cache_hit();
  kernel.ptxas_log = response.ptxas_log();
  for (v1::Blob& blob : *response.mutable_entry()->mutable_blobs()) {
    auto [name, kind] = SplitName(blob.name());
    kernel.name = name;
    kernel.artifacts[kind] = std::move(*blob.mutable_data());
  }
  return kernel;
}

// Background calls run on the client's own threads, which its destructor
// joins: a detached thread per call outlived a client destroyed with calls in
// flight, and used it. A thread stays until the client goes, so the socket
// reads that gRPC starts on whichever thread handled the last one are not left
// to threads that exit (in a trace of one "Stream removed" under Wine, see
// Retryable, the read that failed had been started by a thread whose call had
// ended).
void Client::CompileAsync(CompileInput input,
                          std::function<void(absl::StatusOr<CompiledKernel>)> done) {
  call_threads_->Schedule(
      [this, input = std::move(input), done = std::move(done)] { done(Compile(input)); });
}

std::future<absl::StatusOr<CompiledKernel>> Client::CompileFuture(CompileInput input) {
  auto result = std::make_shared<std::promise<absl::StatusOr<CompiledKernel>>>();
  std::future<absl::StatusOr<CompiledKernel>> future = result->get_future();
  CompileAsync(std::move(input),
               [result](absl::StatusOr<CompiledKernel> kernel) { result->set_value(std::move(kernel)); });
  return future;
}

template <typename Response, typename Request, typename Rpc>
absl::StatusOr<Response> Client::Unary(absl::string_view method, absl::Duration timeout,
                                       const Request& request, Rpc rpc) {
  Response response;
  absl::Status status = WithRetries(method, timeout, [&](grpc::ClientContext* context) {
    return (stub_.get()->*rpc)(context, request, &response);
  });
  if (!status.ok()) return status;
  return response;
}

namespace {

v1::PutRequest MakePutRequest(absl::string_view ns, absl::string_view key,
                              const std::vector<std::pair<std::string, std::string>>& named_blobs) {
  v1::PutRequest request;
  request.set_namespace_(std::string(ns));
  request.set_key(std::string(key));
  // This SDK reads entries through Lookup, never kilnd's served files: a put
  // of it costs kilnd no file.
  request.set_serve_as_files(false);
  for (const auto& [name, data] : named_blobs) {
    v1::Blob* blob = request.add_blobs();
    blob->set_name(name);
    blob->set_data(data);
    blob->set_size(data.size());
    blob->set_sha256(DigestBytes(Sha256(data)));
  }
  return request;
}

}  // namespace

absl::Status Client::Put(absl::string_view ns, absl::string_view key,
                         const std::vector<std::pair<std::string, std::string>>& named_blobs) {
  return Unary<v1::PutResponse>("put", options_.timeout, MakePutRequest(ns, key, named_blobs),
                                &v1::Kiln::Stub::Put)
      .status();
}

absl::StatusOr<std::vector<absl::Status>> Client::PutMany(const std::vector<EntryToPut>& entries) {
  v1::PutManyRequest request;
  for (const EntryToPut& entry : entries) {
    *request.add_entries() = MakePutRequest(entry.ns, entry.key, entry.named_blobs);
  }
  absl::StatusOr<v1::PutManyResponse> response = Unary<v1::PutManyResponse>(
      "put_many", options_.timeout, request, &v1::Kiln::Stub::PutMany);
  if (!response.ok()) return response.status();
  if (response->results_size() != request.entries_size()) {
    return absl::InternalError(absl::StrFormat(
        "put_many: kilnd answered %d results for %d entries", response->results_size(),
        request.entries_size()));
  }
  std::vector<absl::Status> results;
  for (const v1::PutResult& result : response->results()) {
    results.emplace_back(static_cast<absl::StatusCode>(result.code()), result.message());
  }
  return results;
}

absl::StatusOr<std::optional<v1::CacheEntry>> Client::Lookup(absl::string_view ns,
                                                             absl::string_view key) {
  v1::LookupRequest request;
  request.set_namespace_(std::string(ns));
  request.set_key(std::string(key));
  absl::StatusOr<v1::LookupResponse> response =
      Unary<v1::LookupResponse>("lookup", options_.timeout, request, &v1::Kiln::Stub::Lookup);
  if (!response.ok()) return response.status();
  if (!response->found()) return std::nullopt;
  return std::move(*response->mutable_entry());
}

absl::StatusOr<v1::GetStatsResponse> Client::Stats() {
  return Unary<v1::GetStatsResponse>("stats", options_.timeout, v1::GetStatsRequest(),
                                     &v1::Kiln::Stub::GetStats);
}

absl::StatusOr<std::vector<v1::Toolchain>> Client::Toolchains() {
  absl::StatusOr<v1::ListToolchainsResponse> response = Unary<v1::ListToolchainsResponse>(
      "toolchains", options_.timeout, v1::ListToolchainsRequest(), &v1::Kiln::Stub::ListToolchains);
  if (!response.ok()) return response.status();
  return std::vector<v1::Toolchain>(response->toolchains().begin(), response->toolchains().end());
}

absl::StatusOr<v1::EvictResponse> Client::Evict(uint64_t target_bytes) {
  v1::EvictRequest request;
  request.set_target_bytes(target_bytes);
  return Unary<v1::EvictResponse>("gc", options_.timeout, request, &v1::Kiln::Stub::Evict);
}

absl::StatusOr<v1::ListEntriesResponse> Client::ListEntries(const v1::ListEntriesRequest& request) {
  return Unary<v1::ListEntriesResponse>("list entries", options_.timeout, request,
                                        &v1::Kiln::Stub::ListEntries);
}

absl::StatusOr<v1::ImportBundleResponse> Client::ImportBundle(
    const std::filesystem::path& file, bool replace, const std::function<void(uint64_t)>& sent) {
  if (!endpoint_problem_.empty()) {
    return absl::UnavailableError(absl::StrCat("import: ", endpoint_problem_));
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("import: cannot read ", file.string()));
  grpc::ClientContext context;
  if (!token_.empty()) context.AddMetadata("x-kiln-token", token_);
  v1::ImportBundleResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::ImportBundleChunk>> writer =
      stub_->ImportBundle(&context, &response);
  // A chunk far below kilnd's request limit, large enough that a call's
  // overhead is nothing beside a disk's write.
  constexpr size_t kChunkBytes = 1 << 20;
  v1::ImportBundleChunk chunk;
  chunk.set_replace(replace);
  std::string& buffer = *chunk.mutable_data();
  uint64_t total = 0;
  while (in) {
    buffer.resize(kChunkBytes);
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    buffer.resize(static_cast<size_t>(in.gcount()));
    if (buffer.empty()) break;
    if (!writer->Write(chunk)) break;  // kilnd ended the call: Finish says why
    total += buffer.size();
    if (sent) sent(total);
  }
  if (in.bad()) {
    context.TryCancel();
    writer->Finish().ok();
    return absl::DataLossError(absl::StrCat("import: reading ", file.string(), " failed"));
  }
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) {
    std::string message = absl::StrCat("import: ", status.error_message());
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      absl::StrAppend(&message, " (is kilnd running at ", endpoint_, "?)");
    }
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), message);
  }
  return response;
}

absl::StatusOr<v1::PrewarmResponse> Client::Prewarm(const v1::PrewarmRequest& request) {
  return Unary<v1::PrewarmResponse>("prewarm", options_.compile_timeout, request,
                                    &v1::Kiln::Stub::Prewarm);
}

absl::StatusOr<v1::ListMissesResponse> Client::ListMisses(uint32_t last) {
  v1::ListMissesRequest request;
  request.set_last(last);
  return Unary<v1::ListMissesResponse>("list misses", options_.timeout, request,
                                       &v1::Kiln::Stub::ListMisses);
}

absl::StatusOr<v1::VerifyResponse> Client::Verify() {
  // Verifying reads every blob: allow it the compile deadline.
  return Unary<v1::VerifyResponse>("verify", options_.compile_timeout, v1::VerifyRequest(),
                                   &v1::Kiln::Stub::Verify);
}

std::string FormatStats(const v1::GetStatsResponse& stats) {
  const uint64_t lookups = stats.hits() + stats.misses();
  std::string text = absl::StrFormat(
      "kilnd %s (%s), up %.0f s, data dir %s\n"
      "cache:   %d entries, %d blobs, %s stored, %s on disk of %s\n"
      "lookups: %d hits, %d misses (hit rate %.1f%%), %d puts\n"
      "evicted: %d entries; dropped as corrupt: %d\n"
      "compile: %d run by workers, %d cache hits, %d joined a running compile, %d failed\n"
      "workers: %d started, %d lost, %d live; launchers: %d built, %d cache hits\n",
      stats.server_version(), stats.executable(), stats.uptime_seconds(), stats.data_dir(),
      stats.entries(),
      stats.blobs(), FormatByteSize(stats.stored_bytes()), FormatByteSize(stats.disk_bytes()),
      FormatByteSize(stats.max_size_bytes()),
      stats.hits(), stats.misses(),
      lookups == 0 ? 0.0 : 100.0 * static_cast<double>(stats.hits()) / static_cast<double>(lookups),
      stats.puts(), stats.evictions(), stats.corrupt_entries_dropped(), stats.compiles(),
      stats.compile_cache_hits(), stats.single_flight_joins(), stats.compile_failures(),
      stats.workers_started(), stats.workers_lost(), stats.live_workers(), stats.launcher_builds(),
      stats.launcher_cache_hits());
  if (stats.compiled_ahead() > 0) {
    absl::StrAppend(&text, absl::StrFormat("ahead:   %d compiled at once by clients (autotune configs, "
                                           "graph kernels), %.1f s saved against one by one\n",
                                           stats.compiled_ahead(), stats.ahead_seconds_saved()));
  }
  if (stats.tcp_connections_refused() > 0) {
    absl::StrAppend(&text, absl::StrFormat("tcp:     %d connections refused at tcp_max_connections\n",
                                           stats.tcp_connections_refused()));
  }
  if (!stats.disk_full_since().empty()) {
    absl::StrAppend(&text, absl::StrFormat("disk:    full since %s; %d results served but not "
                                           "stored\n",
                                           stats.disk_full_since(), stats.puts_refused_disk_full()));
  } else if (stats.puts_refused_disk_full() > 0) {
    absl::StrAppend(&text, absl::StrFormat("disk:    %d results were not stored while it was "
                                           "full\n",
                                           stats.puts_refused_disk_full()));
  }
  if (!stats.shared_cache_state().empty() && stats.shared_cache_state() != "off") {
    absl::StrAppend(&text, absl::StrFormat(
                               "shared cache (Redis): %s; %d hits, %d misses, %d errors, %d stored, "
                               "%d compiles of other kilnds awaited, %d waiting to be stored, "
                               "%d dropped unstored\n",
                               stats.shared_cache_state(), stats.shared_cache_hits(),
                               stats.shared_cache_misses(), stats.shared_cache_errors(),
                               stats.shared_cache_stores(), stats.shared_cache_compiles_awaited(),
                               stats.shared_cache_backlog(), stats.shared_cache_dropped()));
    for (const v1::RpcLatency& fetch :
         {stats.shared_cache_hit_latency(), stats.shared_cache_miss_latency()}) {
      if (fetch.count() == 0) continue;
      absl::StrAppend(&text, absl::StrFormat("  %s: %d, p50 %.3f ms, p99 %.3f ms, max %.3f ms\n",
                                             fetch.method(), fetch.count(), fetch.p50_ms(),
                                             fetch.p99_ms(), fetch.max_ms()));
    }
  }
  for (const v1::BundleSubscription& source : stats.subscriptions()) {
    absl::StrAppend(&text, absl::StrFormat("bundle source %s: %s", source.source(),
                                           source.imported().empty() ? "nothing imported" : source.imported()));
    if (!source.last_check().empty()) {
      absl::StrAppend(&text, absl::StrFormat("; checked %s (%d checks, %d failed), next %s", source.last_check(),
                                             source.checks(), source.failures(), source.next_check()));
    }
    absl::StrAppend(&text, "\n");
    if (!source.last_import().empty()) {
      const v1::ImportBundleResponse& result = source.last_import_result();
      uint64_t refused = 0;
      for (const v1::RefusedEntries& entries : result.refused()) refused += entries.count();
      absl::StrAppend(&text, absl::StrFormat("  imported %s: %d entries, %s; %d stored, %d compiled, %d unchanged, "
                                             "%d refused, %d failed to compile, %d launchers to build\n",
                                             source.last_import(), result.entries(),
                                             result.signed_by().empty() ? "unsigned"
                                             : result.trusted()         ? "signed by trusted key " + result.signed_by()
                                                                        : "signed by untrusted key " + result.signed_by(),
                                             result.stored(), result.compiled(), result.unchanged(), refused,
                                             result.compile_failures_count(), result.launchers_ahead()));
      for (const v1::RefusedEntries& entries : result.refused()) {
        absl::StrAppend(&text, absl::StrFormat("    refused %d: %s\n", entries.count(), entries.reason()));
      }
    }
    if (!source.error().empty()) absl::StrAppend(&text, "  error: ", source.error(), "\n");
  }
  if (stats.misses_by_reason_size() > 0) {
    std::vector<std::string> reasons;
    for (const v1::MissReasonCount& by_reason : stats.misses_by_reason()) {
      reasons.push_back(absl::StrFormat("%d %s", by_reason.count(), by_reason.reason()));
    }
    absl::StrAppend(&text, "misses by reason: ", absl::StrJoin(reasons, ", "), "\n");
  }
  if (stats.tenant_compiles_waiting() > 0) {
    absl::StrAppend(&text, absl::StrFormat("farm tenants' compiles waiting their turn: %d\n",
                                           stats.tenant_compiles_waiting()));
  }
  for (const v1::NamespaceLookups& by_namespace : stats.lookups_by_namespace()) {
    absl::StrAppend(&text, absl::StrFormat("  %-22s %d hits, %d misses", by_namespace.namespace_(),
                                           by_namespace.hits(), by_namespace.misses()));
    if (by_namespace.waited_hits() > 0) {
      // Hits that waited for another client's compile of the key: compiles saved.
      absl::StrAppend(&text, absl::StrFormat(" (%d after waiting for another client's compile)",
                                             by_namespace.waited_hits()));
    }
    absl::StrAppend(&text, "\n");
  }
  if (stats.rpc_latency_size() > 0) {
    absl::StrAppend(&text, absl::StrFormat("%-15s %9s %7s %9s %9s %9s %9s\n", "rpc", "calls",
                                           "errors", "p50 ms", "p90 ms", "p99 ms", "max ms"));
  }
  for (const v1::RpcLatency& rpc : stats.rpc_latency()) {
    absl::StrAppend(&text, absl::StrFormat("%-15s %9d %7d %9.3f %9.3f %9.3f %9.3f\n", rpc.method(),
                                           rpc.count(), rpc.errors(), rpc.p50_ms(), rpc.p90_ms(),
                                           rpc.p99_ms(), rpc.max_ms()));
  }
  return text;
}

std::string FormatStatsJson(const v1::GetStatsResponse& stats) { return FormatJson(stats); }

std::string FormatJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

}  // namespace kiln
