// The C++ SDK's pieces that need no service or GPU.

#include <cstdlib>

#include "gtest/gtest.h"
#include "kiln/client.h"
#include "kiln/cuda_module.h"

namespace kiln {
namespace {

TEST(ParseTargetTest, AcceptsTritonTargetsAndExplainsBadOnes) {
  absl::StatusOr<v1::Target> target = ParseTarget("cuda:90");
  ASSERT_TRUE(target.ok());
  EXPECT_EQ(target->backend(), "cuda");
  EXPECT_EQ(target->arch(), "90");
  EXPECT_EQ(target->warp_size(), 32);
  EXPECT_EQ(ParseTarget("cuda:90a:32")->arch(), "90a");
  for (const char* bad : {"cuda", "cuda:", "cuda:hopper", ":90", "cuda:90:0", "cuda:90:32:1"}) {
    absl::StatusOr<v1::Target> parsed = ParseTarget(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(parsed.status())) << bad;
    EXPECT_NE(parsed.status().message().find("cuda:90"), absl::string_view::npos) << bad;
  }
}

TEST(KernelMetadataTest, ReadsWhatLaunchingNeedsFromTritonsJson) {
  absl::StatusOr<KernelMetadata> metadata = ParseKernelMetadata(
      R"({"hash": "ab", "target": {"backend": "cuda", "arch": 90, "warp_size": 32},
          "num_warps": 8, "num_ctas": 1, "shared": 65536, "global_scratch_size": 0,
          "profile_scratch_size": 0, "name": "matmul_kernel"})");
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  EXPECT_EQ(metadata->name, "matmul_kernel");
  EXPECT_EQ(metadata->num_warps, 8);
  EXPECT_EQ(metadata->shared, 65536);
  EXPECT_TRUE(absl::IsInvalidArgument(ParseKernelMetadata("not json").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ParseKernelMetadata("{\"num_warps\": 4}").status()));
}

TEST(CudaDriverTest, NoDriverIsAClearErrorNotACrash) {
  absl::StatusOr<std::shared_ptr<CudaDriver>> driver = CudaDriver::Load();
  if (driver.ok()) GTEST_SKIP() << "this machine has a working CUDA driver";
  EXPECT_TRUE(absl::IsFailedPrecondition(driver.status())) << driver.status();
  EXPECT_NE(driver.status().message().find("CUDA"), absl::string_view::npos) << driver.status();
}

TEST(ClientTest, UnreachableServiceIsUnavailableNamingTheEndpoint) {
  ClientOptions options;
  options.endpoint = "unix:/nonexistent/kiln/kilnd.sock";
  options.timeout = absl::Milliseconds(300);
  options.max_attempts = 2;
  options.retry_backoff = absl::Milliseconds(10);
  Client client(options);
  absl::StatusOr<v1::GetStatsResponse> stats = client.Stats();
  EXPECT_TRUE(absl::IsUnavailable(stats.status()) || absl::IsDeadlineExceeded(stats.status()))
      << stats.status();
  EXPECT_NE(stats.status().message().find("/nonexistent/kiln/kilnd.sock"), absl::string_view::npos);
}

}  // namespace
}  // namespace kiln
