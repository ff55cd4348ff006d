#include "service/miss_log.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/fmt_absl.h"
#include "common/platform.h"
#include "spdlog/spdlog.h"

namespace kiln::service {

MissLog::MissLog(std::filesystem::path history) : history_(std::move(history)) {
  if (history_.empty()) return;
  absl::StatusOr<std::string> content = platform::ReadWholeFile(history_);
  if (absl::IsNotFound(content.status())) return;
  v1::MissHistory saved;
  if (!content.ok() || !saved.ParseFromString(*content)) {
    // Only hints for `kiln misses` are lost: start over.
    spdlog::warn("miss history {} is unreadable; starting a new one", history_.string());
    return;
  }
  keys_missed_.insert(saved.keys_missed().begin(), saved.keys_missed().end());
  last_by_kernel_.insert(saved.last_by_kernel().begin(), saved.last_by_kernel().end());
}

MissLog::~MissLog() {
  if (history_.empty()) return;
  v1::MissHistory saved;
  for (const std::string& key : keys_missed_) saved.add_keys_missed(key);
  saved.mutable_last_by_kernel()->insert(last_by_kernel_.begin(), last_by_kernel_.end());
  const std::filesystem::path written = history_.string() + ".new";
  std::error_code left_by_a_crash;
  std::filesystem::remove(written, left_by_a_crash);
  absl::Status status = platform::WriteFileDurably(written, saved.SerializeAsString());
  if (status.ok()) status = platform::MoveFileOver(written, history_).status();
  if (!status.ok()) spdlog::warn("cannot keep the miss history: {}", status.message());
}

std::vector<std::string> MissLog::Record(absl::string_view domain, absl::string_view ns,
                                         absl::string_view key,
                                         const v1::KeyComponents* components) {
  std::vector<std::string> reasons;
  const std::string scoped_key = absl::StrCat(ns, absl::string_view("\0", 1), key);
  std::lock_guard lock(mutex_);
  if (keys_missed_.size() >= kMaxRemembered || last_by_kernel_.size() >= kMaxRemembered ||
      keys_abandoned_.size() >= kMaxRemembered) {
    keys_missed_.clear();
    keys_abandoned_.clear();
    last_by_kernel_.clear();
  }
  const bool missed_before = !keys_missed_.insert(scoped_key).second;
  if (keys_abandoned_.erase(scoped_key) > 0) {
    // Its last claimant never stored it: nothing was evicted.
    reasons.push_back("abandoned");
  } else if (components == nullptr || components->kernel().empty()) {
    reasons.push_back(missed_before ? "evicted" : "unknown");
  } else if (missed_before) {
    // Missed, compiled and stored once already: the entry went since (evicted,
    // dropped as corrupt), or that compile failed.
    reasons.push_back("evicted");
  } else {
    const std::string kernel = absl::StrCat(ns, absl::string_view("\0", 1), components->kernel());
    auto [last, is_new] = last_by_kernel_.try_emplace(kernel, *components);
    if (is_new) {
      reasons.push_back("new kernel");
    } else {
      // In the order a user would look: whose change explains the others.
      const std::pair<const char*, bool> changed[] = {
          {"toolchain", last->second.toolchain() != components->toolchain()},
          {"backend", last->second.backend() != components->backend()},
          {"source", last->second.source() != components->source()},
          {"options", last->second.options() != components->options()},
          {"env", last->second.env() != components->env()}};
      for (const auto& [reason, differs] : changed) {
        if (differs) reasons.push_back(reason);
      }
      if (reasons.empty()) reasons.push_back("unknown");
      last->second = *components;
    }
  }
  v1::Miss miss;
  miss.set_unix_ms(absl::ToUnixMillis(absl::Now()));
  miss.set_namespace_(std::string(ns.substr(std::min(ns.size(), domain.size() + 1))));
  miss.set_key(std::string(key));
  if (components != nullptr) miss.set_kernel(components->kernel());
  for (const std::string& reason : reasons) {
    miss.add_reasons(reason);
    ++counts_[reason];
  }
  recent_.emplace_back(std::string(domain), std::move(miss));
  if (recent_.size() > kMaxRecent) recent_.pop_front();
  return reasons;
}

void MissLog::Abandoned(absl::string_view ns, absl::string_view key) {
  const std::string scoped_key = absl::StrCat(ns, absl::string_view("\0", 1), key);
  std::lock_guard lock(mutex_);
  if (keys_missed_.erase(scoped_key) > 0) keys_abandoned_.insert(scoped_key);
}

std::vector<v1::Miss> MissLog::Latest(absl::string_view domain, size_t count) const {
  std::vector<v1::Miss> latest;
  std::lock_guard lock(mutex_);
  for (auto it = recent_.rbegin(); it != recent_.rend() && latest.size() < count; ++it) {
    if (it->first == domain) latest.push_back(it->second);
  }
  std::reverse(latest.begin(), latest.end());
  return latest;
}

std::map<std::string, uint64_t> MissLog::CountsByReason() const {
  std::lock_guard lock(mutex_);
  return counts_;
}

}  // namespace kiln::service
