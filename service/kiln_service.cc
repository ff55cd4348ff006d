#include "service/kiln_service.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "common/fmt_absl.h"
#include "common/status_macros.h"
#include "service/request_validation.h"
#include "spdlog/spdlog.h"

namespace kiln::service {
namespace {

// absl and gRPC share google.rpc.Code numbering, so the cast is exact.
grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

// Errors caused by the client are its to handle; only these are our problem.
bool IsServerSideError(const absl::Status& status) {
  return absl::IsInternal(status) || absl::IsDataLoss(status) || absl::IsUnknown(status);
}

void FillEntry(cache::CacheEntry entry, v1::CacheEntry& out) {
  out.set_created_unix_ms(absl::ToUnixMillis(entry.created));
  for (cache::StoredBlob& blob : entry.blobs) {
    v1::Blob* wire = out.add_blobs();
    wire->set_name(std::move(blob.name));
    wire->set_sha256(std::move(blob.digest));
    wire->set_size(blob.size);
    if (blob.data.has_value()) {
      wire->set_data(*std::move(blob.data));
    } else {
      wire->set_data_omitted(true);
    }
  }
}

constexpr absl::string_view kCompilerNotBuilt =
    "this kilnd stores and serves artifacts but has no compile pipeline yet; compile with "
    "stock Triton and Put the results";

}  // namespace

KilnService::KilnService(cache::ArtifactStore& store, std::string data_dir)
    : store_(store),
      data_dir_(std::move(data_dir)),
      blocking_pool_(static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 2u, 8u))) {}

template <typename Handler>
grpc::ServerUnaryReactor* KilnService::Serve(grpc::CallbackServerContext* context, Rpc rpc,
                                             Where where, Handler handler) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto run = [this, reactor, rpc, handler = std::move(handler)]() mutable {
    const absl::Time start = absl::Now();
    const absl::Status status = handler();
    rpc_stats_.Record(rpc, absl::Now() - start, status.ok());
    if (IsServerSideError(status)) {
      spdlog::error("[req {}] {} failed: {}", next_request_id_.fetch_add(1), RpcName(rpc),
                    status.ToString());
    } else if (!status.ok()) {
      spdlog::debug("[req {}] {} refused: {}", next_request_id_.fetch_add(1), RpcName(rpc),
                    status.ToString());
    }
    reactor->Finish(ToGrpcStatus(status));
  };
  if (where == Where::kBlockingPool) {
    blocking_pool_.Schedule(std::move(run));
  } else {
    run();
  }
  return reactor;
}

grpc::ServerUnaryReactor* KilnService::Lookup(grpc::CallbackServerContext* context,
                                              const v1::LookupRequest* request,
                                              v1::LookupResponse* response) {
  return Serve(context, Rpc::kLookup, Where::kInline, [this, request, response] {
    RETURN_IF_ERROR(ValidateLookup(*request));
    const absl::flat_hash_set<std::string> have(request->have_sha256().begin(),
                                                request->have_sha256().end());
    absl::StatusOr<cache::CacheEntry> entry = store_.Lookup(request->namespace_(), request->key(), have);
    if (absl::IsNotFound(entry.status())) {
      response->set_found(false);
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(entry.status());
    response->set_found(true);
    FillEntry(*std::move(entry), *response->mutable_entry());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KilnService::Put(grpc::CallbackServerContext* context,
                                           const v1::PutRequest* request,
                                           v1::PutResponse* response) {
  return Serve(context, Rpc::kPut, Where::kBlockingPool, [this, request, response] {
    RETURN_IF_ERROR(ValidatePut(*request));
    std::vector<cache::BlobInput> blobs;
    blobs.reserve(request->blobs_size());
    for (const v1::Blob& blob : request->blobs()) {
      blobs.push_back({blob.name(), blob.data(), blob.sha256()});
    }
    RETURN_IF_ERROR(store_.Put(request->namespace_(), request->key(), std::move(blobs)));
    ASSIGN_OR_RETURN(cache::StoreStats stats, store_.Stats());
    response->set_stored_bytes(stats.stored_bytes);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KilnService::Compile(grpc::CallbackServerContext* context,
                                               const v1::CompileRequest* /*request*/,
                                               v1::CompileResponse* /*response*/) {
  return Serve(context, Rpc::kCompile, Where::kInline,
               [] { return absl::UnimplementedError(kCompilerNotBuilt); });
}

grpc::ServerUnaryReactor* KilnService::BuildLauncher(grpc::CallbackServerContext* context,
                                                     const v1::BuildLauncherRequest* /*request*/,
                                                     v1::BuildLauncherResponse* /*response*/) {
  return Serve(context, Rpc::kBuildLauncher, Where::kInline,
               [] { return absl::UnimplementedError(kCompilerNotBuilt); });
}

grpc::ServerUnaryReactor* KilnService::GetStats(grpc::CallbackServerContext* context,
                                                const v1::GetStatsRequest* /*request*/,
                                                v1::GetStatsResponse* response) {
  return Serve(context, Rpc::kGetStats, Where::kInline, [this, response] {
    ASSIGN_OR_RETURN(cache::StoreStats stats, store_.Stats());
    response->set_hits(stats.hits);
    response->set_misses(stats.misses);
    response->set_puts(stats.puts);
    response->set_entries(stats.entries);
    response->set_blobs(stats.blobs);
    response->set_stored_bytes(stats.stored_bytes);
    response->set_max_size_bytes(stats.max_size_bytes);
    response->set_evictions(stats.evicted_entries);
    response->set_corrupt_entries_dropped(stats.corrupt_entries_dropped);
    response->set_server_version(KILN_VERSION);
    response->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
    response->set_data_dir(data_dir_);
    rpc_stats_.AppendTo(*response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KilnService::ListToolchains(grpc::CallbackServerContext* context,
                                                      const v1::ListToolchainsRequest* /*request*/,
                                                      v1::ListToolchainsResponse* /*response*/) {
  // No toolchain can be registered before the compile pipeline exists, so the
  // true answer is an empty list.
  return Serve(context, Rpc::kListToolchains, Where::kInline, [] { return absl::OkStatus(); });
}

}  // namespace kiln::service
