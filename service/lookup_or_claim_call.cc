// KilnService::LookupOrClaim: a lookup whose claim on a missing key lives
// exactly as long as the claimant's call (see CompileClaims for the rule).

#include <memory>
#include <mutex>
#include <utility>

#include "service/kiln_service.h"
#include "service/request_validation.h"

namespace kiln::service {

// One LookupOrClaim call. It owns itself (self_) from Start until gRPC's
// OnDone; the claims' callbacks hold weak references because they may run
// after the call ended. Everything it reads after Start is its own copy: the
// request and context belong to gRPC and go with the call.
class KilnService::LookupOrClaimCall final
    : public grpc::ServerWriteReactor<v1::LookupResponse>,
      public std::enable_shared_from_this<LookupOrClaimCall> {
 public:
  LookupOrClaimCall(KilnService& service, const v1::LookupRequest& request)
      : service_(service), request_(request) {
    service_.activity_.Begin();
  }

  void Start(const grpc::CallbackServerContext& context) {
    self_ = shared_from_this();
    absl::StatusOr<Caller> caller = service_.Authenticate(context);
    absl::Status status = caller.ok() ? ValidateLookup(request_) : caller.status();
    if (!status.ok()) return Answer(status);
    caller_ = *std::move(caller);
    ns_ = ScopedNamespace(caller_, request_.namespace_());
    if (request_.renew_claim()) {
      const std::optional<absl::Duration> left =
          service_.claims_.Renew(ns_, request_.key(), request_.claimant());
      response_.set_claimed(left.has_value());
      if (left.has_value()) response_.set_claim_seconds(absl::ToDoubleSeconds(*left));
      return Answer(absl::OkStatus());
    }
    status = service_.LookupInto(caller_, ns_, request_, response_);
    if (!status.ok() || response_.found()) return Answer(status);

    std::weak_ptr<LookupOrClaimCall> weak = weak_from_this();
    KilnService* service = &service_;
    const CompileClaims::Ticket ticket = service_.claims_.ClaimOrWait(
        ns_, request_.key(), request_.claimant(), /*may_claim=*/true,
        [weak] {
          if (auto call = weak.lock()) call->ClaimEnded();
        },
        [weak, service] {
          // Looks again on our own pool, never on the thread that ended the claim.
          if (auto call = weak.lock()) service->blocking_pool_.Schedule([call] { call->LookAgain(); });
        });
    if (ticket.answer != CompileClaims::Answer::kWaiting) {
      // A miss this client compiles (a waiter gets the claimant's result).
      service_.miss_log_.Record(caller_.trust_domain, ns_, request_.key(),
                                request_.has_key_components() ? &request_.key_components() : nullptr);
    }
    switch (ticket.answer) {
      case CompileClaims::Answer::kClaimed: {
        std::lock_guard lock(mutex_);
        claim_id_ = ticket.claim_id;
        response_.set_claimed(true);
        response_.set_claim_seconds(absl::ToDoubleSeconds(ticket.lapses_in));
        break;
      }
      case CompileClaims::Answer::kWaiting:
        service_.lookups_waited_.fetch_add(1);
        return;
      case CompileClaims::Answer::kNoClaim:  // shutting down: a plain miss
        break;
    }
    Answer(absl::OkStatus());
  }

  void OnWriteDone(bool /*ok*/) override {
    std::lock_guard lock(mutex_);
    writing_ = false;
    if (finish_requested_) FinishLocked(finish_status_);
  }

  void OnCancel() override {
    // The claimant (or a waiter) went away: its process died, its connection
    // dropped, or it ended the call because its frontend failed.
    uint64_t held;
    {
      std::lock_guard lock(mutex_);
      held = std::exchange(claim_id_, 0);
    }
    if (held != 0) service_.claims_.Abandon(ns_, request_.key(), held);
    std::lock_guard lock(mutex_);
    RequestFinishLocked(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    service_.activity_.End();
    self_.reset();
  }

 private:
  // The one response (or an error). A claimant's call stays open after it.
  void Answer(const absl::Status& status) {
    service_.rpc_stats_.Record(Rpc::kLookupOrClaim, absl::Now() - start_, status.ok());
    std::lock_guard lock(mutex_);
    if (finished_ || finish_requested_) return;
    if (!status.ok()) return FinishLocked(ToGrpcStatus(status));
    if (claim_id_ != 0) {
      writing_ = true;
      StartWrite(&response_);
      return;
    }
    finished_ = true;
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }

  // A waiter's claimant is done (stored, failed or gone): found, or neither.
  void LookAgain() {
    {
      std::lock_guard lock(mutex_);
      if (finished_ || finish_requested_) return;
    }
    const absl::Status status = service_.LookupInto(caller_, ns_, request_, response_);
    if (status.ok() && response_.found()) service_.CountWaitedHit(ns_);
    Answer(status);
  }

  // The claim ended without this call abandoning it: the key is stored, its
  // compile failed, it lapsed, or the same claimant took it over.
  void ClaimEnded() {
    std::lock_guard lock(mutex_);
    claim_id_ = 0;
    RequestFinishLocked(grpc::Status::OK);
  }

  void RequestFinishLocked(const grpc::Status& status) {
    if (finished_ || finish_requested_) return;
    if (writing_) {  // gRPC allows one operation at a time: finish after the write
      finish_requested_ = true;
      finish_status_ = status;
      return;
    }
    FinishLocked(status);
  }

  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  KilnService& service_;
  const v1::LookupRequest request_;
  const absl::Time start_ = absl::Now();
  Caller caller_;
  std::string ns_;
  v1::LookupResponse response_;
  std::mutex mutex_;
  uint64_t claim_id_ = 0;          // guarded; nonzero while this call holds the claim
  bool writing_ = false;           // guarded
  bool finish_requested_ = false;  // guarded
  grpc::Status finish_status_;     // guarded
  bool finished_ = false;          // guarded
  std::shared_ptr<LookupOrClaimCall> self_;
};

grpc::ServerWriteReactor<v1::LookupResponse>* KilnService::LookupOrClaim(
    grpc::CallbackServerContext* context, const v1::LookupRequest* request) {
  auto call = std::make_shared<LookupOrClaimCall>(*this, *request);
  call->Start(*context);
  return call.get();
}

}  // namespace kiln::service
