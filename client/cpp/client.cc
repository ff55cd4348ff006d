#include "kiln/client.h"

#include <cstdlib>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/byte_size.h"
#include "common/platform.h"
#include "common/sha256.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace kiln {

std::string DefaultEndpoint() {
  const char* configured = std::getenv("KILN_ENDPOINT");
  if (configured != nullptr && configured[0] != '\0') return configured;
  return platform::DefaultLocalEndpoint();
}

Client::Client(ClientOptions options)
    : endpoint_(options.endpoint.empty() ? DefaultEndpoint() : options.endpoint),
      timeout_(options.timeout) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(std::numeric_limits<int>::max());
  arguments.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  channel_ = grpc::CreateCustomChannel(endpoint_, grpc::InsecureChannelCredentials(), arguments);
  stub_ = v1::Kiln::NewStub(channel_);
}

std::unique_ptr<grpc::ClientContext> Client::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  return context;
}

absl::Status Client::FromGrpc(const grpc::Status& status, absl::string_view method) const {
  if (status.ok()) return absl::OkStatus();
  std::string message = absl::StrCat(method, ": ", status.error_message());
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    absl::StrAppend(&message, " (is kilnd running at ", endpoint_, "?)");
  }
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), message);
}

absl::Status Client::CheckHealth() {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  auto context = NewContext();
  const grpc::Status status = health->Check(context.get(), request, &response);
  if (!status.ok()) return FromGrpc(status, "health check");
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError(absl::StrCat("kilnd at ", endpoint_, " is not serving (",
                                               response.ShortDebugString(), ")"));
  }
  return absl::OkStatus();
}

absl::Status Client::WaitUntilServing(absl::Duration deadline) {
  const absl::Time give_up = absl::Now() + deadline;
  absl::Status status;
  while (true) {
    // Blocks until the channel connects or the attempt's deadline passes,
    // rather than sleeping between tries.
    channel_->WaitForConnected(absl::ToChronoTime(std::min(give_up, absl::Now() + absl::Milliseconds(200))));
    status = CheckHealth();
    if (status.ok() || absl::Now() >= give_up) return status;
    std::this_thread::yield();
  }
}

absl::Status Client::Put(absl::string_view ns, absl::string_view key,
                         const std::vector<std::pair<std::string, std::string>>& named_blobs) {
  v1::PutRequest request;
  request.set_namespace_(std::string(ns));
  request.set_key(std::string(key));
  for (const auto& [name, data] : named_blobs) {
    v1::Blob* blob = request.add_blobs();
    blob->set_name(name);
    blob->set_data(data);
    blob->set_size(data.size());
    blob->set_sha256(DigestBytes(Sha256(data)));
  }
  v1::PutResponse response;
  auto context = NewContext();
  return FromGrpc(stub_->Put(context.get(), request, &response), "put");
}

absl::StatusOr<std::optional<v1::CacheEntry>> Client::Lookup(absl::string_view ns,
                                                             absl::string_view key) {
  v1::LookupRequest request;
  request.set_namespace_(std::string(ns));
  request.set_key(std::string(key));
  v1::LookupResponse response;
  auto context = NewContext();
  if (absl::Status status = FromGrpc(stub_->Lookup(context.get(), request, &response), "lookup");
      !status.ok()) {
    return status;
  }
  if (!response.found()) return std::nullopt;
  return std::move(*response.mutable_entry());
}

absl::StatusOr<v1::GetStatsResponse> Client::Stats() {
  v1::GetStatsRequest request;
  v1::GetStatsResponse response;
  auto context = NewContext();
  if (absl::Status status = FromGrpc(stub_->GetStats(context.get(), request, &response), "stats");
      !status.ok()) {
    return status;
  }
  return response;
}

std::string FormatStats(const v1::GetStatsResponse& stats) {
  const uint64_t lookups = stats.hits() + stats.misses();
  std::string text = absl::StrFormat(
      "kilnd %s, up %.0f s, data dir %s\n"
      "cache:   %d entries, %d blobs, %s of %s stored\n"
      "lookups: %d hits, %d misses (hit rate %.1f%%), %d puts\n"
      "evicted: %d entries; dropped as corrupt: %d\n"
      "compile: %d run by workers, %d cache hits, %d joined a running compile, %d failed\n"
      "workers: %d started, %d lost, %d live; launchers: %d built, %d cache hits\n",
      stats.server_version(), stats.uptime_seconds(), stats.data_dir(), stats.entries(),
      stats.blobs(), FormatByteSize(stats.stored_bytes()), FormatByteSize(stats.max_size_bytes()),
      stats.hits(), stats.misses(),
      lookups == 0 ? 0.0 : 100.0 * static_cast<double>(stats.hits()) / static_cast<double>(lookups),
      stats.puts(), stats.evictions(), stats.corrupt_entries_dropped(), stats.compiles(),
      stats.compile_cache_hits(), stats.single_flight_joins(), stats.compile_failures(),
      stats.workers_started(), stats.workers_lost(), stats.live_workers(), stats.launcher_builds(),
      stats.launcher_cache_hits());
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

std::string FormatStatsJson(const v1::GetStatsResponse& stats) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(stats, &json, options);
  return json;
}

}  // namespace kiln
