#include "service/kiln_service.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fmt_absl.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_context.h"
#include "service/metrics_text.h"
#include "service/request_validation.h"
#include "spdlog/spdlog.h"

namespace kiln::service {
namespace {

constexpr absl::string_view kMaintenance = "maintenance RPCs are";

std::vector<cache::BlobInput> BlobInputsOf(const v1::PutRequest& put) {
  std::vector<cache::BlobInput> blobs;
  blobs.reserve(put.blobs_size());
  for (const v1::Blob& blob : put.blobs()) blobs.push_back({blob.name(), blob.data(), blob.sha256()});
  return blobs;
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
    if (blob.file.has_value()) {
      wire->set_path(blob.file->string());
    } else if (blob.data.has_value()) {
      wire->set_data(*std::move(blob.data));
    } else {
      wire->set_data_omitted(true);
    }
  }
}

constexpr char kTokenHeader[] = "x-kiln-token";

// The token the client sent, or nullopt.
std::optional<absl::string_view> SentToken(const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find(kTokenHeader);
  if (found == metadata.end()) return std::nullopt;
  return absl::string_view(found->second.data(), found->second.size());
}

// "authorization: Bearer TOKEN", the token of a farm's client (client_tokens).
std::optional<absl::string_view> SentBearerToken(const grpc::CallbackServerContext& context) {
  constexpr absl::string_view kBearer = "Bearer ";
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find("authorization");
  if (found == metadata.end()) return std::nullopt;
  const absl::string_view value(found->second.data(), found->second.size());
  if (!absl::StartsWith(value, kBearer)) return std::nullopt;
  return value.substr(kBearer.size());
}

// Compares in time independent of where the strings differ, so the token
// cannot be guessed byte by byte from response times.
bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i) difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  return difference == 0;
}

v1::CompileError::Kind ToWireKind(compiler::CompileFailure::Kind kind) {
  using Kind = compiler::CompileFailure::Kind;
  switch (kind) {
    case Kind::kCompilationError: return v1::CompileError::KIND_COMPILATION_ERROR;
    case Kind::kPtxasError: return v1::CompileError::KIND_PTXAS_ERROR;
    case Kind::kOutOfResources: return v1::CompileError::KIND_OUT_OF_RESOURCES;
    case Kind::kWorkerCrashed: return v1::CompileError::KIND_WORKER_CRASHED;
    case Kind::kTimeout: return v1::CompileError::KIND_TIMEOUT;
  }
  return v1::CompileError::KIND_UNSPECIFIED;
}

void FillError(const compiler::CompileFailure& failure, v1::CompileError& out) {
  out.set_kind(ToWireKind(failure.kind));
  out.set_message(failure.message);
  out.set_log(failure.log);
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  // absl and gRPC share google.rpc.Code numbering, so the cast is exact.
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

KilnService::~KilnService() {
  std::unique_lock gone(lifetime_->mutex);
  lifetime_->alive = false;
}

KilnService::KilnService(cache::ArtifactStore& store, compiler::ToolchainRegistry& toolchains,
                         CompileCoordinator& coordinator, std::string data_dir,
                         ClaimLimits claim_limits, TcpAccess tcp_access)
    : store_(store),
      toolchains_(toolchains),
      coordinator_(coordinator),
      data_dir_(std::move(data_dir)),
      executable_(ExecutablePath().string()),
      tcp_access_(std::move(tcp_access)),
      miss_log_(data_dir_.empty() ? std::filesystem::path()
                                  : std::filesystem::path(data_dir_) / "miss-history.pb"),
      claims_(claim_limits,
              [this](const std::string& ns, const std::string& key) {
                miss_log_.Abandoned(ns, key);
              }),
      tenant_compile_slots_(tcp_access_.compiles_per_tenant),
      blocking_pool_(static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 2u, 8u))) {}

absl::StatusOr<Caller> KilnService::Authenticate(
    const grpc::CallbackServerContext& context) const {
  // The socket lives in a directory only the service's user may enter.
  if (absl::StartsWith(context.peer(), "unix:")) return Caller{std::string(kLocalDomain), true};
  if (const std::optional<absl::string_view> token = SentToken(context); token.has_value()) {
    if (!tcp_access_.token.empty() && SameSecret(*token, tcp_access_.token)) {
      return Caller{std::string(kLocalDomain), true};
    }
    return absl::UnauthenticatedError(absl::StrFormat(
        "the access token does not match this kilnd's (it writes a new one each start); read "
        "it again from %s",
        tcp_access_.endpoint_file.empty() ? "kilnd's endpoint file" : tcp_access_.endpoint_file));
  }
  if (!tcp_access_.tokenless_allowed) {
    return absl::UnauthenticatedError(absl::StrFormat(
        "this kilnd serves local clients that send the access token from %s (the kiln clients "
        "do); for tokenless TCP clients set tcp_listen",
        tcp_access_.endpoint_file));
  }
  if (!tcp_access_.tls) return Caller{"net", false};
  // Only the TLS listener may serve tokenless clients: a plaintext call here
  // came to the endpoint-file listener.
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  const std::vector<grpc::string_ref> transport =
      auth ? auth->FindPropertyValues(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME)
           : std::vector<grpc::string_ref>{};
  if (transport.empty() || transport.front() != GRPC_SSL_TRANSPORT_SECURITY_TYPE) {
    return absl::UnauthenticatedError(
        "this kilnd serves TCP clients over TLS only: connect to its tcp_listen address with "
        "grpcs://");
  }
  if (!tcp_access_.identifies_clients()) return Caller{"net", false};
  if (const std::optional<absl::string_view> bearer = SentBearerToken(context);
      bearer.has_value() && tcp_access_.client_tokens != nullptr) {
    ASSIGN_OR_RETURN(const std::string tenant, tcp_access_.client_tokens->TenantOf(*bearer));
    return Caller{absl::StrCat(kTenantDomainPrefix, tenant), false};
  }
  // Present only when the certificate verified against tls_client_ca.
  const std::vector<grpc::string_ref> common_name =
      auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
  if (tcp_access_.client_certificates && !common_name.empty()) {
    const absl::string_view tenant(common_name.front().data(), common_name.front().size());
    if (!IsValidTenantName(tenant)) {
      return absl::UnauthenticatedError(absl::StrFormat(
          "the client certificate's common name '%s' is not a tenant name (1-64 characters of "
          "[A-Za-z0-9._-]); issue it with such a name",
          tenant));
    }
    return Caller{absl::StrCat(kTenantDomainPrefix, tenant), false};
  }
  const bool certificates = tcp_access_.client_certificates;
  const bool tokens = tcp_access_.client_tokens != nullptr;
  return absl::UnauthenticatedError(absl::StrCat(
      "this kilnd serves only identified clients: ",
      certificates ? "present a client certificate signed by its client CA (KILN_CLIENT_CERT, "
                     "KILN_CLIENT_KEY)"
                   : "",
      certificates && tokens ? " or " : "", tokens ? "send a token (KILN_TOKEN_FILE)" : ""));
}

absl::Status KilnService::RequireLocalUser(const Caller& caller, absl::string_view what) const {
  if (caller.same_local_user) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrFormat(
      "%s served only to kilnd's own user: over its local socket, or with the access token "
      "from its endpoint file",
      what));
}

template <typename Handler>
grpc::ServerUnaryReactor* KilnService::ServeAsync(grpc::CallbackServerContext* context, Rpc rpc,
                                                  Handler handler) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  activity_.Begin();
  const absl::StatusOr<Caller> caller = Authenticate(*context);
  if (!caller.ok()) {
    rpc_stats_.Record(rpc, absl::Now() - start, false);
    activity_.End();
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  handler(*caller, [this, reactor, rpc, start](const absl::Status& status) {
    rpc_stats_.Record(rpc, absl::Now() - start, status.ok());
    activity_.End();
    if (IsServerSideError(status)) {
      spdlog::error("[req {}] {} failed: {}", next_request_id_.fetch_add(1), RpcName(rpc),
                    status.ToString());
    } else if (!status.ok()) {
      spdlog::debug("[req {}] {} refused: {}", next_request_id_.fetch_add(1), RpcName(rpc),
                    status.ToString());
    }
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

template <typename Handler>
grpc::ServerUnaryReactor* KilnService::Serve(grpc::CallbackServerContext* context, Rpc rpc,
                                             Where where, Handler handler) {
  return ServeAsync(context, rpc,
                    [this, where, handler = std::move(handler)](const Caller& caller,
                                                                auto finish) mutable {
                      auto run = [handler = std::move(handler), caller, finish]() mutable {
                        finish(handler(caller));
                      };
                      if (where == Where::kBlockingPool) {
                        blocking_pool_.Schedule(std::move(run));
                      } else {
                        run();
                      }
                    });
}

absl::Status KilnService::LookupInto(const Caller& caller, const std::string& ns,
                                     const v1::LookupRequest& request,
                                     v1::LookupResponse& response) {
  const absl::flat_hash_set<std::string> have(request.have_sha256().begin(),
                                              request.have_sha256().end());
  const cache::ArtifactStore::AsFiles as_files{request.namespace_()};
  absl::StatusOr<cache::CacheEntry> entry = store_.Lookup(
      ns, request.key(), have, request.as_files() && caller.same_local_user ? &as_files : nullptr);
  if (absl::IsNotFound(entry.status())) {
    response.set_found(false);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(entry.status());
  response.set_found(true);
  FillEntry(*std::move(entry), *response.mutable_entry());
  return absl::OkStatus();
}

void KilnService::ServeAheadOfLookups(const Caller& caller, const std::string& ns,
                                      const std::string& client_ns, const std::string& key) {
  if (!caller.same_local_user) return;  // only kilnd's own user reads served files
  if (serve_ahead_backlog_.fetch_add(1) >= kMaxServeAheadBacklog) {
    serve_ahead_backlog_.fetch_sub(1);
    return;
  }
  serve_ahead_pool_.Schedule([this, ns, key, as_files = cache::ArtifactStore::AsFiles{client_ns}] {
    serve_ahead_backlog_.fetch_sub(1);
    // A failed compile stored nothing: NOT_FOUND is no problem.
    if (absl::Status status = store_.ServeAsFiles(ns, key, as_files);
        !status.ok() && !absl::IsNotFound(status)) {
      spdlog::warn("cache: {}/{} not served as files ahead of lookups: {}", ns, key,
                   status.message());
    }
  });
}

grpc::ServerUnaryReactor* KilnService::Lookup(grpc::CallbackServerContext* context,
                                              const v1::LookupRequest* request,
                                              v1::LookupResponse* response) {
  return ServeAsync(context, Rpc::kLookup, [&](const Caller& caller, auto finish) {
    if (absl::Status status = ValidateLookup(*request); !status.ok()) return finish(status);
    const std::string ns = ScopedNamespace(caller, request->namespace_());
    if (absl::Status status = LookupInto(caller, ns, *request, *response);
        !status.ok() || response->found() || !request->wait_for_compile()) {
      return finish(status);
    }
    auto wake = [this, caller, ns, request, response, finish] {
      // Runs when the claim ends; looks again on our own pool, never on the
      // thread that ended it.
      blocking_pool_.Schedule([this, caller, ns, request, response, finish] {
        const absl::Status status = LookupInto(caller, ns, *request, *response);
        if (status.ok() && response->found()) CountWaitedHit(ns);
        finish(status);
      });
    };
    // A unary call cannot hold a claim (nothing would end it if its caller
    // went away): it only waits on one (LookupOrClaim claims).
    const CompileClaims::Ticket ticket =
        claims_.ClaimOrWait(ns, request->key(), "", /*may_claim=*/false, nullptr, std::move(wake));
    if (ticket.answer != CompileClaims::Answer::kWaiting) return finish(absl::OkStatus());
    lookups_waited_.fetch_add(1);
  });
}

void KilnService::CountWaitedHit(const std::string& ns) {
  std::lock_guard lock(waited_hits_mutex_);
  ++waited_hits_by_namespace_[ns];
}

void KilnService::AfterStored(const Caller& caller, const std::string& ns,
                              const v1::PutRequest& put) {
  claims_.Release(ns, put.key());
  if (!put.has_serve_as_files() || put.serve_as_files()) {
    ServeAheadOfLookups(caller, ns, put.namespace_(), put.key());
  }
}

grpc::ServerUnaryReactor* KilnService::Put(grpc::CallbackServerContext* context,
                                           const v1::PutRequest* request,
                                           v1::PutResponse* response) {
  return Serve(context, Rpc::kPut, Where::kBlockingPool,
               [this, request, response](const Caller& caller) {
    RETURN_IF_ERROR(ValidatePut(*request));
    const std::string ns = ScopedNamespace(caller, request->namespace_());
    RETURN_IF_ERROR(store_.Put(ns, request->key(), BlobInputsOf(*request)).status());
    AfterStored(caller, ns, *request);
    // Not Stats(): it counts every row, which a put must not wait for.
    response->set_stored_bytes(store_.StoredBytes());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KilnService::PutMany(grpc::CallbackServerContext* context,
                                               const v1::PutManyRequest* request,
                                               v1::PutManyResponse* response) {
  return Serve(context, Rpc::kPutMany, Where::kBlockingPool,
               [this, request, response](const Caller& caller) {
    RETURN_IF_ERROR(ValidatePutMany(*request));
    std::vector<absl::Status> results(request->entries_size());
    std::vector<cache::ArtifactStore::EntryInput> entries;
    std::vector<int> entry_of_input;  // entries[i] is request->entries(entry_of_input[i])
    std::vector<std::string> scoped_namespaces;  // entries[i]'s, kept past the store's move
    for (int i = 0; i < request->entries_size(); ++i) {
      const v1::PutRequest& put = request->entries(i);
      results[i] = ValidatePut(put);
      if (!results[i].ok()) continue;
      cache::ArtifactStore::EntryInput& entry = entries.emplace_back();
      entry.ns = ScopedNamespace(caller, put.namespace_());
      entry.key = put.key();
      entry.blobs = BlobInputsOf(put);
      entry_of_input.push_back(i);
      scoped_namespaces.push_back(entry.ns);
    }
    std::vector<absl::Status> stored = store_.PutMany(std::move(entries));
    for (size_t i = 0; i < stored.size(); ++i) {
      results[entry_of_input[i]] = stored[i];
      if (stored[i].ok()) AfterStored(caller, scoped_namespaces[i], request->entries(entry_of_input[i]));
    }
    for (const absl::Status& result : results) {
      v1::PutResult* out = response->add_results();
      out->set_code(static_cast<int32_t>(result.code()));
      out->set_message(std::string(result.message()));
    }
    response->set_stored_bytes(store_.StoredBytes());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KilnService::RecordHits(grpc::CallbackServerContext* context,
                                                  const v1::RecordHitsRequest* request,
                                                  v1::RecordHitsResponse* response) {
  return Serve(context, Rpc::kRecordHits, Where::kBlockingPool,
               [this, request, response](const Caller& caller) {
    RETURN_IF_ERROR(ValidateRecordHits(*request));
    compiled_ahead_.fetch_add(request->compiled_ahead());
    ahead_microseconds_saved_.fetch_add(
        static_cast<uint64_t>(std::llround(request->ahead_seconds_saved() * 1e6)));
    ASSIGN_OR_RETURN(uint64_t recorded,
                     store_.RecordHits(ScopedNamespace(caller, request->namespace_()),
                                       {request->keys().begin(), request->keys().end()}));
    response->set_recorded(recorded);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KilnService::Compile(grpc::CallbackServerContext* context,
                                               const v1::CompileRequest* request,
                                               v1::CompileResponse* response) {
  return ServeAsync(context, Rpc::kCompile, [&](const Caller& caller, auto finish) {
    if (absl::Status status = ValidateCompile(*request); !status.ok()) return finish(status);
    StartCompile(caller, *request, response, std::move(finish));
  });
}

void KilnService::StartCompile(const Caller& caller, const v1::CompileRequest& request,
                               v1::CompileResponse* response,
                               std::function<void(const absl::Status&)> finish) {
  const std::string alias_ns = CompileAliasNamespace(caller, request);
  claims_.MarkCompiling(alias_ns, request.cache_key());
  // A farm tenant's compiles take turns in its own queue (tenant_compiles).
  const bool queued = absl::StartsWith(caller.trust_domain, kTenantDomainPrefix);
  auto compile = [this, &request, response, finish, caller, alias_ns, queued] {
    coordinator_.Compile(
        request, caller,
        [this, response, finish, queued,
         tenant = caller.trust_domain](absl::StatusOr<CompileOutcome> outcome) {
          if (queued) tenant_compile_slots_.Done(tenant);
          if (!outcome.ok()) return finish(outcome.status());
          response->set_cache_hit(outcome->cache_hit);
          response->set_ptxas_log(outcome->ptxas_log);
          response->mutable_stage_seconds()->insert(outcome->stage_seconds.begin(),
                                                    outcome->stage_seconds.end());
          if (outcome->no_worker_ready) {
            response->set_no_worker_ready(true);
          } else if (auto* entry = std::get_if<cache::CacheEntry>(&outcome->result)) {
            FillEntry(std::move(*entry), *response->mutable_entry());
          } else {
            FillError(std::get<compiler::CompileFailure>(outcome->result),
                      *response->mutable_error());
          }
          finish(absl::OkStatus());
        },
        // Stored under the caller's key, or failed: clients waiting on it look again.
        [this, lifetime = lifetime_, caller, alias_ns,
         client_ns = request.namespace_().empty() ? "triton" : request.namespace_(),
         key = request.cache_key()] {
          std::shared_lock alive(lifetime->mutex);
          if (!lifetime->alive) return;  // kilnd stopped serving: nobody waits on the key
          claims_.Release(alias_ns, key);
          ServeAheadOfLookups(caller, alias_ns, client_ns, key);
        });
  };
  if (queued) {
    tenant_compile_slots_.Run(caller.trust_domain, std::move(compile));
  } else {
    compile();
  }
}

grpc::ServerUnaryReactor* KilnService::CompileInductorKernel(
    grpc::CallbackServerContext* context, const v1::CompileInductorKernelRequest* request,
    v1::CompileInductorKernelResponse* response) {
  return ServeAsync(context, Rpc::kCompileInductorKernel, [&](const Caller& caller, auto finish) {
    // The module is a Python program: kilnd runs it only as the user who sent it.
    if (absl::Status local = RequireLocalUser(
            caller, "CompileInductorKernel runs the client's module (other clients compile "
                    "inductor's kernels with Compile), so it is");
        !local.ok()) {
      return finish(local);
    }
    if (absl::Status status = ValidateCompileInductorKernel(*request); !status.ok()) {
      return finish(status);
    }
    coordinator_.CompileInductorKernel(
        *request, caller, [response, finish](absl::StatusOr<InductorKernelOutcome> outcome) {
          if (!outcome.ok()) return finish(outcome.status());
          if (outcome->failure.has_value()) {
            FillError(*outcome->failure, *response->mutable_error());
          } else {
            for (std::string& key : outcome->keys) {
              response->mutable_compiled()->add_keys(std::move(key));
            }
          }
          response->set_worker_seconds(outcome->worker_seconds);
          finish(absl::OkStatus());
        });
  });
}

grpc::ServerUnaryReactor* KilnService::Prewarm(grpc::CallbackServerContext* context,
                                               const v1::PrewarmRequest* request,
                                               v1::PrewarmResponse* response) {
  return ServeAsync(context, Rpc::kPrewarm, [&](const Caller& caller, auto finish) {
    if (absl::Status status = ValidatePrewarm(*request); !status.ok()) return finish(status);
    StartPrewarm(caller, *request, response, finish);
  });
}

void KilnService::StartPrewarm(const Caller& caller, v1::PrewarmRequest request,
                               v1::PrewarmResponse* response,
                               std::function<void(const absl::Status&)> finish) {
  coordinator_.PlanPrewarm(
      std::move(request), [this, caller, response, finish](absl::StatusOr<PrewarmPlan> plan) {
        if (!plan.ok()) return finish(plan.status());
        if (!plan->skipped.empty()) {
          response->set_skipped(plan->skipped);
          return finish(absl::OkStatus());
        }
        // What the recording's toolchain made of it is checked as any compile is.
        if (absl::Status valid = ValidateCompile(plan->compile); !valid.ok()) {
          return finish(valid);
        }
        response->set_key(plan->compile.cache_key());
        // A kernel stored already under the key its target's clients look up
        // (their own compile, an earlier prewarm, a trusted import) is not
        // compiled again: kilnd's record of compiles (shared.compile) has no
        // entry for what a client compiled itself.
        if (store_.Lookup(CompileAliasNamespace(caller, plan->compile), plan->compile.cache_key()).ok()) {
          response->mutable_compile()->set_cache_hit(true);
          return finish(absl::OkStatus());
        }
        // The compile request lives until the compile is answered.
        auto compile = std::make_shared<v1::CompileRequest>(std::move(plan->compile));
        StartCompile(caller, *compile, response->mutable_compile(),
                     [compile, finish](const absl::Status& status) { finish(status); });
      });
}

grpc::ServerUnaryReactor* KilnService::BuildLauncher(grpc::CallbackServerContext* context,
                                                     const v1::BuildLauncherRequest* request,
                                                     v1::BuildLauncherResponse* response) {
  return ServeAsync(context, Rpc::kBuildLauncher, [&](const Caller& caller, auto finish) {
    if (absl::Status status = ValidateBuildLauncher(*request); !status.ok()) return finish(status);
    coordinator_.BuildLauncher(
        *request, caller,
        [response, finish](absl::StatusOr<CompileOutcome> outcome) {
          if (!outcome.ok()) return finish(outcome.status());
          response->set_cache_hit(outcome->cache_hit);
          if (auto* entry = std::get_if<cache::CacheEntry>(&outcome->result)) {
            v1::CacheEntry wire;
            FillEntry(std::move(*entry), wire);
            *response->mutable_module() = std::move(*wire.mutable_blobs(0));
          } else {
            FillError(std::get<compiler::CompileFailure>(outcome->result),
                      *response->mutable_error());
          }
          finish(absl::OkStatus());
        });
  });
}

grpc::ServerUnaryReactor* KilnService::GetStats(grpc::CallbackServerContext* context,
                                                const v1::GetStatsRequest* /*request*/,
                                                v1::GetStatsResponse* response) {
  return Serve(context, Rpc::kGetStats, Where::kInline,
               [this, response](const Caller&) { return FillStats(*response); });
}

absl::StatusOr<std::string> KilnService::MetricsText() const {
  v1::GetStatsResponse stats;
  RETURN_IF_ERROR(FillStats(stats));
  return PrometheusText(stats, rpc_stats_);
}

absl::Status KilnService::FillStats(v1::GetStatsResponse& out) const {
  v1::GetStatsResponse* response = &out;
  ASSIGN_OR_RETURN(cache::StoreStats stats, store_.Stats());
  if (const BundleSubscriptions* subscriptions = subscriptions_.load(); subscriptions != nullptr) {
    subscriptions->FillStats(*response);
  }
  response->set_hits(stats.hits);
  response->set_misses(stats.misses);
  response->set_puts(stats.puts);
  response->set_entries(stats.entries);
  response->set_blobs(stats.blobs);
  response->set_stored_bytes(stats.stored_bytes);
  response->set_max_size_bytes(stats.max_size_bytes);
  response->set_disk_bytes(stats.disk_bytes);
  response->set_puts_refused_disk_full(stats.puts_refused_disk_full);
  if (stats.disk_full_since.has_value()) {
    response->set_disk_full_since(absl::FormatTime(absl::RFC3339_sec, *stats.disk_full_since,
                                                   absl::LocalTimeZone()));
  }
  response->set_evictions(stats.evicted_entries);
  response->set_corrupt_entries_dropped(stats.corrupt_entries_dropped);
  {
    std::lock_guard lock(waited_hits_mutex_);
    for (const auto& [ns, counts] : stats.lookups_by_namespace) {
      v1::NamespaceLookups* lookups = response->add_lookups_by_namespace();
      lookups->set_namespace_(ns);
      lookups->set_hits(counts.first);
      lookups->set_misses(counts.second);
      if (auto waited = waited_hits_by_namespace_.find(ns); waited != waited_hits_by_namespace_.end()) {
        lookups->set_waited_hits(waited->second);
      }
    }
  }
  response->set_server_version(KILN_VERSION);
  response->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
  response->set_data_dir(data_dir_);
  response->set_executable(executable_);
  response->set_compiled_ahead(compiled_ahead_.load());
  response->set_ahead_seconds_saved(static_cast<double>(ahead_microseconds_saved_.load()) / 1e6);
  const CoordinatorStats compiles = coordinator_.Stats();
  response->set_compiles(compiles.compiles);
  response->set_compile_cache_hits(compiles.compile_cache_hits);
  response->set_single_flight_joins(compiles.single_flight_joins);
  response->set_compile_failures(compiles.compile_failures);
  response->set_launcher_builds(compiles.launcher_builds);
  response->set_launcher_cache_hits(compiles.launcher_cache_hits);
  response->set_lookups_waited(lookups_waited_.load());
  response->set_tenant_compiles_waiting(tenant_compile_slots_.waiting());
  if (tcp_access_.connection_cap != nullptr) {
    response->set_tcp_connections_refused(tcp_access_.connection_cap->refused());
  }
  if (std::optional<cache::SharedTierStats> shared = coordinator_.SharedTierStats()) {
    response->set_shared_cache_state(shared->state);
    response->set_shared_cache_hits(shared->hits);
    response->set_shared_cache_misses(shared->misses);
    response->set_shared_cache_errors(shared->errors);
    response->set_shared_cache_stores(shared->stores);
    response->set_shared_cache_compiles_awaited(shared->compiles_awaited);
    response->set_shared_cache_backlog(shared->backlog);
    response->set_shared_cache_dropped(shared->dropped);
    *response->mutable_shared_cache_hit_latency() =
        ToRpcLatency("shared cache hit", shared->hit_latency, 0);
    *response->mutable_shared_cache_miss_latency() =
        ToRpcLatency("shared cache miss", shared->miss_latency, shared->errors);
  } else {
    response->set_shared_cache_state("off");
  }
  response->set_compile_seconds(compiles.compile_seconds);
  const compiler::PoolStats workers = toolchains_.TotalStats();
  response->set_workers_started(workers.workers_started);
  response->set_workers_lost(workers.workers_lost);
  response->set_live_workers(workers.live_workers);
  for (const auto& [reason, count] : miss_log_.CountsByReason()) {
    v1::MissReasonCount* by_reason = response->add_misses_by_reason();
    by_reason->set_reason(reason);
    by_reason->set_count(count);
  }
  rpc_stats_.AppendTo(*response);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* KilnService::Evict(grpc::CallbackServerContext* context,
                                             const v1::EvictRequest* request,
                                             v1::EvictResponse* response) {
  return Serve(context, Rpc::kEvict, Where::kBlockingPool,
               [this, request, response](const Caller& caller) {
    RETURN_IF_ERROR(RequireLocalUser(caller, kMaintenance));
    ASSIGN_OR_RETURN(uint64_t evicted, store_.EvictToSize(request->target_bytes()));
    store_.RemoveServedCopiesGone();
    ASSIGN_OR_RETURN(cache::StoreStats stats, store_.Stats());
    response->set_evicted_entries(evicted);
    response->set_stored_bytes(stats.stored_bytes);
    response->set_disk_bytes(stats.disk_bytes);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KilnService::Verify(grpc::CallbackServerContext* context,
                                              const v1::VerifyRequest* /*request*/,
                                              v1::VerifyResponse* response) {
  return Serve(context, Rpc::kVerify, Where::kBlockingPool,
               [this, response](const Caller& caller) {
    RETURN_IF_ERROR(RequireLocalUser(caller, kMaintenance));
    ASSIGN_OR_RETURN(cache::ArtifactStore::VerifyReport report, store_.VerifyAll());
    response->set_blobs_checked(report.blobs_checked);
    response->set_corrupt_blobs(report.corrupt_blobs);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KilnService::ListEntries(grpc::CallbackServerContext* context,
                                                   const v1::ListEntriesRequest* request,
                                                   v1::ListEntriesResponse* response) {
  return Serve(context, Rpc::kListEntries, Where::kBlockingPool,
               [this, request, response](const Caller& caller) {
    // An export hands out blobs as they are: the service's own user's only.
    RETURN_IF_ERROR(RequireLocalUser(caller, kMaintenance));
    RETURN_IF_ERROR(ValidateListEntries(*request));
    const std::string domain_prefix = ScopedNamespace(caller, "");
    const std::string only = request->namespace_().empty() ? "" : ScopedNamespace(caller, request->namespace_());
    const uint32_t limit = request->limit() == 0 ? 1000 : request->limit();
    // A namespace is a prefix to the store ("local/triton" also starts
    // "local/triton.x"): the exact one is picked here.
    ASSIGN_OR_RETURN(std::vector<cache::ArtifactStore::ListedEntry> entries,
                     store_.ListEntries(only.empty() ? domain_prefix : only,
                                        absl::FromUnixMillis(request->since_unix_ms()),
                                        request->after(), limit));
    for (const cache::ArtifactStore::ListedEntry& entry : entries) {
      if (!only.empty() && entry.ns != only) continue;
      v1::ListedEntry* listed = response->add_entries();
      listed->set_namespace_(entry.ns.substr(domain_prefix.size()));
      listed->set_key(entry.key);
      listed->set_created_unix_ms(absl::ToUnixMillis(entry.created));
    }
    response->set_next_after(entries.size() == limit ? entries.back().id : 0);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KilnService::ListMisses(grpc::CallbackServerContext* context,
                                                  const v1::ListMissesRequest* request,
                                                  v1::ListMissesResponse* response) {
  return Serve(context, Rpc::kListMisses, Where::kInline, [this, request, response](const Caller& caller) {
    if (request->last() > 1000) return absl::InvalidArgumentError("last: at most 1000 misses");
    for (v1::Miss& miss : miss_log_.Latest(caller.trust_domain, request->last() == 0 ? 20 : request->last())) {
      *response->add_misses() = std::move(miss);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KilnService::ListToolchains(grpc::CallbackServerContext* context,
                                                      const v1::ListToolchainsRequest* /*request*/,
                                                      v1::ListToolchainsResponse* response) {
  // Complete once the probes under way end (kilnd probes a toolchain it
  // never saw in the background after its start): a blocking pool's wait.
  return Serve(context, Rpc::kListToolchains, Where::kBlockingPool, [this, response](const Caller&) {
    for (const compiler::ToolchainInfo& info : toolchains_.List(/*wait_for_probes=*/true)) {
      v1::Toolchain* toolchain = response->add_toolchains();
      toolchain->set_triton_key(info.triton_key);
      toolchain->set_triton_version(info.triton_version);
      toolchain->set_python_executable(info.python_executable);
      toolchain->set_python_version(info.python_version);
      toolchain->mutable_backends()->Add(info.backends.begin(), info.backends.end());
    }
    return absl::OkStatus();
  });
}

}  // namespace kiln::service
