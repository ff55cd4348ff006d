#include "cache/tiered_store.h"

#include <utility>

#include "common/status_macros.h"

namespace kiln::cache {

absl::StatusOr<CacheEntry> TieredStore::Lookup(absl::string_view ns, absl::string_view key,
                                               const absl::flat_hash_set<std::string>& digests_to_skip) {
  absl::StatusOr<CacheEntry> entry = local_.Lookup(ns, key, digests_to_skip);
  if (!absl::IsNotFound(entry.status()) || shared_ == nullptr) return entry;
  // Another kilnd of the fleet may have made it: its checked blobs fill ours,
  // and the answer is read back as every local hit is.
  std::optional<NamedContent> fetched = shared_->Fetch(ns, key);
  if (!fetched.has_value()) return entry;
  std::vector<BlobInput> inputs;
  inputs.reserve(fetched->size());
  for (auto& [name, data] : *fetched) inputs.push_back({name, std::move(data), ""});
  RETURN_IF_ERROR(local_.Put(ns, key, std::move(inputs)).status());
  return local_.Lookup(ns, key, digests_to_skip);
}

absl::StatusOr<std::vector<StoredBlob>> TieredStore::Put(absl::string_view ns, absl::string_view key,
                                                         const NamedContent& blobs) {
  std::vector<BlobInput> inputs;
  inputs.reserve(blobs.size());
  for (const auto& [name, data] : blobs) inputs.push_back({name, data, ""});
  ASSIGN_OR_RETURN(std::vector<StoredBlob> manifest, local_.Put(ns, key, std::move(inputs)));
  if (shared_ != nullptr) shared_->Offer(std::string(ns), std::string(key), blobs);
  return manifest;
}

SharedTier::Turn TieredStore::AwaitTurn(absl::string_view ns, absl::string_view key,
                                        absl::Duration patience) {
  if (shared_ == nullptr) return SharedTier::Turn::kCompileHere;
  return shared_->AwaitTurn(ns, key, patience);
}

void TieredStore::Release(absl::string_view ns, absl::string_view key) {
  if (shared_ != nullptr) shared_->Release(ns, key);
}

void TieredStore::StopWaiting() {
  if (shared_ != nullptr) shared_->StopWaiting();
}

std::optional<SharedTierStats> TieredStore::SharedStats() const {
  if (shared_ == nullptr) return std::nullopt;
  return shared_->Stats();
}

}  // namespace kiln::cache
