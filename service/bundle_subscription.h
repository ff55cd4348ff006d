#ifndef KILN_SERVICE_BUNDLE_SUBSCRIPTION_H_
#define KILN_SERVICE_BUNDLE_SUBSCRIPTION_H_

// kilnd's subscriptions (bundle_sources in kilnd.conf): bundles it imports
// without being asked, and keeps up to date. Each source is checked at start
// and then every `refresh`, on a thread of its own, so no compile ever waits
// on a registry, nor one source on another:
//  - an OCI reference (REGISTRY/REPOSITORY[:TAG]): one request asks for its
//    manifest; a digest not imported yet is fetched into kilnd's imports
//    directory and imported; of an index (`kiln push --target`), the bundles
//    for this machine's GPUs;
//  - a directory (an absolute path): each *.kilnbundle file in it (not
//    below), copied into the imports directory and imported whenever its
//    size or modification time is not what was imported. The copy is what
//    is checked and imported: a publisher replacing the file meanwhile
//    cannot change what the signature check saw.
// An import is `kiln import`'s as kilnd's own user: a bundle signed by a
// trusted key comes as it is, anything else brings only the kernels kilnd
// compiles from their TTIR, at background priority.
//
// What was imported is kept in DATA_DIR/subscriptions.state, so a restart
// fetches nothing it has. A failed check or import is logged once and tried
// again at the next refresh, never sooner; a bundle refused for what it is
// (damaged, a bad signature) is not fetched again until it changes.

#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kiln/v1/kiln.pb.h"

namespace kiln::service {

// "" when `source` can be a bundle source; else why not and the fix.
std::string BundleSourceProblem(absl::string_view source);

struct BundleSubscriptionOptions {
  std::vector<std::string> sources;
  absl::Duration refresh = absl::Hours(1);
  std::filesystem::path data_dir;
  // This machine's GPU targets, which an index's members are taken for;
  // empty: those nvidia-smi names, asked at the first check of a registry.
  std::vector<std::string> gpu_targets;
  // The Triton versions kilnd has toolchains of, which an index's members
  // are taken for (none registered: any member); nullopt while a toolchain
  // is being probed (kilnd's start), which a check waits out (a minute at most).
  std::function<std::optional<std::vector<std::string>>()> triton_versions;
  // Imports a received bundle file (kilnd's ImportBundleAsOwner).
  std::function<absl::StatusOr<v1::ImportBundleResponse>(const std::filesystem::path&)> import;
};

class BundleSubscriptions {
 public:
  // Starts the thread that checks the sources; nothing when there are none.
  explicit BundleSubscriptions(BundleSubscriptionOptions options);
  // Stops the thread: a fetch in progress is cancelled, an import in
  // progress ends at its next step (the store's stop), and what it stored
  // goes.
  ~BundleSubscriptions();
  void Stop();

  // The sources as GetStats reports them, in the config's order, and the
  // GPU targets (once known).
  void FillStats(v1::GetStatsResponse& out) const;

 private:
  struct Source {
    std::string text;
    bool directory = false;
    // What is imported: the manifest digest under "" (OCI), or each file's
    // "SIZE:MTIME" under its name (directory). Kept in the state file.
    std::map<std::string, std::string> imported;
    // Refused for what it was (item -> identity, and why): not fetched
    // again while its identity stays.
    std::map<std::string, std::pair<std::string, std::string>> refused;
    v1::BundleSubscription report;  // guarded by report_mutex_
  };

  void Run(Source& source);
  void Check(Source& source);
  void CheckReference(Source& source, std::vector<std::string>& errors);
  void CheckDirectory(Source& source, std::vector<std::string>& errors);
  // Imports `file` for `source`'s `item` with identity `identity` (which
  // counts as imported when this file `completes` it: an index's last
  // member); the error's text, or "" when it imported.
  std::string Import(Source& source, const std::string& item, const std::string& identity,
                     const std::filesystem::path& file, bool completes);
  // options_.gpu_targets, else nvidia-smi's (asked once).
  std::vector<std::string> GpuTargets();
  // options_.triton_versions, once no toolchain is being probed.
  std::optional<std::vector<std::string>> TritonVersions();
  void LoadState();
  void SaveState();
  bool stopping() const;

  const BundleSubscriptionOptions options_;
  // Each its own thread's, but for `report` (report_mutex_) and changes of
  // `imported`, which the state file holds (state_mutex_).
  std::vector<Source> sources_;
  mutable std::mutex report_mutex_;
  mutable std::mutex stop_mutex_;
  std::condition_variable stop_changed_;
  bool stop_ = false;  // guarded by stop_mutex_
  std::mutex state_mutex_;
  std::once_flag gpu_targets_detected_;
  std::vector<std::string> gpu_targets_;  // guarded by report_mutex_
  std::vector<std::thread> threads_;
};

}  // namespace kiln::service

#endif  // KILN_SERVICE_BUNDLE_SUBSCRIPTION_H_
