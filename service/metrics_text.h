#ifndef KILN_SERVICE_METRICS_TEXT_H_
#define KILN_SERVICE_METRICS_TEXT_H_

#include <string>

#include "kiln/v1/kiln.pb.h"
#include "service/rpc_stats.h"

namespace kiln::service {

// kilnd's statistics in the Prometheus text exposition format (version
// 0.0.4): counters and gauges of `stats`, and each RPC's latency as a
// histogram. Names start with kiln_; counters end in _total.
std::string PrometheusText(const v1::GetStatsResponse& stats, const RpcStats& rpcs);

}  // namespace kiln::service

#endif  // KILN_SERVICE_METRICS_TEXT_H_
