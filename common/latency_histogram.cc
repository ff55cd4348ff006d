#include "common/latency_histogram.h"

#include <algorithm>
#include <cmath>

namespace kiln {

int LatencyHistogram::BucketFor(int64_t nanos) {
  if (nanos <= 1) return 0;
  const double position = std::log2(static_cast<double>(nanos)) * kBucketsPerOctave;
  return std::min(kBuckets - 1, static_cast<int>(position));
}

int64_t LatencyHistogram::BucketUpperBound(int bucket) {
  return static_cast<int64_t>(
      std::ceil(std::exp2(static_cast<double>(bucket + 1) / kBucketsPerOctave)));
}

void LatencyHistogram::Record(absl::Duration latency) {
  const int64_t nanos = std::max<int64_t>(0, absl::ToInt64Nanoseconds(latency));
  buckets_[BucketFor(nanos)].fetch_add(1, std::memory_order_relaxed);
  sum_nanos_.fetch_add(nanos, std::memory_order_relaxed);
  int64_t seen = max_nanos_.load(std::memory_order_relaxed);
  while (nanos > seen && !max_nanos_.compare_exchange_weak(seen, nanos)) {
  }
}

absl::Duration LatencyHistogram::Percentile(const std::array<uint64_t, kBuckets>& counts,
                                            uint64_t total, double fraction) const {
  const auto rank = static_cast<uint64_t>(std::ceil(fraction * static_cast<double>(total)));
  uint64_t seen = 0;
  for (int bucket = 0; bucket < kBuckets; ++bucket) {
    seen += counts[bucket];
    if (seen >= rank) {
      // The bucket's upper bound overstates by at most one bucket width; the
      // true maximum caps it so p99 never exceeds max.
      return absl::Nanoseconds(
          std::min(BucketUpperBound(bucket), max_nanos_.load(std::memory_order_relaxed)));
    }
  }
  return absl::Nanoseconds(max_nanos_.load(std::memory_order_relaxed));
}

LatencyHistogram::Summary LatencyHistogram::Summarize() const {
  std::array<uint64_t, kBuckets> counts{};
  Summary summary;
  for (int bucket = 0; bucket < kBuckets; ++bucket) {
    counts[bucket] = buckets_[bucket].load(std::memory_order_relaxed);
    summary.count += counts[bucket];
  }
  if (summary.count == 0) return summary;
  summary.p50 = Percentile(counts, summary.count, 0.50);
  summary.p90 = Percentile(counts, summary.count, 0.90);
  summary.p99 = Percentile(counts, summary.count, 0.99);
  summary.max = absl::Nanoseconds(max_nanos_.load(std::memory_order_relaxed));
  return summary;
}

LatencyHistogram::Cumulative LatencyHistogram::CumulativeAt(
    const std::vector<absl::Duration>& bounds) const {
  Cumulative cumulative;
  cumulative.at_or_below.assign(bounds.size(), 0);
  for (int bucket = 0; bucket < kBuckets; ++bucket) {
    const uint64_t count = buckets_[bucket].load(std::memory_order_relaxed);
    if (count == 0) continue;
    cumulative.count += count;
    const absl::Duration upper = absl::Nanoseconds(BucketUpperBound(bucket));
    for (size_t i = 0; i < bounds.size(); ++i) {
      if (upper <= bounds[i]) cumulative.at_or_below[i] += count;
    }
  }
  cumulative.sum = absl::Nanoseconds(sum_nanos_.load(std::memory_order_relaxed));
  return cumulative;
}

}  // namespace kiln
