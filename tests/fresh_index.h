#ifndef KILN_TESTS_FRESH_INDEX_H_
#define KILN_TESTS_FRESH_INDEX_H_

// The fixture of the store's parts' tests (cache/*.h): a fresh index, made
// by the store's own schema (store_schema.h), in a data directory of the
// test's own. A part's fixture derives from it and prepares the part on db_
// in its SetUp; the part, a member of the derived fixture, goes before db_
// closes.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "cache/sqlite.h"
#include "cache/store_schema.h"
#include "gtest/gtest.h"
#include "tests/test_dir.h"

namespace kiln::testing {

class FreshIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(data_dir());
    absl::StatusOr<cache::store_internal::OpenedIndex> index =
        cache::store_internal::OpenIndex(index_path(), absl::Seconds(5), [] {});
    ASSERT_TRUE(index.ok()) << index.status();
    db_ = std::move(index->db);
  }
  std::filesystem::path data_dir() const { return dir_.path() / "data"; }
  std::filesystem::path index_path() const { return data_dir() / "kiln.db"; }
  void Exec(const std::string& sql) { ASSERT_TRUE(db_->Exec(sql).ok()) << sql; }
  // The first column of the first row `sql` selects.
  int64_t QueryInt(const std::string& sql) {
    absl::StatusOr<sqlite::Statement> query = db_->Prepare(sql);
    EXPECT_TRUE(query.ok()) << sql << ": " << query.status();
    if (!query.ok() || !query->Step().value_or(false)) {
      ADD_FAILURE() << "no row: " << sql;
      return -1;
    }
    return query->ColumnInt(0);
  }

  TestDir dir_;
  std::unique_ptr<sqlite::Database> db_;
};

}  // namespace kiln::testing

#endif  // KILN_TESTS_FRESH_INDEX_H_
