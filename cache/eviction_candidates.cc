#include "cache/eviction_candidates.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln::cache {
namespace {

// The columns of an EntryToEvict, which every query below selects: the last
// one what its blobs store.
constexpr absl::string_view kEntryToEvictColumns =
    "SELECT e.id, e.namespace, e.key, e.index_disk_bytes, e.link_extension, e.index_namespace, "
    "(SELECT total(b.stored_size) FROM entry_blobs eb JOIN blobs b ON b.id = eb.blob_id "
    "WHERE eb.entry_id = e.id) FROM entries e ";

// The namespaces of `domain` as a range [from, to): "<domain>/" up to
// "<domain>0", '0' being the character after '/'. A range, not a LIKE, so
// that the index on (namespace, key) finds them.
std::pair<std::string, std::string> DomainRange(absl::string_view domain) {
  return {absl::StrCat(domain, "/"), absl::StrCat(domain, "0")};
}

// Every row `query` (bound) selects, in its order.
absl::StatusOr<std::vector<EntryToEvict>> Collect(sqlite::Statement& query) {
  std::vector<EntryToEvict> entries;
  absl::StatusOr<bool> row;
  while ((row = query.Step()).ok() && *row) {
    EntryToEvict& entry = entries.emplace_back();
    entry.id = query.ColumnInt(0);
    entry.names.ns = std::string(query.ColumnText(1));
    entry.names.key = std::string(query.ColumnText(2));
    entry.index_disk_bytes = static_cast<uint64_t>(query.ColumnInt(3));
    if (!query.ColumnIsNull(4)) entry.names.link_extension = std::string(query.ColumnText(4));
    if (!query.ColumnIsNull(5)) entry.names.index_namespace = std::string(query.ColumnText(5));
    entry.stored_bytes = static_cast<uint64_t>(query.ColumnInt(6));
  }
  query.Reset();
  RETURN_IF_ERROR(row.status());
  return entries;
}

}  // namespace

absl::Status EvictionCandidates::Prepare(sqlite::Database& writer) {
  ASSIGN_OR_RETURN(least_recently_used_,
                   writer.Prepare(absl::StrCat(kEntryToEvictColumns, "ORDER BY e.last_use LIMIT ?1")));
  ASSIGN_OR_RETURN(least_recently_used_in_range_,
                   writer.Prepare(absl::StrCat(kEntryToEvictColumns,
                                               "WHERE e.namespace >= ?1 AND e.namespace < ?2 "
                                               "ORDER BY e.last_use LIMIT ?3")));
  ASSIGN_OR_RETURN(by_id_, writer.Prepare(absl::StrCat(
                               kEntryToEvictColumns, "WHERE e.id IN (SELECT value FROM json_each(?1))")));
  ASSIGN_OR_RETURN(bytes_in_range_,
                   writer.Prepare("SELECT total(b.stored_size) FROM entries e "
                                  "JOIN entry_blobs eb ON eb.entry_id = e.id "
                                  "JOIN blobs b ON b.id = eb.blob_id "
                                  "WHERE e.namespace >= ?1 AND e.namespace < ?2"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<EntryToEvict>> EvictionCandidates::LeastRecentlyUsed(int limit) {
  least_recently_used_.Bind(1, limit);
  return Collect(least_recently_used_);
}

absl::StatusOr<std::vector<EntryToEvict>> EvictionCandidates::LeastRecentlyUsedOf(
    absl::string_view domain, int limit) {
  const auto [from, to] = DomainRange(domain);
  least_recently_used_in_range_.BindText(1, from).BindText(2, to).Bind(3, limit);
  return Collect(least_recently_used_in_range_);
}

absl::StatusOr<std::vector<EntryToEvict>> EvictionCandidates::ById(
    const std::vector<int64_t>& entry_ids) {
  if (entry_ids.empty()) return std::vector<EntryToEvict>();
  const std::string ids = sqlite::IdsAsJson(entry_ids);  // bound, not copied: alive until the steps end
  by_id_.BindText(1, ids);
  return Collect(by_id_);
}

absl::StatusOr<uint64_t> EvictionCandidates::DomainBytes(absl::string_view domain) {
  const auto [from, to] = DomainRange(domain);
  ASSIGN_OR_RETURN(std::optional<int64_t> total,
                   bytes_in_range_.BindText(1, from).BindText(2, to).RunForInt());
  return static_cast<uint64_t>(total.value_or(0));
}

std::vector<uint64_t> EvictionCandidates::BytesFreedByEach(const std::vector<EntryToEvict>& entries,
                                                           IndexFiles index_files) {
  std::vector<uint64_t> bytes;
  bytes.reserve(entries.size());
  for (const EntryToEvict& entry : entries) {
    bytes.push_back(entry.stored_bytes +
                    (index_files == IndexFiles::kCounted ? entry.index_disk_bytes : 0));
  }
  return bytes;
}

}  // namespace kiln::cache
