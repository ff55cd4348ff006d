// The C++ SDK's pieces that need no kilnd or GPU.

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "kiln/client.h"
#include "kiln/cuda_module.h"
#include "kiln/v1/kiln.grpc.pb.h"

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

// A stand-in for kilnd, on loopback: its GetStats fails the first `failures`
// calls with `failure`, as gRPC's transport would report them, then answers.
class FailingFirstStats final : public v1::Kiln::Service {
 public:
  FailingFirstStats(int failures, grpc::Status failure) : failures_(failures), failure_(std::move(failure)) {}

  grpc::Status GetStats(grpc::ServerContext*, const v1::GetStatsRequest*, v1::GetStatsResponse*) override {
    return calls_++ < failures_ ? failure_ : grpc::Status::OK;
  }
  int calls() const { return calls_; }

 private:
  const int failures_;
  const grpc::Status failure_;
  std::atomic<int> calls_ = 0;
};

// Stats through a client of `service`, served on a loopback port of its own.
absl::Status StatsFrom(FailingFirstStats& service) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  EXPECT_NE(port, 0);
  ClientOptions options;
  options.endpoint = absl::StrCat("127.0.0.1:", port);
  options.max_attempts = 3;
  options.retry_backoff = absl::Milliseconds(10);
  absl::Status status = Client(options).Stats().status();
  server->Shutdown();
  return status;
}

TEST(ClientTest, ACallTheConnectionDroppedIsMadeAgain) {
  FailingFirstStats service(2, grpc::Status(grpc::StatusCode::UNKNOWN, "Stream removed"));
  EXPECT_TRUE(StatsFrom(service).ok());
  EXPECT_EQ(service.calls(), 3);
}

TEST(ClientTest, OtherUnknownFailuresAreNotMadeAgain) {
  FailingFirstStats service(1, grpc::Status(grpc::StatusCode::UNKNOWN, "a handler threw"));
  absl::Status status = StatsFrom(service);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnknown) << status;
  EXPECT_EQ(service.calls(), 1);
}

}  // namespace
}  // namespace kiln
