#include "service/metrics_text.h"

#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace kiln::service {
namespace {

// Latency buckets from a warm hit (a fraction of a millisecond) to a long
// compile (a minute), in seconds as Prometheus expects.
const std::vector<absl::Duration>& LatencyBounds() {
  static const auto* bounds = new std::vector<absl::Duration>{
      absl::Microseconds(100), absl::Microseconds(250), absl::Microseconds(500),
      absl::Milliseconds(1),   absl::Milliseconds(2.5), absl::Milliseconds(5),
      absl::Milliseconds(10),  absl::Milliseconds(25),  absl::Milliseconds(50),
      absl::Milliseconds(100), absl::Milliseconds(250), absl::Milliseconds(500),
      absl::Seconds(1),        absl::Seconds(2.5),      absl::Seconds(5),
      absl::Seconds(10),       absl::Seconds(30),       absl::Seconds(60)};
  return *bounds;
}

// A label value as the format quotes it.
std::string Quoted(absl::string_view value) {
  return absl::StrCat("\"",
                      absl::StrReplaceAll(value, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}}),
                      "\"");
}

class Page {
 public:
  // One metric family: its HELP and TYPE lines, once.
  void Family(absl::string_view name, absl::string_view type, absl::string_view help) {
    absl::StrAppend(&text_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  }
  void Sample(absl::string_view name, absl::string_view labels, double value) {
    absl::StrAppend(&text_, name, labels.empty() ? "" : "{", labels, labels.empty() ? "" : "}",
                    " ", absl::StrFormat("%.15g", value), "\n");
  }
  void One(absl::string_view name, absl::string_view type, absl::string_view help, double value) {
    Family(name, type, help);
    Sample(name, "", value);
  }
  std::string Take() { return std::move(text_); }

 private:
  std::string text_;
};

}  // namespace

std::string PrometheusText(const v1::GetStatsResponse& stats, const RpcStats& rpcs) {
  Page page;
  page.Family("kiln_build_info", "gauge", "kilnd's version (the value is always 1).");
  page.Sample("kiln_build_info", absl::StrCat("version=", Quoted(stats.server_version())), 1);
  page.One("kiln_uptime_seconds", "gauge", "Seconds since kilnd started.", stats.uptime_seconds());

  page.Family("kiln_lookups_total", "counter", "Cache lookups by namespace and result.");
  for (const v1::NamespaceLookups& lookups : stats.lookups_by_namespace()) {
    const std::string ns = absl::StrCat("namespace=", Quoted(lookups.namespace_()));
    page.Sample("kiln_lookups_total", absl::StrCat(ns, ",result=\"hit\""), static_cast<double>(lookups.hits()));
    page.Sample("kiln_lookups_total", absl::StrCat(ns, ",result=\"miss\""),
                static_cast<double>(lookups.misses()));
  }
  page.Family("kiln_waited_hits_total", "counter",
              "Hits that waited for another client's claim on the key: compiles saved, by namespace.");
  for (const v1::NamespaceLookups& lookups : stats.lookups_by_namespace()) {
    page.Sample("kiln_waited_hits_total", absl::StrCat("namespace=", Quoted(lookups.namespace_())),
                static_cast<double>(lookups.waited_hits()));
  }
  page.One("kiln_cache_hits_total", "counter", "Cache lookups that hit, all namespaces.",
           static_cast<double>(stats.hits()));
  page.One("kiln_cache_misses_total", "counter", "Cache lookups that missed, all namespaces.",
           static_cast<double>(stats.misses()));
  page.Family("kiln_misses_total", "counter",
              "Misses a client compiled, by what was new (kiln misses explains each).");
  for (const v1::MissReasonCount& by_reason : stats.misses_by_reason()) {
    page.Sample("kiln_misses_total", absl::StrCat("reason=", Quoted(by_reason.reason())),
                static_cast<double>(by_reason.count()));
  }
  page.One("kiln_lookups_waited_total", "counter",
           "Misses that waited for another client's compile of the key.",
           static_cast<double>(stats.lookups_waited()));
  page.One("kiln_puts_total", "counter", "Entries stored by clients.", static_cast<double>(stats.puts()));
  page.One("kiln_store_entries", "gauge", "Entries in the cache.", static_cast<double>(stats.entries()));
  page.One("kiln_store_blobs", "gauge", "Distinct blobs in the cache.", static_cast<double>(stats.blobs()));
  page.One("kiln_store_bytes", "gauge", "Bytes the cache's blobs hold, compressed.",
           static_cast<double>(stats.stored_bytes()));
  page.One("kiln_store_disk_bytes", "gauge",
           "What the data directory holds on disk: blobs, served copies, index and WAL.",
           static_cast<double>(stats.disk_bytes()));
  page.One("kiln_store_max_bytes", "gauge",
           "max_cache_size: eviction keeps kiln_store_disk_bytes under it.",
           static_cast<double>(stats.max_size_bytes()));
  page.One("kiln_store_disk_full", "gauge", "1 while results are not stored for a full disk.",
           stats.disk_full_since().empty() ? 0 : 1);
  page.One("kiln_tcp_connections_refused_total", "counter",
           "Connections refused on the TCP listener at tcp_max_connections.",
           static_cast<double>(stats.tcp_connections_refused()));
  page.One("kiln_store_puts_refused_disk_full_total", "counter",
           "Results served but not stored because the disk was full.",
           static_cast<double>(stats.puts_refused_disk_full()));
  page.One("kiln_evictions_total", "counter", "Entries evicted (least recently used first).",
           static_cast<double>(stats.evictions()));
  page.One("kiln_corrupt_entries_dropped_total", "counter",
           "Entries dropped because a blob failed its SHA-256 check.",
           static_cast<double>(stats.corrupt_entries_dropped()));

  page.One("kiln_compiles_total", "counter", "Compile jobs run by workers.",
           static_cast<double>(stats.compiles()));
  page.One("kiln_compile_seconds_total", "counter", "Wall time of the compile jobs run.",
           stats.compile_seconds());
  page.One("kiln_compile_cache_hits_total", "counter", "Compile requests answered from the cache.",
           static_cast<double>(stats.compile_cache_hits()));
  page.One("kiln_compile_joins_total", "counter", "Compile requests that joined a compile already running.",
           static_cast<double>(stats.single_flight_joins()));
  page.One("kiln_compile_failures_total", "counter", "Compile jobs that failed (the kernel's error).",
           static_cast<double>(stats.compile_failures()));
  page.One("kiln_launcher_builds_total", "counter", "Launcher modules built.",
           static_cast<double>(stats.launcher_builds()));
  page.One("kiln_launcher_cache_hits_total", "counter", "Launcher builds answered from the cache.",
           static_cast<double>(stats.launcher_cache_hits()));
  page.One("kiln_workers_started_total", "counter", "Compile worker processes started.",
           static_cast<double>(stats.workers_started()));
  page.One("kiln_workers_lost_total", "counter", "Compile workers that crashed or were killed on timeout.",
           static_cast<double>(stats.workers_lost()));
  page.One("kiln_workers_live", "gauge", "Compile worker processes running now.",
           static_cast<double>(stats.live_workers()));
  page.One("kiln_tenant_compiles_waiting", "gauge", "Farm tenants' compiles queued behind their own.",
           static_cast<double>(stats.tenant_compiles_waiting()));

  if (stats.shared_cache_state() != "off" && !stats.shared_cache_state().empty()) {
    page.One("kiln_shared_cache_up", "gauge", "1 while the fleet's shared cache (Redis) answers.",
             stats.shared_cache_state() == "up" ? 1 : 0);
    page.One("kiln_shared_cache_hits_total", "counter", "Shared cache fetches that hit.",
             static_cast<double>(stats.shared_cache_hits()));
    page.One("kiln_shared_cache_misses_total", "counter", "Shared cache fetches that missed.",
             static_cast<double>(stats.shared_cache_misses()));
    page.One("kiln_shared_cache_errors_total", "counter",
             "Shared cache calls that failed, and values that failed their check.",
             static_cast<double>(stats.shared_cache_errors()));
    page.One("kiln_shared_cache_stores_total", "counter", "Entries written to the shared cache.",
             static_cast<double>(stats.shared_cache_stores()));
    page.One("kiln_shared_cache_compiles_awaited_total", "counter",
             "Another kilnd's compile waited for instead of run here.",
             static_cast<double>(stats.shared_cache_compiles_awaited()));
    page.One("kiln_shared_cache_backlog", "gauge",
             "Entries waiting to be written to the shared cache (kept while it is down).",
             static_cast<double>(stats.shared_cache_backlog()));
    page.One("kiln_shared_cache_dropped_total", "counter",
             "Entries dropped unwritten from a full shared cache backlog.",
             static_cast<double>(stats.shared_cache_dropped()));
    page.Family("kiln_shared_cache_fetch_seconds", "summary", "What a shared cache fetch cost, by result.");
    for (const v1::RpcLatency& fetch : {stats.shared_cache_hit_latency(), stats.shared_cache_miss_latency()}) {
      const std::string result = fetch.method() == "shared cache hit" ? "hit" : "miss";
      for (const auto& [quantile, ms] : {std::pair{"0.5", fetch.p50_ms()}, std::pair{"0.99", fetch.p99_ms()}}) {
        page.Sample("kiln_shared_cache_fetch_seconds",
                    absl::StrCat("result=\"", result, "\",quantile=\"", quantile, "\""), ms / 1e3);
      }
      page.Sample("kiln_shared_cache_fetch_seconds_count", absl::StrCat("result=\"", result, "\""),
                  static_cast<double>(fetch.count()));
    }
  }

  page.Family("kiln_rpc_duration_seconds", "histogram", "Time kilnd took to answer each RPC.");
  rpcs.ForEach([&](absl::string_view method, const LatencyHistogram& latency, uint64_t) {
    const LatencyHistogram::Cumulative cumulative = latency.CumulativeAt(LatencyBounds());
    const std::string label = absl::StrCat("method=", Quoted(method));
    for (size_t i = 0; i < LatencyBounds().size(); ++i) {
      page.Sample("kiln_rpc_duration_seconds_bucket",
                  absl::StrFormat("%s,le=\"%g\"", label, absl::ToDoubleSeconds(LatencyBounds()[i])),
                  static_cast<double>(cumulative.at_or_below[i]));
    }
    page.Sample("kiln_rpc_duration_seconds_bucket", absl::StrCat(label, ",le=\"+Inf\""),
                static_cast<double>(cumulative.count));
    page.Sample("kiln_rpc_duration_seconds_sum", label, absl::ToDoubleSeconds(cumulative.sum));
    page.Sample("kiln_rpc_duration_seconds_count", label, static_cast<double>(cumulative.count));
  });
  if (stats.subscriptions_size() > 0) {
    struct Counter {
      absl::string_view name, type, help;
      std::function<double(const v1::BundleSubscription&)> value;
    };
    const Counter counters[] = {
        {"kiln_bundle_source_checks_total", "counter", "Checks of each bundle source.",
         [](const auto& source) { return static_cast<double>(source.checks()); }},
        {"kiln_bundle_source_failures_total", "counter", "Checks of each bundle source that failed.",
         [](const auto& source) { return static_cast<double>(source.failures()); }},
        {"kiln_bundle_source_imports_total", "counter", "Bundles imported from each source.",
         [](const auto& source) { return static_cast<double>(source.imports()); }},
        {"kiln_bundle_source_up", "gauge", "1 when the last check of the source succeeded.",
         [](const auto& source) { return source.checks() > 0 && source.error().empty() ? 1.0 : 0.0; }},
        {"kiln_bundle_source_last_import_timestamp_seconds", "gauge",
         "When the source's last import ended (Unix time; 0 for none).",
         [](const auto& source) {
           absl::Time time;
           std::string error;
           return absl::ParseTime(absl::RFC3339_full, source.last_import(), &time, &error)
                      ? absl::ToDoubleSeconds(time - absl::UnixEpoch())
                      : 0.0;
         }},
    };
    for (const Counter& counter : counters) {
      page.Family(counter.name, counter.type, counter.help);
      for (const v1::BundleSubscription& source : stats.subscriptions()) {
        page.Sample(counter.name, absl::StrCat("source=", Quoted(source.source())), counter.value(source));
      }
    }
  }
  // A family's samples go together: the errors after every histogram.
  page.Family("kiln_rpc_errors_total", "counter", "RPCs answered with an error, by method.");
  rpcs.ForEach([&](absl::string_view method, const LatencyHistogram&, uint64_t failed) {
    page.Sample("kiln_rpc_errors_total", absl::StrCat("method=", Quoted(method)), static_cast<double>(failed));
  });
  return page.Take();
}

}  // namespace kiln::service
