#include "service/rpc_stats.h"

namespace kiln::service {
namespace {

constexpr std::array<absl::string_view, static_cast<size_t>(Rpc::kCount)> kRpcNames = {
    "Lookup", "LookupOrClaim", "Put", "RecordHits", "Compile", "BuildLauncher", "GetStats", "ListToolchains", "Evict", "Verify", "ListEntries", "ListMisses", "Prewarm",
    "CompileInductorKernel", "PutMany", "ImportBundle"};

double Millis(absl::Duration duration) { return absl::ToDoubleMilliseconds(duration); }

}  // namespace

absl::string_view RpcName(Rpc rpc) { return kRpcNames[static_cast<size_t>(rpc)]; }

v1::RpcLatency ToRpcLatency(absl::string_view method, const LatencyHistogram::Summary& summary,
                            uint64_t errors) {
  v1::RpcLatency latency;
  latency.set_method(std::string(method));
  latency.set_count(summary.count);
  latency.set_errors(errors);
  latency.set_p50_ms(Millis(summary.p50));
  latency.set_p90_ms(Millis(summary.p90));
  latency.set_p99_ms(Millis(summary.p99));
  latency.set_max_ms(Millis(summary.max));
  return latency;
}

void RpcStats::Record(Rpc rpc, absl::Duration latency, bool ok) {
  PerRpc& stats = rpcs_[static_cast<size_t>(rpc)];
  stats.latency.Record(latency);
  if (!ok) stats.errors.fetch_add(1, std::memory_order_relaxed);
}

void RpcStats::AppendTo(v1::GetStatsResponse& response) const {
  for (size_t i = 0; i < rpcs_.size(); ++i) {
    const LatencyHistogram::Summary summary = rpcs_[i].latency.Summarize();
    if (summary.count == 0) continue;
    *response.add_rpc_latency() =
        ToRpcLatency(kRpcNames[i], summary, rpcs_[i].errors.load(std::memory_order_relaxed));
  }
}

void CallActivity::Begin() {
  std::lock_guard lock(mutex_);
  ++in_progress_;
}

void CallActivity::End() {
  std::lock_guard lock(mutex_);
  --in_progress_;
  last_ended_ = absl::Now();
}

absl::Duration CallActivity::IdleAt(absl::Time now) const {
  std::lock_guard lock(mutex_);
  return in_progress_ > 0 ? absl::ZeroDuration() : now - last_ended_;
}

}  // namespace kiln::service
