#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cpp/oci_registry.h"
#include "client/cpp/registry_auth.h"
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

TEST(TokenAnswerTest, ReadsTheTokenAndHowLongItLastsWithinDockersBounds) {
  absl::StatusOr<IssuedToken> token = ParseTokenAnswer(R"({"token": "t1", "expires_in": 300})", "r.example");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(token->value, "t1");
  EXPECT_EQ(token->lifetime, absl::Seconds(300));

  token = ParseTokenAnswer(R"({"access_token": "t2"})", "r.example");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(token->value, "t2");
  EXPECT_EQ(token->lifetime, absl::Seconds(60));

  // Too short to be sent before it expires, or longer than a day: held to those bounds.
  for (const auto& [expires_in, lifetime] : {std::pair{"5", absl::Seconds(60)},
                                             std::pair{"1e-300", absl::Seconds(60)},
                                             std::pair{"1e300", absl::Hours(24)}}) {
    token = ParseTokenAnswer(absl::StrCat(R"({"token": "t", "expires_in": )", expires_in, "}"), "r.example");
    ASSERT_TRUE(token.ok()) << token.status();
    EXPECT_EQ(token->lifetime, lifetime) << expires_in;
  }
}

TEST(TokenAnswerTest, RefusesAnAnswerWithNoTokenForOneHeaderLine) {
  for (const char* body : {"", "not json", "[1]", R"({"token": ""})", R"({"token": 5})",
                           R"({"token": "a\r\nX-Injected: 1"})"}) {
    absl::StatusOr<IssuedToken> token = ParseTokenAnswer(body, "r.example");
    EXPECT_TRUE(absl::IsUnavailable(token.status())) << body;
    EXPECT_NE(token.status().message().find("r.example"), absl::string_view::npos) << body;
  }
}

}  // namespace
}  // namespace kiln
