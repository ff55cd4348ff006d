// Measures the artifact store's lookup latency for blobs kept inline in SQLite
// versus in files, across sizes, to choose StoreOptions::inline_threshold_bytes.
//
// usage: inline_threshold_bench DIR

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cache/artifact_store.h"

namespace {

constexpr int kEntries = 64;
constexpr int kLookups = 2000;

// Median lookup time of `size`-byte blobs stored inline or as files.
absl::Duration MedianLookup(const std::filesystem::path& dir, uint64_t size, bool inline_blobs) {
  std::filesystem::remove_all(dir);
  kiln::cache::StoreOptions options;
  options.data_dir = dir;
  options.zstd_level = 0;  // measure storage, not compression
  options.inline_threshold_bytes = inline_blobs ? ~0ull : 0;
  auto store = kiln::cache::ArtifactStore::Open(options);
  if (!store.ok()) {
    std::cerr << store.status() << "\n";
    std::exit(1);
  }
  std::mt19937_64 random(size);
  for (int i = 0; i < kEntries; ++i) {
    std::string data(size, '\0');
    for (char& byte : data) byte = static_cast<char>(random());
    if (!(*store)->Put("bench", absl::StrCat(i), {{"k.cubin", std::move(data), ""}}).ok()) {
      std::exit(1);
    }
  }
  std::vector<absl::Duration> latencies;
  for (int i = 0; i < kLookups; ++i) {
    const absl::Time start = absl::Now();
    if (!(*store)->Lookup("bench", absl::StrCat(random() % kEntries)).ok()) std::exit(1);
    latencies.push_back(absl::Now() - start);
  }
  std::nth_element(latencies.begin(), latencies.begin() + kLookups / 2, latencies.end());
  return latencies[kLookups / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: inline_threshold_bench DIR\n";
    return 2;
  }
  std::cout << absl::StrFormat("%10s %12s %12s %8s\n", "blob size", "inline p50", "file p50",
                               "file/inl");
  for (uint64_t size : {4096u, 16384u, 32768u, 65536u, 131072u, 262144u, 1048576u}) {
    const absl::Duration in_db = MedianLookup(argv[1], size, true);
    const absl::Duration in_file = MedianLookup(argv[1], size, false);
    std::cout << absl::StrFormat("%10d %9.1f us %9.1f us %8.2f\n", size,
                                 absl::ToDoubleMicroseconds(in_db),
                                 absl::ToDoubleMicroseconds(in_file), absl::FDivDuration(in_file, in_db));
  }
  std::filesystem::remove_all(argv[1]);
  return 0;
}
