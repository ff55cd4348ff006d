#ifndef KILN_SERVICE_RPC_STATS_H_
#define KILN_SERVICE_RPC_STATS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/latency_histogram.h"
#include "kiln/v1/kiln.pb.h"

namespace kiln::service {

enum class Rpc {
  kLookup,
  kLookupOrClaim,
  kPut,
  kRecordHits,
  kCompile,
  kBuildLauncher,
  kGetStats,
  kListToolchains,
  kEvict,
  kVerify,
  kListEntries,
  kListMisses,
  kPrewarm,
  kCompileInductorKernel,
  kPutMany,
  kImportBundle,
  kCount
};

absl::string_view RpcName(Rpc rpc);

// `summary` as the API reports a latency.
v1::RpcLatency ToRpcLatency(absl::string_view method, const LatencyHistogram::Summary& summary,
                            uint64_t errors);

// Per-RPC latency and error counts since the service started.
class RpcStats {
 public:
  void Record(Rpc rpc, absl::Duration latency, bool ok);
  // Appends one RpcLatency per method that has been called.
  void AppendTo(v1::GetStatsResponse& response) const;
  // Each method's latencies and errors, called or not.
  template <typename Visit>  // void(absl::string_view method, const LatencyHistogram&, uint64_t errors)
  void ForEach(Visit visit) const {
    for (size_t i = 0; i < rpcs_.size(); ++i) {
      visit(RpcName(static_cast<Rpc>(i)), rpcs_[i].latency,
            rpcs_[i].errors.load(std::memory_order_relaxed));
    }
  }

 private:
  struct PerRpc {
    LatencyHistogram latency;
    std::atomic<uint64_t> errors{0};
  };
  std::array<PerRpc, static_cast<size_t>(Rpc::kCount)> rpcs_;
};

// Whether any call is in progress, and since when none has been: a kilnd
// started for one user stops after exit_when_idle_seconds without calls. A
// call counts from its start to its end, so a long compile, or a claim held
// open while its claimant compiles, keeps kilnd busy however long it takes.
class CallActivity {
 public:
  void Begin();
  void End();
  // How long no call has been in progress at `now`; zero while one is.
  absl::Duration IdleAt(absl::Time now) const;

 private:
  mutable std::mutex mutex_;
  int in_progress_ = 0;                 // guarded by mutex_
  absl::Time last_ended_ = absl::Now();  // guarded by mutex_
};

}  // namespace kiln::service

#endif  // KILN_SERVICE_RPC_STATS_H_
