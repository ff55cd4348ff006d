#ifndef KILN_SERVICE_RPC_STATS_H_
#define KILN_SERVICE_RPC_STATS_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/strings/string_view.h"
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

}  // namespace kiln::service

#endif  // KILN_SERVICE_RPC_STATS_H_
