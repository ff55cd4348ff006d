#ifndef KILN_SERVICE_MISS_LOG_H_
#define KILN_SERVICE_MISS_LOG_H_

#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "kiln/v1/kiln.pb.h"

namespace kiln::service {

// Why compiles were needed (`kiln misses`, like ccache's input hashes): each
// miss that a client is about to compile is compared with what kilnd saw of
// the same kernel (name and target) before, using the key's inputs the client
// sent. Kept in memory and bounded (one that has seen 100,000 keys forgets
// them); what was seen of each kernel survives a restart in a history file,
// the list of recent misses does not.
class MissLog {
 public:
  // `history` (empty: memory only) is read here and written when the log is
  // destroyed, at kilnd's orderly stop: a restart for an upgrade keeps what
  // it knew, and a killed kilnd loses only what it saw since it started.
  explicit MissLog(std::filesystem::path history = {});
  ~MissLog();
  MissLog(const MissLog&) = delete;
  MissLog& operator=(const MissLog&) = delete;

  // Explains and records the miss of (scoped `ns`, key) in trust domain
  // `domain`; returns its reasons (see kiln.v1.Miss).
  std::vector<std::string> Record(absl::string_view domain, absl::string_view ns,
                                  absl::string_view key, const v1::KeyComponents* components);
  // The domain's latest `count` misses, oldest first, namespaces as the
  // domain's clients name them.
  std::vector<v1::Miss> Latest(absl::string_view domain, size_t count) const;
  std::map<std::string, uint64_t> CountsByReason() const;
  // The claim of a miss of (scoped `ns`, key) ended with nothing stored (its
  // claimant went away or its claim lapsed): the key's next miss is
  // "abandoned", not "evicted". Kept in memory only.
  void Abandoned(absl::string_view ns, absl::string_view key);

 private:
  static constexpr size_t kMaxRemembered = 100000;

  const std::filesystem::path history_;
  static constexpr size_t kMaxRecent = 1000;

  mutable std::mutex mutex_;
  absl::flat_hash_set<std::string> keys_missed_;  // scoped namespace + '\0' + key
  absl::flat_hash_set<std::string> keys_abandoned_;  // the same, not in keys_missed_
  // scoped namespace + '\0' + kernel -> its latest key's inputs
  absl::flat_hash_map<std::string, v1::KeyComponents> last_by_kernel_;
  std::deque<std::pair<std::string, v1::Miss>> recent_;  // {domain, miss}
  std::map<std::string, uint64_t> counts_;
};

}  // namespace kiln::service

#endif  // KILN_SERVICE_MISS_LOG_H_
