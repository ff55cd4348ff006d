#ifndef KILN_SERVICE_KILN_SERVICE_H_
#define KILN_SERVICE_KILN_SERVICE_H_

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "absl/time/time.h"
#include "cache/artifact_store.h"
#include "common/thread_pool.h"
#include "compiler/toolchains.h"
#include "service/bundle_subscription.h"
#include "kiln/v1/kiln.grpc.pb.h"
#include "service/client_identity.h"
#include "service/compile_claims.h"
#include "service/compile_coordinator.h"
#include "service/connection_cap.h"
#include "service/miss_log.h"
#include "service/rpc_stats.h"
#include "service/tenant_compile_slots.h"

namespace kiln::service {

// The gRPC adapter of kiln.v1.Kiln over the artifact store. Handlers validate,
// call the core, and convert the absl::Status in one place (Serve); storage
// work that may block (puts: hashing, compression, fsync) runs on our own pool,
// never on gRPC's threads.
// Who is who over TCP. A Unix-socket peer is always the service's own user.
// A TCP client that sends `token` (metadata "x-kiln-token"; kilnd writes it to
// an endpoint file only allowed accounts can read) is that user too. Other TCP
// clients come through tcp_listen (`tokenless_allowed`), and are refused
// otherwise. There, over TLS with client identity, a client is the tenant its
// certificate or bearer token names (trust domain "tenant:NAME") and is
// refused without one; otherwise it is the anonymous "net" domain.
struct TcpAccess {
  std::string token;  // empty: no token listener
  bool tokenless_allowed = true;
  std::string endpoint_file;                    // named in refusals
  bool tls = false;                             // tcp_listen is TLS
  bool client_certificates = false;             // tls_client_ca is set
  std::shared_ptr<ClientTokens> client_tokens;  // null: no client_tokens file
  int compiles_per_tenant = 1;                  // the rest of a tenant's queue
  // tcp_max_connections on the listener (null: none); its refusals are in the stats.
  std::shared_ptr<const ConnectionCap> connection_cap;

  bool identifies_clients() const { return client_certificates || client_tokens != nullptr; }
};

// absl::Status as the gRPC status a call finishes with.
grpc::Status ToGrpcStatus(const absl::Status& status);

class KilnService final : public v1::Kiln::CallbackService {
 public:
  KilnService(cache::ArtifactStore& store, compiler::ToolchainRegistry& toolchains,
              CompileCoordinator& coordinator, std::string data_dir,
              ClaimLimits claim_limits, TcpAccess tcp_access = {});
  // Waits for a compile's `recorded` callback running now; later ones do nothing.
  ~KilnService() override;

  // Answers every lookup still waiting on another client's compile, so that
  // shutdown does not wait on them.
  void ReleaseWaitingLookups() { claims_.ReleaseAll(); }

  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* context,
                                   const v1::LookupRequest* request,
                                   v1::LookupResponse* response) override;
  grpc::ServerWriteReactor<v1::LookupResponse>* LookupOrClaim(
      grpc::CallbackServerContext* context, const v1::LookupRequest* request) override;
  grpc::ServerUnaryReactor* RecordHits(grpc::CallbackServerContext* context,
                                       const v1::RecordHitsRequest* request,
                                       v1::RecordHitsResponse* response) override;
  grpc::ServerUnaryReactor* Put(grpc::CallbackServerContext* context,
                                const v1::PutRequest* request,
                                v1::PutResponse* response) override;
  grpc::ServerUnaryReactor* PutMany(grpc::CallbackServerContext* context,
                                    const v1::PutManyRequest* request,
                                    v1::PutManyResponse* response) override;
  grpc::ServerUnaryReactor* Compile(grpc::CallbackServerContext* context,
                                    const v1::CompileRequest* request,
                                    v1::CompileResponse* response) override;
  grpc::ServerUnaryReactor* BuildLauncher(grpc::CallbackServerContext* context,
                                          const v1::BuildLauncherRequest* request,
                                          v1::BuildLauncherResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::GetStatsRequest* request,
                                     v1::GetStatsResponse* response) override;
  grpc::ServerUnaryReactor* Evict(grpc::CallbackServerContext* context,
                                  const v1::EvictRequest* request,
                                  v1::EvictResponse* response) override;
  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* context,
                                   const v1::VerifyRequest* request,
                                   v1::VerifyResponse* response) override;
  grpc::ServerUnaryReactor* ListEntries(grpc::CallbackServerContext* context,
                                        const v1::ListEntriesRequest* request,
                                        v1::ListEntriesResponse* response) override;
  grpc::ServerUnaryReactor* ListMisses(grpc::CallbackServerContext* context,
                                       const v1::ListMissesRequest* request,
                                       v1::ListMissesResponse* response) override;
  grpc::ServerUnaryReactor* Prewarm(grpc::CallbackServerContext* context,
                                    const v1::PrewarmRequest* request,
                                    v1::PrewarmResponse* response) override;
  grpc::ServerUnaryReactor* CompileInductorKernel(
      grpc::CallbackServerContext* context, const v1::CompileInductorKernelRequest* request,
      v1::CompileInductorKernelResponse* response) override;
  grpc::ServerUnaryReactor* ListToolchains(grpc::CallbackServerContext* context,
                                           const v1::ListToolchainsRequest* request,
                                           v1::ListToolchainsResponse* response) override;
  grpc::ServerReadReactor<v1::ImportBundleChunk>* ImportBundle(
      grpc::CallbackServerContext* context, v1::ImportBundleResponse* response) override;

  // Imports the bundle file `file` for kilnd's own user, as `kiln import`
  // does (a subscription's imports); blocks until it is done.
  absl::StatusOr<v1::ImportBundleResponse> ImportBundleAsOwner(const std::filesystem::path& file);

  // What GetStats reports of bundle_sources; null when there are none.
  void set_subscriptions(const BundleSubscriptions* subscriptions) { subscriptions_ = subscriptions; }

  // The file of PEM public keys whose signed bundles import as they are
  // (trusted_bundle_keys); read at each import.
  void set_trusted_bundle_keys(std::string file) { trusted_bundle_keys_ = std::move(file); }

  // What GetStats answers, and the same as a Prometheus text page (metrics_listen).
  absl::Status FillStats(v1::GetStatsResponse& response) const;
  absl::StatusOr<std::string> MetricsText() const;
  // How long no call has been in progress (exit_when_idle_seconds).
  absl::Duration IdleAt(absl::Time now) const { return activity_.IdleAt(now); }

 private:
  // Compiles `request` (which must outlive `finish`) for `caller` into
  // `response`, in the caller's tenant queue on a farm.
  void StartCompile(const Caller& caller, const v1::CompileRequest& request,
                    v1::CompileResponse* response,
                    std::function<void(const absl::Status&)> finish);
  // Plans and compiles a recorded kernel for `caller` (Prewarm; an untrusted
  // bundle's kernels) into `response`, which must outlive `finish`.
  void StartPrewarm(const Caller& caller, v1::PrewarmRequest request,
                    v1::PrewarmResponse* response,
                    std::function<void(const absl::Status&)> finish);
  // ImportBundle's work once the file is received: checked whole, then
  // stored or compiled as its trust allows, for `caller`.
  absl::StatusOr<v1::ImportBundleResponse> ImportBundleFileFor(const Caller& caller,
                                                               const std::filesystem::path& file,
                                                               bool replace);
  enum class Where { kInline, kBlockingPool };
  class LookupOrClaimCall;  // lookup_or_claim_call.cc
  class ImportBundleCall;   // import_bundle_call.cc

  // The caller's trust domain (see TcpAccess); UNAUTHENTICATED, naming what
  // to send, for a wrong token or a client that must but does not identify.
  // Every call asks once, before its handler runs.
  absl::StatusOr<Caller> Authenticate(const grpc::CallbackServerContext& context) const;
  // Maintenance changes the service user's cache: nobody else may ask for it.
  // PERMISSION_DENIED unless the caller is kilnd's own user; `what` begins
  // the message ("... is" / "are").
  absl::Status RequireLocalUser(const Caller& caller, absl::string_view what) const;

  // The store lookup behind Lookup; a miss is found = false. Blobs come as
  // served files when the request asks and the caller is kilnd's own user
  // (only it may read them; a remote caller could not).
  absl::Status LookupInto(const Caller& caller, const std::string& ns,
                          const v1::LookupRequest& request, v1::LookupResponse& response);

  // After a local client stored (ns, key): writes its served files and index
  // entry in the background, so the next process of that user finds them
  // without asking. `client_ns` is the namespace the client named.
  void ServeAheadOfLookups(const Caller& caller, const std::string& ns,
                           const std::string& client_ns, const std::string& key);
  // After a put of `put` stored under `ns` (scoped): its claim released, its
  // files served ahead where it asks for that.
  void AfterStored(const Caller& caller, const std::string& ns, const v1::PutRequest& put);

  // Authenticates the caller, runs `handler(caller)` (returning absl::Status)
  // inline or on the blocking pool, records its latency, logs server-side
  // failures once with a request id, and finishes the call with the converted
  // status.
  template <typename Handler>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* context, Rpc rpc, Where where,
                                  Handler handler);
  // The same for a handler that finishes later: it receives the caller and the
  // finish callback, which it must call exactly once, from any thread.
  template <typename Handler>
  grpc::ServerUnaryReactor* ServeAsync(grpc::CallbackServerContext* context, Rpc rpc,
                                       Handler handler);

  cache::ArtifactStore& store_;
  compiler::ToolchainRegistry& toolchains_;
  CompileCoordinator& coordinator_;
  const std::string data_dir_;
  const std::string executable_;
  const TcpAccess tcp_access_;
  std::string trusted_bundle_keys_;
  std::atomic<const BundleSubscriptions*> subscriptions_{nullptr};
  const absl::Time started_ = absl::Now();
  RpcStats rpc_stats_;
  CallActivity activity_;
  MissLog miss_log_;
  mutable std::atomic<uint64_t> next_request_id_{1};
  std::atomic<uint64_t> lookups_waited_{0};
  std::atomic<uint64_t> compiled_ahead_{0};           // clients' reports (RecordHits)
  std::atomic<uint64_t> ahead_microseconds_saved_{0};
  // A waiter that found the entry its claimant stored: a compile saved.
  void CountWaitedHit(const std::string& ns);
  mutable std::mutex waited_hits_mutex_;
  std::map<std::string, uint64_t> waited_hits_by_namespace_;  // guarded
  CompileClaims claims_;
  TenantCompileSlots tenant_compile_slots_;
  // Served files written ahead of lookups: one thread of its own, so this
  // background work never queues before a client's put, and a backlog
  // beyond kMaxServeAheadBacklog is dropped (a lookup writes them then).
  static constexpr int kMaxServeAheadBacklog = 256;
  std::atomic<int> serve_ahead_backlog_{0};
  ThreadPool serve_ahead_pool_{1};
  // Whether this service still is, for what the coordinator (which outlives
  // it: kilnd stops its server first) calls once a compile is stored, after
  // the call it came from ended. Each such callback holds it shared while it
  // runs; the destructor takes it alone and marks the service gone.
  struct Lifetime {
    std::shared_mutex mutex;
    bool alive = true;  // guarded by mutex
  };
  const std::shared_ptr<Lifetime> lifetime_ = std::make_shared<Lifetime>();
  ThreadPool blocking_pool_;  // last: drains before the members it uses go
};

}  // namespace kiln::service

#endif  // KILN_SERVICE_KILN_SERVICE_H_
