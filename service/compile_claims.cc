#include "service/compile_claims.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kiln::service {
namespace {

std::string ClaimId(const std::string& ns, const std::string& key) {
  return absl::StrCat(ns, std::string(1, '\0'), key);
}

}  // namespace

CompileClaims::CompileClaims(absl::Duration claim_timeout) : claim_timeout_(claim_timeout) {
  expirer_ = std::thread([this] { ExpireLoop(); });
}

CompileClaims::~CompileClaims() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  expirer_.join();
  ReleaseAll();
}

void CompileClaims::ReleaseAll() {
  std::vector<Wake> waiters;
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    for (auto& [id, claim] : claims_) {
      for (Wake& wake : claim.waiters) waiters.push_back(std::move(wake));
    }
    claims_.clear();
  }
  for (Wake& wake : waiters) wake();
}

bool CompileClaims::ClaimOrWait(const std::string& ns, const std::string& key, Wake wake) {
  std::lock_guard lock(mutex_);
  if (closed_) return true;  // shutting down: nobody waits any more
  auto [claim, created] = claims_.try_emplace(ClaimId(ns, key));
  if (created) {
    claim->second.lapses_at = absl::Now() + claim_timeout_;
    changed_.notify_all();
    return true;
  }
  claim->second.waiters.push_back(std::move(wake));
  return false;
}

void CompileClaims::MarkCompiling(const std::string& ns, const std::string& key) {
  std::lock_guard lock(mutex_);
  if (auto claim = claims_.find(ClaimId(ns, key)); claim != claims_.end()) {
    claim->second.lapses_at = absl::InfiniteFuture();
  }
}

void CompileClaims::Release(const std::string& ns, const std::string& key) {
  std::vector<Wake> waiters;
  {
    std::lock_guard lock(mutex_);
    auto claim = claims_.find(ClaimId(ns, key));
    if (claim == claims_.end()) return;
    waiters = std::move(claim->second.waiters);
    claims_.erase(claim);
  }
  for (Wake& wake : waiters) wake();
}

void CompileClaims::ExpireLoop() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    absl::Time next = absl::InfiniteFuture();
    for (const auto& [id, claim] : claims_) next = std::min(next, claim.lapses_at);
    if (next == absl::InfiniteFuture()) {
      changed_.wait(lock);
    } else {
      changed_.wait_until(lock, absl::ToChronoTime(next));
    }
    std::vector<Wake> lapsed;
    const absl::Time now = absl::Now();
    for (auto it = claims_.begin(); it != claims_.end();) {
      if (it->second.lapses_at <= now) {
        for (Wake& wake : it->second.waiters) lapsed.push_back(std::move(wake));
        claims_.erase(it++);
      } else {
        ++it;
      }
    }
    lock.unlock();
    for (Wake& wake : lapsed) wake();
    lock.lock();
  }
}

}  // namespace kiln::service
