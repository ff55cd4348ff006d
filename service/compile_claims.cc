#include "service/compile_claims.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kiln::service {
namespace {

std::string ClaimId(const std::string& ns, const std::string& key) {
  return absl::StrCat(ns, std::string(1, '\0'), key);
}

void RunAll(std::vector<std::function<void()>>& callbacks) {
  for (auto& callback : callbacks) callback();
}

}  // namespace

CompileClaims::CompileClaims(ClaimLimits limits, Unfinished unfinished)
    : limits_(limits), unfinished_(std::move(unfinished)) {
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

std::vector<std::function<void()>> CompileClaims::EndLocked(
    absl::flat_hash_map<std::string, Claim>::iterator claim, bool tell_holder) {
  std::vector<std::function<void()>> callbacks;
  if (tell_holder && claim->second.ended) callbacks.push_back(std::move(claim->second.ended));
  for (Wake& wake : claim->second.waiters) {
    if (wake) callbacks.push_back(std::move(wake));
  }
  claims_.erase(claim);
  return callbacks;
}

void CompileClaims::ReleaseAll() {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    while (!claims_.empty()) {
      std::vector<std::function<void()>> ended = EndLocked(claims_.begin(), true);
      std::move(ended.begin(), ended.end(), std::back_inserter(callbacks));
    }
  }
  RunAll(callbacks);
}

CompileClaims::Ticket CompileClaims::ClaimOrWait(const std::string& ns, const std::string& key,
                                                 const std::string& claimant, bool may_claim,
                                                 Ended ended, Wake wake) {
  std::vector<std::function<void()>> callbacks;
  Ticket ticket{Answer::kNoClaim};
  {
    std::lock_guard lock(mutex_);
    if (closed_) return ticket;  // shutting down: nobody claims or waits any more
    auto claim = claims_.find(ClaimId(ns, key));
    const absl::Time now = absl::Now();
    if (claim != claims_.end() && !claimant.empty() && claim->second.claimant == claimant &&
        !claim->second.compiling()) {
      // The holder's own process asks again (its earlier attempt ended in a
      // way we were not told of): it takes the claim over, never waits on it.
      // Not once the holder's compile has started: that compile is stored
      // (and the claim released) shortly, and the process waits for it as any
      // other would. Taking over, it would compile the kernel again (kilnd
      // answers a compile before storing it, so its next lookup may come first).
      claim->second.ended.swap(ended);
      if (ended) callbacks.push_back(std::move(ended));
      claim->second.id = next_claim_id_++;
      claim->second.lapses_at = std::min(claim->second.lapses_at, now + limits_.timeout);
      ticket = {Answer::kClaimed, claim->second.id, claim->second.lapses_at - now};
    } else if (claim != claims_.end()) {
      claim->second.waiters.push_back(std::move(wake));
      ticket = {Answer::kWaiting};
    } else if (may_claim) {
      Claim& created = claims_[ClaimId(ns, key)];
      created.ns = ns;
      created.key = key;
      created.id = next_claim_id_++;
      created.claimant = claimant;
      created.taken_at = now;
      created.lapses_at = now + std::min(limits_.timeout, limits_.longest_hold);
      created.ended = std::move(ended);
      ticket = {Answer::kClaimed, created.id, created.lapses_at - now};
      changed_.notify_all();
    }
  }
  RunAll(callbacks);
  return ticket;
}

std::optional<absl::Duration> CompileClaims::Renew(const std::string& ns, const std::string& key,
                                                   const std::string& claimant) {
  std::lock_guard lock(mutex_);
  auto claim = claims_.find(ClaimId(ns, key));
  if (claim == claims_.end() || claimant.empty() || claim->second.claimant != claimant) {
    return std::nullopt;
  }
  const absl::Time now = absl::Now();
  claim->second.lapses_at =
      std::max(claim->second.lapses_at,
               std::min(now + limits_.timeout, claim->second.taken_at + limits_.longest_hold));
  return claim->second.lapses_at - now;
}

void CompileClaims::MarkCompiling(const std::string& ns, const std::string& key) {
  std::lock_guard lock(mutex_);
  if (auto claim = claims_.find(ClaimId(ns, key)); claim != claims_.end()) {
    claim->second.lapses_at = absl::InfiniteFuture();
  }
}

void CompileClaims::Release(const std::string& ns, const std::string& key) {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard lock(mutex_);
    auto claim = claims_.find(ClaimId(ns, key));
    if (claim == claims_.end()) return;
    callbacks = EndLocked(claim, true);
  }
  RunAll(callbacks);
}

void CompileClaims::Abandon(const std::string& ns, const std::string& key, uint64_t claim_id) {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard lock(mutex_);
    auto claim = claims_.find(ClaimId(ns, key));
    if (claim == claims_.end() || claim->second.id != claim_id || claim->second.compiling()) {
      return;
    }
    if (unfinished_) callbacks.push_back(TellUnfinished(claim->second));
    std::vector<std::function<void()>> ended = EndLocked(claim, false);
    std::move(ended.begin(), ended.end(), std::back_inserter(callbacks));
  }
  RunAll(callbacks);
}

std::function<void()> CompileClaims::TellUnfinished(const Claim& claim) const {
  return [unfinished = unfinished_, ns = claim.ns, key = claim.key] { unfinished(ns, key); };
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
    std::vector<std::function<void()>> lapsed;
    const absl::Time now = absl::Now();
    for (auto it = claims_.begin(); it != claims_.end();) {
      auto current = it++;
      if (current->second.lapses_at <= now) {
        if (unfinished_) lapsed.push_back(TellUnfinished(current->second));
        std::vector<std::function<void()>> ended = EndLocked(current, true);
        std::move(ended.begin(), ended.end(), std::back_inserter(lapsed));
      }
    }
    lock.unlock();
    RunAll(lapsed);
    lock.lock();
  }
}

}  // namespace kiln::service
