#ifndef KILN_COMMON_LATENCY_HISTOGRAM_H_
#define KILN_COMMON_LATENCY_HISTOGRAM_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace kiln {

// A lock-free latency histogram with logarithmic buckets (8 per power of two, so
// a percentile is accurate to within ~9%). Record() is safe from any thread and
// costs one atomic increment, so it can sit on every RPC's path.
class LatencyHistogram {
 public:
  void Record(absl::Duration latency);

  struct Summary {
    uint64_t count = 0;
    absl::Duration p50;
    absl::Duration p90;
    absl::Duration p99;
    absl::Duration max;
  };
  // A snapshot; concurrent Record() calls may or may not be included.
  Summary Summarize() const;

  // For an exposition with bucket bounds of its own (Prometheus): how many
  // latencies were at most each of `bounds` (ascending), counting a bucket of
  // this histogram under the first bound its upper end does not pass (so up
  // to ~9% early latencies land one bound late), with the count and sum.
  struct Cumulative {
    std::vector<uint64_t> at_or_below;
    uint64_t count = 0;
    absl::Duration sum;
  };
  Cumulative CumulativeAt(const std::vector<absl::Duration>& bounds) const;

 private:
  static constexpr int kBucketsPerOctave = 8;
  static constexpr int kOctaves = 44;  // 1 ns .. ~4.9 hours
  static constexpr int kBuckets = kBucketsPerOctave * kOctaves;

  static int BucketFor(int64_t nanos);
  static int64_t BucketUpperBound(int bucket);
  absl::Duration Percentile(const std::array<uint64_t, kBuckets>& counts, uint64_t total,
                            double fraction) const;

  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<int64_t> max_nanos_{0};
  std::atomic<int64_t> sum_nanos_{0};
};

}  // namespace kiln

#endif  // KILN_COMMON_LATENCY_HISTOGRAM_H_
