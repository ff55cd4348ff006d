#include "target_bundles.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "bundle.h"
#include "google/protobuf/util/json_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kKeyInputsBlob = "kiln.key-inputs.json";
constexpr absl::string_view kSourceSuffix = ".source";

// The Triton version a triton_key begins with: Triton writes its version,
// then, with no separator, the first of its sources' SHA-256 digests
// ("3.6.0" "0355c3...", then "-" and the next).
std::string TritonVersionOfKey(absl::string_view triton_key) {
  constexpr size_t kDigestHex = 64;
  const absl::string_view first = triton_key.substr(0, triton_key.find('-'));
  if (first.size() <= kDigestHex) return "";
  return std::string(first.substr(0, first.size() - kDigestHex));
}

// The target and Triton version a kernel's key inputs name: empty when they
// are missing or unreadable (its kernel is then compiled for every target).
void ReadKeyInputs(const v1::Blob& key_inputs, RecordedKernel& kernel) {
  v1::KeyInputs inputs;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  if (!google::protobuf::util::JsonStringToMessage(key_inputs.data(), &inputs, options).ok()) return;
  if (inputs.has_target()) kernel.recorded_target = TargetName(inputs.target());
  kernel.triton_version = TritonVersionOfKey(inputs.triton_key());
}

bool IsKernel(const v1::BundleEntry& entry) {
  return std::any_of(entry.blobs().begin(), entry.blobs().end(),
                     [](const v1::Blob& blob) { return absl::EndsWith(blob.name(), kSourceSuffix); });
}

}  // namespace

std::string TargetName(const v1::Target& target) { return absl::StrCat(target.backend(), ":", target.arch()); }

absl::StatusOr<std::vector<RecordedKernel>> RecordedKernels(const std::string& file) {
  std::vector<RecordedKernel> kernels;
  absl::StatusOr<BundleReader> read = ForEachBundleEntry(file, [&](v1::BundleEntry&& entry) {
    RecordedKernel kernel;
    kernel.key = entry.key();
    kernel.request.set_namespace_(entry.namespace_());
    for (const v1::Blob& blob : entry.blobs()) {
      if (absl::EndsWith(blob.name(), kSourceSuffix)) {
        kernel.name = blob.name().substr(0, blob.name().size() - kSourceSuffix.size());
        *kernel.request.add_recorded() = blob;
      } else if (blob.name() == kKeyInputsBlob) {
        ReadKeyInputs(blob, kernel);
        *kernel.request.add_recorded() = blob;
      }
    }
    // Entries of no Triton kernel (inductor's graphs) have no frontend output.
    if (!kernel.name.empty()) kernels.push_back(std::move(kernel));
    return absl::OkStatus();
  });
  if (!read.ok()) return read.status();
  return kernels;
}

bool PrewarmEach(Client& client, const std::vector<RecordedKernel>& kernels, const std::vector<v1::Target>& targets,
                 const std::vector<std::pair<size_t, size_t>>& jobs,
                 const std::function<void(size_t, size_t, const absl::StatusOr<v1::PrewarmResponse>&)>& done,
                 const std::function<void(size_t running)>& tick) {
  struct Finished {
    std::pair<size_t, size_t> job;
    absl::StatusOr<v1::PrewarmResponse> result;
  };
  // A few at a time: kilnd runs them on its workers, and a bundle may hold
  // thousands of kernels. Results are handed to `done` on this thread.
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Finished> finished;  // not yet given to `done`
  size_t next = 0;
  size_t running = 0;
  bool stopping = false;
  auto work = [&] {
    for (;;) {
      std::pair<size_t, size_t> job;
      {
        std::lock_guard lock(mutex);
        if (stopping || next == jobs.size()) return;
        job = jobs[next++];
        ++running;
      }
      v1::PrewarmRequest request = kernels[job.first].request;
      *request.mutable_target() = targets[job.second];
      absl::StatusOr<v1::PrewarmResponse> response = client.Prewarm(request);
      std::lock_guard lock(mutex);
      --running;
      stopping |= !response.ok() && !absl::IsInvalidArgument(response.status());
      finished.push_back({job, std::move(response)});
      changed.notify_all();
    }
  };
  std::vector<std::thread> senders;
  for (size_t i = 0; i < std::min<size_t>(jobs.size(), 8); ++i) senders.emplace_back(work);
  size_t reported = 0;
  std::unique_lock lock(mutex);
  while (reported < (stopping ? next : jobs.size())) {
    changed.wait_for(lock, std::chrono::milliseconds(100));
    std::vector<Finished> batch = std::move(finished);
    finished.clear();
    const size_t now_running = running;
    lock.unlock();
    for (const Finished& one : batch) done(one.job.first, one.job.second, one.result);
    reported += batch.size();
    if (tick) tick(now_running);
    lock.lock();
  }
  const bool whole = !stopping;
  lock.unlock();
  for (std::thread& sender : senders) sender.join();
  return whole;
}

absl::StatusOr<std::vector<TargetBundle>> MakeTargetBundles(Client& client, const std::string& file,
                                                            const std::vector<v1::Target>& targets,
                                                            const Ed25519PrivateKey* signer,
                                                            const fs::path& directory,
                                                            const std::function<void(const std::string&)>& progress) {
  absl::StatusOr<std::vector<RecordedKernel>> recorded = RecordedKernels(file);
  if (!recorded.ok()) return recorded.status();
  const std::vector<RecordedKernel>& kernels = *recorded;
  std::vector<TargetBundle> bundles(targets.size());
  // What kilnd compiled: each target's (namespace, key) of each kernel not recorded for it.
  std::vector<std::vector<std::optional<std::pair<std::string, std::string>>>> compiled(
      targets.size(), std::vector<std::optional<std::pair<std::string, std::string>>>(kernels.size()));
  // A kernel's recorded entry goes as it is into its own target's bundle.
  std::vector<std::pair<size_t, size_t>> jobs;
  for (size_t k = 0; k < kernels.size(); ++k) {
    for (size_t t = 0; t < targets.size(); ++t) {
      if (kernels[k].recorded_target != TargetName(targets[t])) jobs.emplace_back(k, t);
    }
  }
  absl::Status stopped_by = absl::OkStatus();
  size_t finished = 0;
  const bool whole = PrewarmEach(client, kernels, targets, jobs, [&](size_t k, size_t t, const auto& result) {
    ++finished;
    if (!result.ok()) {
      if (!absl::IsInvalidArgument(result.status())) stopped_by = result.status();
      bundles[t].left_out.push_back(absl::StrCat(kernels[k].name, ": ", result.status().message()));
    } else if (!result->skipped().empty()) {
      bundles[t].left_out.push_back(absl::StrCat(kernels[k].name, ": ", result->skipped()));
    } else if (result->compile().has_error()) {
      bundles[t].left_out.push_back(absl::StrCat(kernels[k].name, ": ", result->compile().error().message()));
    } else {
      compiled[t][k] = std::make_pair(kernels[k].request.namespace_(), result->key());
    }
    if (progress) progress(absl::StrFormat("compiling for the targets: %d/%d", finished, jobs.size()));
  });
  if (!whole) return stopped_by.ok() ? absl::UnavailableError("kilnd stopped answering") : stopped_by;

  std::map<std::string, const RecordedKernel*> kernel_by_key;
  for (const RecordedKernel& kernel : kernels) kernel_by_key[kernel.key] = &kernel;
  for (size_t t = 0; t < targets.size(); ++t) {
    TargetBundle& bundle = bundles[t];
    bundle.target = TargetName(targets[t]);
    fs::path name = fs::path(file).filename();
    bundle.file = directory / absl::StrCat(name.stem().string(), ".",
                                           absl::StrReplaceAll(bundle.target, {{":", "_"}}), name.extension().string());
    absl::StatusOr<BundleWriter> writer = BundleWriter::Create(bundle.file, signer);
    if (!writer.ok()) return writer.status();
    // The bundle's own entries: all but its kernels recorded for other targets.
    std::set<std::string> tritons;
    const auto count_kernel = [&](const RecordedKernel& kernel) {
      ++bundle.kernels;
      if (!kernel.triton_version.empty()) tritons.insert(kernel.triton_version);
    };
    absl::StatusOr<BundleReader> read = ForEachBundleEntry(file, [&](v1::BundleEntry&& entry) -> absl::Status {
      const bool is_kernel = IsKernel(entry);
      const auto kernel = kernel_by_key.find(entry.key());
      if (is_kernel && (kernel == kernel_by_key.end() || kernel->second->recorded_target != bundle.target)) {
        return absl::OkStatus();
      }
      if (absl::Status added = writer->Add(entry); !added.ok()) return added;
      if (is_kernel) count_kernel(*kernel->second);
      return absl::OkStatus();
    });
    if (!read.ok()) return read.status();
    for (size_t k = 0; k < kernels.size(); ++k) {
      if (!compiled[t][k].has_value()) continue;
      const auto& [ns, key] = *compiled[t][k];
      absl::StatusOr<std::optional<v1::CacheEntry>> entry = client.Lookup(ns, key);
      if (!entry.ok()) return entry.status();
      if (!entry->has_value()) {  // evicted already: a cache far too small for the bundle
        bundle.left_out.push_back(absl::StrCat(kernels[k].name, ": evicted from kilnd before it was read back"));
        continue;
      }
      v1::BundleEntry out;
      out.set_namespace_(ns);
      out.set_key(key);
      *out.mutable_blobs() = std::move(*(*entry)->mutable_blobs());
      if (absl::Status added = writer->Add(out); !added.ok()) return added;
      count_kernel(kernels[k]);
    }
    bundle.tritons.assign(tritons.begin(), tritons.end());
    bundle.entries = writer->entries();
    if (absl::Status finished_writing = writer->Finish(); !finished_writing.ok()) return finished_writing;
  }
  return bundles;
}

}  // namespace kiln
