// Tests of a real in-process kilnd server over a temp Unix socket and
// 127.0.0.1:0, through the generated gRPC stubs.

#include "service/server.h"
#include "service/bundle_import.h"

#include <filesystem>
#include <fstream>
#include <limits>

#include "absl/strings/match.h"
#include "common/platform.h"
#include "common/sha256.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "kiln/client.h"
#include "kiln/v1/kiln.grpc.pb.h"
#include "tests/test_dir.h"

namespace kiln::service {
namespace {

using ::kiln::testing::TestBytes;
using ::kiln::testing::TestDir;

namespace fs = std::filesystem;

constexpr uint64_t kMaxRequest = 1 << 20;

std::string ReadFile(const fs::path& path) {
  absl::StatusOr<std::string> content = platform::ReadWholeFile(path);
  EXPECT_TRUE(content.ok()) << content.status();
  return content.ok() ? *content : "";
}

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cache::StoreOptions store_options;
    store_options.data_dir = dir_.path() / "data";
    auto store = cache::ArtifactStore::Open(store_options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    // No toolchain is registered: these tests need no Python (the pipeline's
    // own tests run real toolchains).
    toolchains_ = std::make_unique<compiler::ToolchainRegistry>(compiler::PoolOptions{});
    coordinator_ = std::make_unique<CompileCoordinator>(
        *store_, *toolchains_, nullptr,
        absl::FailedPreconditionError("no C compiler in this test"), 2);
    ServerOptions options;
    options.local_socket = (dir_.path() / "run" / "kilnd.sock").string();
    options.tcp_address = "127.0.0.1:0";
    options.max_request_size = kMaxRequest;
    options.served_files_dir = store_->served_files_dir().string();
    auto server = KilnServer::Start(options, *store_, *toolchains_, *coordinator_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& target) {
    grpc::ChannelArguments arguments;
    arguments.SetMaxSendMessageSize(std::numeric_limits<int>::max());
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), arguments);
  }
  std::unique_ptr<v1::Kiln::Stub> UnixStub() {
    return v1::Kiln::NewStub(Channel("unix:" + (dir_.path() / "run" / "kilnd.sock").string()));
  }
  std::unique_ptr<v1::Kiln::Stub> TcpStub() {
    return v1::Kiln::NewStub(Channel("127.0.0.1:" + std::to_string(server_->tcp_port())));
  }

  static v1::PutRequest KernelPut(const std::string& key, size_t cubin_size = 20 * 1024) {
    v1::PutRequest request;
    request.set_namespace_("triton");
    request.set_key(key);
    v1::Blob* cubin = request.add_blobs();
    cubin->set_name("add_kernel.cubin");
    cubin->set_kind(v1::ARTIFACT_KIND_CUBIN);
    cubin->set_data(TestBytes(cubin_size, 1));
    cubin->set_sha256(DigestBytes(Sha256(cubin->data())));
    v1::Blob* json = request.add_blobs();
    json->set_name("add_kernel.json");
    json->set_data("{\"name\": \"add_kernel\"}");
    return request;
  }

  static grpc::Status Put(v1::Kiln::Stub& stub, const v1::PutRequest& request) {
    grpc::ClientContext context;
    v1::PutResponse response;
    return stub.Put(&context, request, &response);
  }

  static v1::LookupResponse Lookup(v1::Kiln::Stub& stub, const std::string& key,
                                   std::vector<std::string> have = {}, bool as_files = false) {
    grpc::ClientContext context;
    v1::LookupRequest request;
    request.set_namespace_("triton");
    request.set_key(key);
    request.set_as_files(as_files);
    for (std::string& digest : have) request.add_have_sha256(std::move(digest));
    v1::LookupResponse response;
    const grpc::Status status = stub.Lookup(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  void ExpectServing(v1::Kiln::Stub& stub) {
    ASSERT_TRUE(Put(stub, KernelPut("still-serving")).ok());
    EXPECT_TRUE(Lookup(stub, "still-serving").found());
  }

  TestDir dir_;
  std::unique_ptr<cache::ArtifactStore> store_;
  std::unique_ptr<compiler::ToolchainRegistry> toolchains_;
  std::unique_ptr<CompileCoordinator> coordinator_;
  std::unique_ptr<KilnServer> server_;
};

v1::BundleEntry BundleEntryOf(const std::string& ns, const std::string& key,
                              const std::string& name, const std::string& data) {
  v1::BundleEntry entry;
  entry.set_namespace_(ns);
  entry.set_key(key);
  v1::Blob* blob = entry.add_blobs();
  blob->set_name(name);
  blob->set_data(data);
  return entry;
}

TEST(BundleAdmissionTest, NativeCodeIsRefusedByNameOrContentButACubinAndDataThatOnlyLookLikeItAreNot) {
  std::string x86_64_elf = std::string("\x7f" "ELF\x02\x01\x01", 7) + std::string(9, '\0');
  x86_64_elf += std::string("\x03\x00\x3e\x00", 4) + std::string(44, '\0');  // ET_DYN, EM_X86_64
  std::string cubin = x86_64_elf;
  cubin[18] = static_cast<char>(190);  // EM_CUDA
  cubin[19] = 0;
  std::string pe(0x80, '\0');
  pe[0] = 'M';
  pe[1] = 'Z';
  pe[0x3c] = 0x40;
  pe.replace(0x40, 4, std::string("PE\0\0", 4));
  std::string mz_by_chance = pe;
  mz_by_chance.replace(0x40, 4, "data");
  const auto admitted = [](const v1::BundleEntry& entry) {
    return AdmitBundleEntry(entry, /*trusted=*/true).kind;
  };
  EXPECT_EQ(admitted(BundleEntryOf("triton", "k", "k.json", x86_64_elf)), BundleEntryAdmission::kRefused);
  EXPECT_EQ(admitted(BundleEntryOf("triton", "k", "k.bin", pe)), BundleEntryAdmission::kRefused);
  EXPECT_EQ(admitted(BundleEntryOf("triton-files", "ab/__triton_launcher.cpython-311-x86_64-linux-gnu.so",
                                   "__triton_launcher.cpython-311-x86_64-linux-gnu.so", "text")),
            BundleEntryAdmission::kRefused);
  EXPECT_EQ(admitted(BundleEntryOf("triton", "k", "cuda_utils.pyd", "text")), BundleEntryAdmission::kRefused);
  EXPECT_EQ(admitted(BundleEntryOf("triton", "k", "k.cubin", cubin)), BundleEntryAdmission::kAsIs);
  EXPECT_EQ(admitted(BundleEntryOf("triton", "k", "k.bin", mz_by_chance)), BundleEntryAdmission::kAsIs);
  EXPECT_EQ(admitted(BundleEntryOf("kiln-memos", "k", "m.json", "{}")), BundleEntryAdmission::kRefused);
  EXPECT_EQ(admitted(BundleEntryOf("shared.launcher", "k", "m", "x")), BundleEntryAdmission::kRefused);
  // Untrusted: a Triton kernel with its recorded TTIR and key inputs is compiled; nothing else comes.
  v1::BundleEntry kernel = BundleEntryOf("triton", "k", "add_kernel.source", "module {}");
  *kernel.add_blobs() = BundleEntryOf("", "", "kiln.key-inputs.json", "{}").blobs(0);
  EXPECT_EQ(AdmitBundleEntry(kernel, false).kind, BundleEntryAdmission::kCompile);
  EXPECT_EQ(AdmitBundleEntry(BundleEntryOf("triton", "k", "k.cubin", cubin), false).kind,
            BundleEntryAdmission::kRefused);
  EXPECT_EQ(AdmitBundleEntry(BundleEntryOf("inductor", "g", "graph.py", "x"), false).kind,
            BundleEntryAdmission::kRefused);
}

TEST_F(ServiceTest, PutThenLookupOverTheUnixSocket) {
  auto stub = UnixStub();
  const v1::PutRequest put = KernelPut("abc");
  ASSERT_TRUE(Put(*stub, put).ok());
  const v1::LookupResponse response = Lookup(*stub, "abc");
  ASSERT_TRUE(response.found());
  ASSERT_EQ(response.entry().blobs_size(), 2);
  EXPECT_EQ(response.entry().blobs(0).name(), "add_kernel.cubin");
  EXPECT_EQ(response.entry().blobs(0).data(), put.blobs(0).data());
  EXPECT_EQ(response.entry().blobs(0).sha256(), put.blobs(0).sha256());
  EXPECT_EQ(response.entry().blobs(1).data(), put.blobs(1).data());
  EXPECT_FALSE(Lookup(*stub, "other").found());
}

TEST_F(ServiceTest, PutThenLookupOverLoopbackTcpInItsOwnTrustDomain) {
  ASSERT_GT(server_->tcp_port(), 0);
  auto stub = TcpStub();
  ASSERT_TRUE(Put(*stub, KernelPut("tcp")).ok());
  EXPECT_TRUE(Lookup(*stub, "tcp").found());
  // TCP clients are another trust domain: what they store is not served to
  // the local user's socket, and the other way round.
  EXPECT_FALSE(Lookup(*UnixStub(), "tcp").found());
  ASSERT_TRUE(Put(*UnixStub(), KernelPut("local")).ok());
  EXPECT_FALSE(Lookup(*stub, "local").found());
}

TEST_F(ServiceTest, LookupOmitsBlobsTheClientHas) {
  auto stub = UnixStub();
  const v1::PutRequest put = KernelPut("have");
  ASSERT_TRUE(Put(*stub, put).ok());
  const v1::LookupResponse response = Lookup(*stub, "have", {put.blobs(0).sha256()});
  ASSERT_TRUE(response.found());
  EXPECT_TRUE(response.entry().blobs(0).data_omitted());
  EXPECT_TRUE(response.entry().blobs(0).data().empty());
  EXPECT_FALSE(response.entry().blobs(1).data_omitted());
}

TEST_F(ServiceTest, LocalClientsMayReadBlobsAsFilesRemoteOnesGetBytes) {
  const v1::PutRequest put = KernelPut("files");
  ASSERT_TRUE(Put(*UnixStub(), put).ok());
  const v1::LookupResponse local = Lookup(*UnixStub(), "files", {}, /*as_files=*/true);
  ASSERT_TRUE(local.found());
  for (int i = 0; i < put.blobs_size(); ++i) {
    const v1::Blob& blob = local.entry().blobs(i);
    EXPECT_TRUE(blob.data().empty());
    ASSERT_FALSE(blob.path().empty()) << blob.name();
    // Named for its content, with the name's extension: Triton goes by suffix.
    EXPECT_EQ(fs::path(blob.path()).extension(), fs::path(blob.name()).extension());
    EXPECT_EQ(ReadFile(blob.path()), put.blobs(i).data());
  }
  // The socket's neighbour names the directory, for clients that skip the call.
  EXPECT_EQ(ReadFile(dir_.path() / "run" / "kilnd.sock.files"),
            (dir_.path() / "data" / "files").string() + "\n");

  ASSERT_TRUE(Put(*TcpStub(), put).ok());
  const v1::LookupResponse remote = Lookup(*TcpStub(), "files", {}, /*as_files=*/true);
  ASSERT_TRUE(remote.found());
  EXPECT_TRUE(remote.entry().blobs(0).path().empty());
  EXPECT_EQ(remote.entry().blobs(0).data(), put.blobs(0).data());

  server_->Shutdown(absl::ZeroDuration());
  EXPECT_FALSE(fs::exists(dir_.path() / "run" / "kilnd.sock.files"));
}

TEST_F(ServiceTest, HealthReportsServing) {
  auto health = grpc::health::v1::Health::NewStub(
      Channel("unix:" + (dir_.path() / "run" / "kilnd.sock").string()));
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(health->Check(&context, request, &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(ServiceTest, OversizedRequestIsResourceExhaustedAndServiceGoesOn) {
  auto stub = UnixStub();
  const grpc::Status status = Put(*stub, KernelPut("huge", 2 * kMaxRequest));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_FALSE(Lookup(*stub, "huge").found());
  ExpectServing(*stub);
}

TEST_F(ServiceTest, GarbageFieldsAreInvalidArgumentAndServiceGoesOn) {
  auto stub = UnixStub();
  std::vector<std::pair<std::string, v1::PutRequest>> bad;
  bad.emplace_back("namespace", KernelPut("k"));
  bad.back().second.set_namespace_("Not A Namespace!");
  bad.emplace_back("key", KernelPut("k"));
  bad.back().second.set_key(std::string("bad\0key\n", 8));
  bad.emplace_back("digest length", KernelPut("k"));
  bad.back().second.mutable_blobs(0)->set_sha256("short");
  bad.emplace_back("digest mismatch", KernelPut("k"));
  bad.back().second.mutable_blobs(0)->set_sha256(DigestBytes(Sha256("something else")));
  bad.emplace_back("path in name", KernelPut("k"));
  bad.back().second.mutable_blobs(0)->set_name("../../etc/passwd");
  bad.emplace_back("duplicate name", KernelPut("k"));
  bad.back().second.mutable_blobs(1)->set_name("add_kernel.cubin");
  bad.emplace_back("no blobs", KernelPut("k"));
  bad.back().second.clear_blobs();
  bad.emplace_back("size mismatch", KernelPut("k"));
  bad.back().second.mutable_blobs(0)->set_size(7);
  for (const auto& [what, request] : bad) {
    const grpc::Status status = Put(*stub, request);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << what;
    EXPECT_FALSE(status.error_message().empty()) << what;
  }
  grpc::ClientContext context;
  v1::LookupRequest lookup;
  lookup.set_namespace_("triton");
  lookup.set_key("k");
  lookup.add_have_sha256("not a digest");
  v1::LookupResponse response;
  EXPECT_EQ(stub->Lookup(&context, lookup, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(Lookup(*stub, "k").found());
  ExpectServing(*stub);
}

TEST_F(ServiceTest, StatsCountLookupsAndReportLatency) {
  auto stub = UnixStub();
  ASSERT_TRUE(Put(*stub, KernelPut("s")).ok());
  Lookup(*stub, "s");
  Lookup(*stub, "s");
  Lookup(*stub, "missing");
  grpc::ClientContext context;
  v1::GetStatsResponse stats;
  ASSERT_TRUE(stub->GetStats(&context, v1::GetStatsRequest(), &stats).ok());
  EXPECT_EQ(stats.hits(), 2u);
  EXPECT_EQ(stats.misses(), 1u);
  EXPECT_EQ(stats.puts(), 1u);
  EXPECT_EQ(stats.entries(), 1u);
  EXPECT_GT(stats.stored_bytes(), 20000u);
  EXPECT_EQ(stats.max_size_bytes(), 10ull << 30);
  ASSERT_EQ(stats.lookups_by_namespace_size(), 1);
  EXPECT_EQ(stats.lookups_by_namespace(0).namespace_(), "local/triton");
  EXPECT_EQ(stats.lookups_by_namespace(0).hits(), 2u);
  EXPECT_EQ(stats.lookups_by_namespace(0).misses(), 1u);
  bool saw_lookup = false;
  for (const v1::RpcLatency& rpc : stats.rpc_latency()) {
    if (rpc.method() != "Lookup") continue;
    saw_lookup = true;
    EXPECT_EQ(rpc.count(), 3u);
    EXPECT_GT(rpc.p50_ms(), 0.0);
    EXPECT_LE(rpc.p50_ms(), rpc.p99_ms());
    EXPECT_LE(rpc.p99_ms(), rpc.max_ms());
  }
  EXPECT_TRUE(saw_lookup);
}

v1::CompileRequest ValidCompile() {
  v1::CompileRequest request;
  request.set_triton_key("3.6.0-not-registered");
  request.set_stage(v1::STAGE_TTIR);
  request.set_ir("module {}");
  request.mutable_target()->set_backend("cuda");
  request.mutable_target()->set_arch("90");
  request.mutable_target()->set_warp_size(32);
  request.set_options_json("{\"num_warps\": 4}");
  return request;
}

TEST_F(ServiceTest, CompileForAnUnknownToolchainIsFailedPrecondition) {
  grpc::ClientContext context;
  v1::CompileResponse response;
  const grpc::Status status = UnixStub()->Compile(&context, ValidCompile(), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("available: none"), std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find("toolchain"), std::string::npos);
}

TEST_F(ServiceTest, MalformedCompileRequestsAreInvalidArgument) {
  auto stub = UnixStub();
  std::vector<std::pair<std::string, v1::CompileRequest>> bad;
  bad.emplace_back("arch", ValidCompile());
  bad.back().second.mutable_target()->set_arch("hopper");
  bad.emplace_back("warp size", ValidCompile());
  bad.back().second.mutable_target()->set_warp_size(0);
  bad.emplace_back("options", ValidCompile());
  bad.back().second.set_options_json("[1, 2");
  bad.emplace_back("stage", ValidCompile());
  bad.back().second.set_stage(v1::STAGE_UNSPECIFIED);
  bad.emplace_back("no key", ValidCompile());
  bad.back().second.clear_triton_key();
  bad.emplace_back("no ir", ValidCompile());
  bad.back().second.clear_ir();
  for (const auto& [what, request] : bad) {
    grpc::ClientContext context;
    v1::CompileResponse response;
    EXPECT_EQ(stub->Compile(&context, request, &response).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT)
        << what;
  }
  ExpectServing(*stub);
}

TEST_F(ServiceTest, ListToolchainsIsEmptyWhenNoneIsRegistered) {
  grpc::ClientContext context;
  v1::ListToolchainsResponse response;
  ASSERT_TRUE(UnixStub()->ListToolchains(&context, {}, &response).ok());
  EXPECT_EQ(response.toolchains_size(), 0);
}

TEST_F(ServiceTest, SecondServerOnALiveSocketIsRefused) {
  ServerOptions options;
  options.local_socket = (dir_.path() / "run" / "kilnd.sock").string();
  auto second = KilnServer::Start(options, *store_, *toolchains_, *coordinator_);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  ExpectServing(*UnixStub());
}

TEST_F(ServiceTest, StaleSocketFileIsReplacedAfterShutdown) {
  server_->Shutdown(absl::Seconds(5));
  server_.reset();
  // Simulate a crash that left the socket file behind.
  std::ofstream(dir_.path() / "run" / "kilnd.sock") << "";
  ServerOptions options;
  options.local_socket = (dir_.path() / "run" / "kilnd.sock").string();
  auto restarted = KilnServer::Start(options, *store_, *toolchains_, *coordinator_);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  server_ = *std::move(restarted);
  ExpectServing(*UnixStub());
}

// The Windows transport (there is no Unix socket there), tested on Linux: the
// endpoint file names a loopback port and a token; only token holders get in.
TEST_F(ServiceTest, EndpointFileListenerServesTokenHoldersAsTheLocalUser) {
  server_.reset();
  const std::filesystem::path endpoint_file = dir_.path() / "win-run" / "kilnd.endpoint";
  ServerOptions options;
  options.endpoint_file = endpoint_file.string();
  auto server = KilnServer::Start(options, *store_, *toolchains_, *coordinator_);
  ASSERT_TRUE(server.ok()) << server.status();

  std::ifstream in(endpoint_file);
  std::string address, token;
  ASSERT_TRUE(std::getline(in, address) && std::getline(in, token));
  EXPECT_TRUE(absl::StartsWith(address, "127.0.0.1:")) << address;
  EXPECT_EQ(token.size(), 64u);

  // The SDK reads the file and sends the token: kilnd's own user, so
  // maintenance is allowed.
  ClientOptions client_options;
  client_options.endpoint_file = endpoint_file;
  Client client(client_options);
  EXPECT_TRUE(client.Stats().ok());
  EXPECT_TRUE(client.Verify().ok());

  // No token, or a wrong one: refused, naming where the token is.
  auto stub = v1::Kiln::NewStub(Channel(address));
  grpc::ClientContext no_token;
  v1::GetStatsResponse stats;
  grpc::Status refused = stub->GetStats(&no_token, {}, &stats);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(refused.error_message().find(endpoint_file.string()), std::string::npos);
  grpc::ClientContext wrong_token;
  wrong_token.AddMetadata("x-kiln-token", std::string(64, '0'));
  EXPECT_EQ(stub->GetStats(&wrong_token, {}, &stats).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // A second kilnd does not take over a live endpoint.
  auto second = KilnServer::Start(options, *store_, *toolchains_, *coordinator_);
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();

  (*server)->Shutdown(absl::Seconds(5));
  EXPECT_FALSE(std::filesystem::exists(endpoint_file));
  ClientOptions missing_options;
  missing_options.endpoint_file = endpoint_file;
  missing_options.max_attempts = 1;
  absl::Status missing = Client(missing_options).Stats().status();
  EXPECT_TRUE(absl::IsUnavailable(missing)) << missing;
  EXPECT_NE(missing.message().find("is kilnd running"), absl::string_view::npos);
}

}  // namespace
}  // namespace kiln::service
