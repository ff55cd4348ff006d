#include "service/bundle_subscription.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cpp/oci_registry.h"
#include "common/fmt_absl.h"
#include "common/gpu_targets.h"
#include "common/platform.h"
#include "service/bundle_import.h"
#include "spdlog/spdlog.h"

namespace kiln::service {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kStateFileName = "subscriptions.state";
constexpr absl::string_view kBundleExtension = ".kilnbundle";

std::string Rfc3339(absl::Time time) { return absl::FormatTime(absl::RFC3339_sec, time, absl::UTCTimeZone()); }

std::string TempName() {
  std::random_device random;
  return absl::StrFormat("subscription-%08x%08x%s", random(), random(), kBundleExtension);
}

// Tabs and line ends would break the state file's lines.
bool FitsOnALine(absl::string_view text) { return text.find_first_of("\t\r\n") == absl::string_view::npos; }

// A bundle refused for what it is: fetching it again would bring the same.
bool RefusedForGood(const absl::Status& status) {
  return absl::IsInvalidArgument(status) || absl::IsDataLoss(status);
}

std::string IdentityOf(const platform::FileStamp& stamp) {
  return absl::StrFormat("%d:%d:%d:%d", stamp.size, stamp.modified, stamp.changed, stamp.file_id);
}

}  // namespace

std::string BundleSourceProblem(absl::string_view source) {
  if (source.empty() || !FitsOnALine(source)) {
    return absl::StrFormat("bundle source '%s' is empty or holds a tab or line end", source);
  }
  if (fs::path(std::string(source)).is_absolute()) return "";
  if (absl::StartsWith(source, ".") || absl::StartsWith(source, "/") || absl::StartsWith(source, "\\")) {
    return absl::StrFormat("bundle source '%s': name a directory by its absolute path", source);
  }
  absl::StatusOr<OciReference> reference = ParseOciReference(source);
  if (!reference.ok()) {
    return absl::StrFormat("bundle source '%s' is neither an absolute directory nor an OCI reference: %s",
                           source, reference.status().message());
  }
  return "";
}

BundleSubscriptions::BundleSubscriptions(BundleSubscriptionOptions options)
    : options_(std::move(options)), gpu_targets_(options_.gpu_targets) {
  if (options_.sources.empty()) return;
  for (const std::string& text : options_.sources) {
    Source source;
    source.text = text;
    source.directory = fs::path(text).is_absolute();
    source.report.set_source(text);
    sources_.push_back(std::move(source));
  }
  LoadState();
  std::error_code error;
  fs::create_directories(ImportsDir(options_.data_dir), error);  // else each fetch says it cannot write there
  spdlog::info("subscribed to {} bundle source(s), checked every {}", sources_.size(),
               absl::FormatDuration(options_.refresh));
  // A thread each: a registry that hangs holds up only its own source.
  for (Source& source : sources_) threads_.emplace_back([this, &source] { Run(source); });
}

BundleSubscriptions::~BundleSubscriptions() { Stop(); }

void BundleSubscriptions::Stop() {
  {
    std::lock_guard lock(stop_mutex_);
    stop_ = true;
  }
  stop_changed_.notify_all();
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

bool BundleSubscriptions::stopping() const {
  std::lock_guard lock(stop_mutex_);
  return stop_;
}

void BundleSubscriptions::FillStats(v1::GetStatsResponse& out) const {
  std::lock_guard lock(report_mutex_);
  for (const Source& source : sources_) *out.add_subscriptions() = source.report;
  for (const std::string& target : gpu_targets_) out.add_gpu_targets(target);
}

std::vector<std::string> BundleSubscriptions::GpuTargets() {
  std::call_once(gpu_targets_detected_, [this] {
    if (!options_.gpu_targets.empty()) return;
    std::vector<std::string> detected = DetectGpuTargets();
    spdlog::info("GPU targets (nvidia-smi): {}", detected.empty() ? "none" : absl::StrJoin(detected, ", "));
    std::lock_guard lock(report_mutex_);
    gpu_targets_ = std::move(detected);
  });
  std::lock_guard lock(report_mutex_);
  return gpu_targets_;
}

std::optional<std::vector<std::string>> BundleSubscriptions::TritonVersions() {
  if (!options_.triton_versions) return std::nullopt;
  const absl::Time give_up = absl::Now() + absl::Minutes(1);
  for (;;) {
    if (std::optional<std::vector<std::string>> versions = options_.triton_versions()) return versions;
    std::unique_lock lock(stop_mutex_);
    if (absl::Now() > give_up ||
        stop_changed_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; })) {
      return std::nullopt;  // any member, as with no toolchain
    }
  }
}

void BundleSubscriptions::Run(Source& source) {
  while (!stopping()) {
    Check(source);
    {
      std::lock_guard lock(report_mutex_);
      source.report.set_next_check(Rfc3339(absl::Now() + options_.refresh));
    }
    std::unique_lock lock(stop_mutex_);
    if (stop_changed_.wait_for(lock, absl::ToChronoSeconds(options_.refresh), [this] { return stop_; })) return;
  }
}

void BundleSubscriptions::Check(Source& source) {
  std::vector<std::string> errors;
  if (source.directory) {
    CheckDirectory(source, errors);
  } else {
    CheckReference(source, errors);
  }
  if (stopping()) return;
  std::lock_guard lock(report_mutex_);
  source.report.set_last_check(Rfc3339(absl::Now()));
  source.report.set_checks(source.report.checks() + 1);
  source.report.set_error(absl::StrJoin(errors, "; "));
  if (!errors.empty()) {
    source.report.set_failures(source.report.failures() + 1);
    // Once a refresh: the next try is the next refresh.
    spdlog::warn("bundle source {}: {}; trying again in {}", source.text, source.report.error(),
                 absl::FormatDuration(options_.refresh));
  }
}

void BundleSubscriptions::CheckReference(Source& source, std::vector<std::string>& errors) {
  absl::StatusOr<OciReference> reference = ParseOciReference(source.text);
  if (!reference.ok()) {
    errors.push_back(std::string(reference.status().message()));
    return;
  }
  std::error_code error;
  const fs::path file = ImportsDir(options_.data_dir) / TempName();
  PullOptions options;
  if (const auto found = source.imported.find(""); found != source.imported.end()) {
    options.known_digests.push_back(found->second);
  }
  if (const auto found = source.refused.find(""); found != source.refused.end()) {
    options.known_digests.push_back(found->second.first);
  }
  options.cancelled = [this] { return stopping(); };
  options.targets = GpuTargets();
  if (std::optional<std::vector<std::string>> versions = TritonVersions(); versions.has_value()) {
    options.tritons = *std::move(versions);
  }
  absl::StatusOr<PulledBundle> pulled = PullBundle(*reference, file, options);
  if (!pulled.ok()) {
    if (!absl::IsCancelled(pulled.status())) errors.push_back(std::string(pulled.status().message()));
    return;
  }
  const auto remove_files = [&] {
    for (const PulledFile& pulled_file : pulled->files) fs::remove(pulled_file.path, error);
  };
  if (pulled->known) {
    if (const auto imported = source.imported.find("");
        imported == source.imported.end() || imported->second != pulled->manifest_digest) {
      errors.push_back(absl::StrCat(pulled->manifest_digest, " (refused, and unchanged since): ",
                                    source.refused[""].second));
    }
    return;
  }
  // An index's members, each imported; the digest counts as imported once all are.
  std::vector<std::string> targets;
  for (size_t i = 0; i < pulled->files.size(); ++i) {
    const PulledFile& pulled_file = pulled->files[i];
    const bool last = i + 1 == pulled->files.size();
    const std::string problem =
        Import(source, "", pulled->manifest_digest, pulled_file.path, /*completes=*/last);
    if (!problem.empty()) {
      errors.push_back(pulled_file.target.empty() ? problem : absl::StrCat(pulled_file.target, ": ", problem));
      remove_files();
      return;
    }
    if (!pulled_file.target.empty()) targets.push_back(pulled_file.target);
  }
  remove_files();
  std::lock_guard lock(report_mutex_);
  source.report.set_imported(targets.empty() ? pulled->manifest_digest
                                             : absl::StrFormat("%s (%s of %s)", pulled->manifest_digest,
                                                               absl::StrJoin(targets, ", "),
                                                               absl::StrJoin(pulled->index_targets, ", ")));
}

void BundleSubscriptions::CheckDirectory(Source& source, std::vector<std::string>& errors) {
  std::error_code error;
  std::vector<fs::path> files;
  for (fs::directory_iterator it(source.text, error), end; !error && it != end; it.increment(error)) {
    if (it->path().extension() == std::string(kBundleExtension) && it->is_regular_file(error)) files.push_back(it->path());
  }
  if (error) {
    errors.push_back(absl::StrFormat("cannot read the directory: %s", error.message()));
    return;
  }
  std::sort(files.begin(), files.end());
  std::map<std::string, std::string> present;
  for (const fs::path& path : files) {
    if (stopping()) return;
    const std::string name = path.filename().string();
    absl::StatusOr<platform::FileStamp> stamp = platform::StampOf(path);
    if (!stamp.ok() || !FitsOnALine(name)) continue;  // gone meanwhile, or a name the state cannot hold
    const std::string identity = IdentityOf(*stamp);
    present[name] = identity;
    if (const auto imported = source.imported.find(name);
        imported != source.imported.end() && imported->second == identity) {
      continue;
    }
    if (const auto refused = source.refused.find(name);
        refused != source.refused.end() && refused->second.first == identity) {
      errors.push_back(absl::StrCat(name, " (refused, and unchanged since): ", refused->second.second));
      continue;
    }
    const fs::path copy = ImportsDir(options_.data_dir) / TempName();
    if (!fs::copy_file(path, copy, fs::copy_options::overwrite_existing, error)) {
      errors.push_back(absl::StrFormat("%s: cannot copy it into %s: %s", name, copy.parent_path().string(),
                                       error.message()));
      continue;
    }
    const std::string problem = Import(source, name, identity, copy, /*completes=*/true);
    fs::remove(copy, error);
    if (!problem.empty()) errors.push_back(absl::StrCat(name, ": ", problem));
  }
  // A file taken away is forgotten (its kernels stay in the store, as any entry does).
  size_t forgotten = 0;
  {
    std::lock_guard lock(state_mutex_);
    forgotten = std::erase_if(source.imported, [&](const auto& item) { return !present.contains(item.first); });
  }
  if (forgotten > 0) SaveState();  // an import saved it already
  std::lock_guard lock(report_mutex_);
  source.report.set_imported(absl::StrFormat("%d of %d files", source.imported.size(), present.size()));
}

std::string BundleSubscriptions::Import(Source& source, const std::string& item, const std::string& identity,
                                        const fs::path& file, bool completes) {
  absl::StatusOr<v1::ImportBundleResponse> imported = options_.import(file);
  if (!imported.ok()) {
    if (RefusedForGood(imported.status())) {
      source.refused[item] = {identity, std::string(imported.status().message())};
    }
    return std::string(imported.status().message());
  }
  if (completes) {
    source.refused.erase(item);
    {
      std::lock_guard lock(state_mutex_);
      source.imported[item] = identity;
    }
    SaveState();
  }
  spdlog::info("bundle source {}{}{}: imported {} entries ({} stored, {} compiled, {} unchanged)", source.text,
               item.empty() ? "@" : " ", item.empty() ? identity : item, imported->entries(), imported->stored(),
               imported->compiled(), imported->unchanged());
  std::lock_guard lock(report_mutex_);
  source.report.set_last_import(Rfc3339(absl::Now()));
  source.report.set_imports(source.report.imports() + 1);
  *source.report.mutable_last_import_result() = *std::move(imported);
  return "";
}

// The state file: a line "SOURCE<TAB>ITEM<TAB>IDENTITY" for each thing
// imported; ITEM is empty for an OCI source.
void BundleSubscriptions::LoadState() {
  if (options_.data_dir.empty()) return;
  absl::StatusOr<std::string> text = platform::ReadWholeFile(options_.data_dir / std::string(kStateFileName));
  if (!text.ok()) return;  // none yet; a damaged one costs a fetch again, nothing more
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> fields = absl::StrSplit(line, '\t');
    if (fields.size() != 3) continue;
    for (Source& source : sources_) {
      if (source.text == fields[0]) source.imported[fields[1]] = fields[2];
    }
  }
  for (Source& source : sources_) {
    if (const auto imported = source.imported.find(""); !source.directory && imported != source.imported.end()) {
      source.report.set_imported(imported->second);
    }
  }
}

void BundleSubscriptions::SaveState() {
  if (options_.data_dir.empty()) return;
  std::lock_guard lock(state_mutex_);  // other sources' threads change theirs
  std::string text;
  for (const Source& source : sources_) {
    for (const auto& [item, identity] : source.imported) {
      absl::StrAppend(&text, source.text, "\t", item, "\t", identity, "\n");
    }
  }
  const fs::path path = options_.data_dir / std::string(kStateFileName);
  const fs::path temp = fs::path(path.string() + ".new");
  absl::Status saved = platform::WriteFileDurably(temp, text);
  if (saved.ok()) saved = platform::MoveFileOver(temp, path).status();
  if (!saved.ok()) spdlog::warn("bundle sources: cannot keep what was imported in {}: {}", path.string(), saved.message());
}

}  // namespace kiln::service
