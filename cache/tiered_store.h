#ifndef KILN_CACHE_TIERED_STORE_H_
#define KILN_CACHE_TIERED_STORE_H_

// kilnd's own results (compile results and launcher modules, whose content is
// a function of the key kilnd derived) in two levels: this kilnd's store, and
// the fleet's SharedTier behind it where one is configured. A lookup falls
// through to the shared tier and fills the local store with what it found
// (its digests checked there); a put goes to both. Callers see one store: the
// levels, and whether there is a second, are this class's concern.
//
// Entries of a client's own namespace never go through it: only what kilnd
// keys itself may be served to every kilnd of a fleet.

#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cache/artifact_store.h"
#include "cache/shared_tier.h"

namespace kiln::cache {

class TieredStore {
 public:
  // `shared` may be null (no fleet): then the local store alone.
  TieredStore(ArtifactStore& local, SharedTier* shared) : local_(local), shared_(shared) {}

  // The entry for (ns, key) as ArtifactStore::Lookup gives it, from the local
  // store, or else from the shared tier (stored locally first). NOT_FOUND on
  // a miss in both; an error of the local store's put of what the shared tier
  // had.
  absl::StatusOr<CacheEntry> Lookup(absl::string_view ns, absl::string_view key,
                                    const absl::flat_hash_set<std::string>& digests_to_skip = {});

  // Stores `blobs` under (ns, key) locally, then offers them to the shared
  // tier (written in the background; that ends this kilnd's claim). Returns
  // the local manifest (ArtifactStore::Put). On a local error nothing is
  // offered, and a claim stays for Release.
  absl::StatusOr<std::vector<StoredBlob>> Put(absl::string_view ns, absl::string_view key,
                                              const NamedContent& blobs);

  // One compile of (ns, key) across the fleet (SharedTier::AwaitTurn);
  // kCompileHere with no shared tier.
  SharedTier::Turn AwaitTurn(absl::string_view ns, absl::string_view key, absl::Duration patience);
  // Ends this kilnd's claim without a result (SharedTier::Release).
  void Release(absl::string_view ns, absl::string_view key);
  // kilnd is stopping: every AwaitTurn ends now.
  void StopWaiting();
  // The shared tier's figures; nullopt with no shared tier.
  std::optional<SharedTierStats> SharedStats() const;

 private:
  ArtifactStore& local_;
  SharedTier* const shared_;
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_TIERED_STORE_H_
