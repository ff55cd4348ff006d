// Tests of how the store keeps a blob's bytes, alone (cache/blob_storage.h):
// inline or in files, encoded, published, and read back checked, in a fresh
// directory.

#include "cache/blob_storage.h"

#include <fstream>

#include "common/sha256.h"
#include "gtest/gtest.h"
#include "tests/test_dir.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;
using ::kiln::testing::TestBytes;
using ::kiln::testing::TestDir;
using Check = BlobStorage::IntegrityCheck;

class BlobStorageTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(storage_.Initialize().ok()); }
  fs::path data_dir() const { return dir_.path() / "data"; }
  absl::StatusOr<std::string> ReadBack(const PreparedBlob& blob, Check check) {
    return storage_.Read(blob.codec, blob.location, blob.stored, blob.digest, blob.size, check);
  }

  TestDir dir_;
  BlobStorage storage_{{.data_dir = dir_.path() / "data",
                        .inline_threshold_bytes = 1024,
                        .zstd_level = 1,
                        .trust_files_changed_before = absl::ZeroDuration()}};
};

TEST_F(BlobStorageTest, ASmallBlobStaysInlineAndReadsBackChecked) {
  absl::StatusOr<PreparedBlob> blob = storage_.Prepare("k.json", "{}", "");
  ASSERT_TRUE(blob.ok()) << blob.status();
  EXPECT_EQ(blob->location, BlobLocation::kInline);
  EXPECT_TRUE(blob->temp_path.empty());
  EXPECT_EQ(blob->digest, DigestBytes(Sha256("{}")));
  absl::StatusOr<std::string> content = ReadBack(*blob, Check::kHashEverything);
  ASSERT_TRUE(content.ok()) << content.status();
  EXPECT_EQ(*content, "{}");
}

TEST_F(BlobStorageTest, ALargeBlobIsAFileNamedForItsContentOncePublished) {
  const std::string data = TestBytes(64 * 1024, 1);  // random: stored raw
  absl::StatusOr<PreparedBlob> blob = storage_.Prepare("k.cubin", data, DigestBytes(Sha256(data)));
  ASSERT_TRUE(blob.ok()) << blob.status();
  EXPECT_EQ(blob->location, BlobLocation::kFile);
  EXPECT_TRUE(blob->stored.empty()) << "its bytes are in the temp file";
  EXPECT_TRUE(fs::exists(blob->temp_path));
  EXPECT_EQ(blob->temp_path.parent_path(), data_dir() / "blobs" / "tmp");

  ASSERT_TRUE(storage_.Publish(*blob).ok());
  const fs::path file = storage_.PathOf(blob->digest);
  EXPECT_EQ(file.filename().string(), DigestHex(blob->digest));
  EXPECT_TRUE(fs::exists(file));
  EXPECT_FALSE(fs::exists(blob->temp_path));
  absl::StatusOr<std::string> content = ReadBack(*blob, Check::kTrustUnchangedFiles);
  ASSERT_TRUE(content.ok()) << content.status();
  EXPECT_EQ(*content, data);
}

TEST_F(BlobStorageTest, ACompressibleBlobIsStoredSmallerAndReadsBackWhole) {
  const std::string data(256 * 1024, 'x');
  absl::StatusOr<PreparedBlob> blob = storage_.Prepare("k.ptx", data, "");
  ASSERT_TRUE(blob.ok()) << blob.status();
  EXPECT_EQ(blob->codec, store_internal::kZstd);
  EXPECT_LT(blob->stored_size, data.size() / 10);
  EXPECT_EQ(blob->location, BlobLocation::kInline) << "small once compressed";
  absl::StatusOr<std::string> content = ReadBack(*blob, Check::kHashEverything);
  ASSERT_TRUE(content.ok()) << content.status();
  EXPECT_EQ(*content, data);
}

TEST_F(BlobStorageTest, ContentThatIsNotWhatTheSenderClaimsIsRefusedByName) {
  absl::StatusOr<PreparedBlob> blob =
      storage_.Prepare("k.cubin", "bytes", DigestBytes(Sha256("other bytes")));
  EXPECT_TRUE(absl::IsInvalidArgument(blob.status())) << blob.status();
  EXPECT_NE(blob.status().message().find("k.cubin"), std::string::npos) << blob.status();
}

TEST_F(BlobStorageTest, AFileChangedOnDiskIsCaughtByItsDigest) {
  const std::string data = TestBytes(8 * 1024, 2);
  absl::StatusOr<PreparedBlob> blob = storage_.Prepare("k.cubin", data, "");
  ASSERT_TRUE(blob.ok());
  ASSERT_TRUE(storage_.Publish(*blob).ok());
  ASSERT_TRUE(ReadBack(*blob, Check::kTrustUnchangedFiles).ok()) << "checked once, and trusted";

  std::string damaged = data;
  damaged[100] ^= 1;
  std::ofstream(storage_.PathOf(blob->digest), std::ios::binary | std::ios::trunc) << damaged;
  // Its stamp changed (size the same, time not): trusted no longer, hashed.
  absl::StatusOr<std::string> trusted_read = ReadBack(*blob, Check::kTrustUnchangedFiles);
  absl::StatusOr<std::string> verified = ReadBack(*blob, Check::kHashEverything);
  EXPECT_EQ(verified.status().code(), absl::StatusCode::kDataLoss) << verified.status();
  if (trusted_read.ok()) {
    // Only where the file system's clock did not tick between the writes.
    EXPECT_EQ(*trusted_read, data);
  } else {
    EXPECT_EQ(trusted_read.status().code(), absl::StatusCode::kDataLoss);
  }
}

TEST_F(BlobStorageTest, TempFilesGoWhenNotPublishedAndAtTheNextInitialize) {
  absl::StatusOr<PreparedBlob> kept = storage_.Prepare("a", TestBytes(4096, 3), "");
  absl::StatusOr<PreparedBlob> dropped = storage_.Prepare("b", TestBytes(4096, 4), "");
  ASSERT_TRUE(kept.ok() && dropped.ok());
  BlobStorage::RemoveTempFiles({*dropped});
  EXPECT_FALSE(fs::exists(dropped->temp_path));
  EXPECT_TRUE(fs::exists(kept->temp_path));
  // A kill left it: the next open's storage sweeps it.
  BlobStorage reopened({.data_dir = data_dir(), .inline_threshold_bytes = 1024});
  ASSERT_TRUE(reopened.Initialize().ok());
  EXPECT_FALSE(fs::exists(kept->temp_path));
}

}  // namespace
}  // namespace kiln::cache
