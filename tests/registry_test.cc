#include "client/cpp/oci_registry.h"

#include "gtest/gtest.h"

namespace kiln {
namespace {

TEST(OciReferenceTest, ReadsRegistryRepositoryTagAndDigest) {
  absl::StatusOr<OciReference> tagged = ParseOciReference("registry.local:5000/team/kernels:v4");
  ASSERT_TRUE(tagged.ok()) << tagged.status();
  EXPECT_EQ(tagged->registry, "registry.local:5000");
  EXPECT_EQ(tagged->repository, "team/kernels");
  EXPECT_EQ(tagged->tag, "v4");

  absl::StatusOr<OciReference> untagged = ParseOciReference("ghcr.io/a-b/c__d.e");
  ASSERT_TRUE(untagged.ok()) << untagged.status();
  EXPECT_EQ(untagged->tag, "latest");

  const std::string digest = "sha256:" + std::string(64, 'a');
  absl::StatusOr<OciReference> pinned = ParseOciReference("[::1]:5000/k@" + digest);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_EQ(pinned->registry, "[::1]:5000");
  EXPECT_EQ(pinned->digest, digest);
  EXPECT_EQ(pinned->ToString(), "[::1]:5000/k@" + digest);
}

TEST(OciReferenceTest, RefusesWhatTheDistributionGrammarDoesNot) {
  for (const char* text : {"kernels", "host/", "host/Team/kernels", "host/team//kernels", "host/team/../kernels",
                           "host/.hidden", "host/team/kernels.", "host/a___b", "host/a_.b", "host/k:-v1",
                           "host/k:" "tag with space", "host/k@sha256:abc", "ho st/k", "host\\x/k", "./shelf/k",
                           "relative/dir/../x"}) {
    absl::StatusOr<OciReference> parsed = ParseOciReference(text);
    EXPECT_TRUE(absl::IsInvalidArgument(parsed.status())) << text;
    if (!parsed.ok()) {
      EXPECT_NE(parsed.status().message().find("REGISTRY/REPOSITORY:TAG"), absl::string_view::npos);
    }
  }
}

}  // namespace
}  // namespace kiln
