#include "service/config.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "service/bundle_subscription.h"
#include "service/client_identity.h"
#include "tests/test_dir.h"

namespace kiln::service {
namespace {

TEST(ConfigTest, ReadsSettingsWithCommentsAndUnits) {
  Config config = DefaultConfig();
  ASSERT_TRUE(ApplyConfigText("# kilnd\n"
                              "max_cache_size = 2GiB   # cap\n"
                              "\n"
                              "zstd_level=0\n"
                              "tcp_listen = 7733\n",
                              "test.conf", config)
                  .ok());
  EXPECT_EQ(config.max_cache_size, 2ull << 30);
  EXPECT_EQ(config.zstd_level, 0);
  EXPECT_EQ(NormalizeTcpAddress(config.tcp_listen), "127.0.0.1:7733");
}

TEST(ConfigTest, BundleSourcesAreAListAndTheRefreshADuration) {
  Config config = DefaultConfig();
  EXPECT_EQ(config.bundle_refresh_seconds, 3600);
  ASSERT_TRUE(ApplyConfigText("bundle_sources = ghcr.io/team/kernels:v4, /srv/kernels\n"
                              "bundle_sources = registry.local:5000/fleet/kernels\n"
                              "bundle_refresh = 30m\n",
                              "k.conf", config)
                  .ok());
  EXPECT_EQ(config.bundle_sources, (std::vector<std::string>{"ghcr.io/team/kernels:v4", "/srv/kernels",
                                                             "registry.local:5000/fleet/kernels"}));
  EXPECT_EQ(config.bundle_refresh_seconds, 1800);
  ASSERT_TRUE(ApplyConfigText("gpu_targets = cuda:89, cuda:90\n", "k.conf", config).ok());
  EXPECT_EQ(config.gpu_targets, (std::vector<std::string>{"cuda:89", "cuda:90"}));
  EXPECT_TRUE(absl::IsInvalidArgument(ApplyConfigText("gpu_targets = sm89\n", "k.conf", config)));
  ASSERT_TRUE(ApplyConfigText("bundle_refresh = 90\n", "k.conf", config).ok());
  EXPECT_EQ(config.bundle_refresh_seconds, 90);
  for (const char* refused : {"0s", "-1h", "200h", "soon"}) {
    absl::Status status = ApplyConfigText(absl::StrCat("bundle_refresh = ", refused, "\n"), "k.conf", config);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << refused;
    EXPECT_NE(status.message().find("bundle_refresh"), absl::string_view::npos) << status;
  }
}

TEST(ConfigTest, ABundleSourceIsAnAbsoluteDirectoryOrAnOciReference) {
  EXPECT_EQ(BundleSourceProblem("ghcr.io/team/kernels:v4"), "");
  EXPECT_EQ(BundleSourceProblem(std::filesystem::absolute("shelf").string()), "");
  for (const char* refused : {"./shelf", "shelf", "relative/dir/../x", "", "host/k\tv"}) {
    EXPECT_NE(BundleSourceProblem(refused), "") << refused;
  }
  EXPECT_NE(BundleSourceProblem("./shelf").find("absolute path"), std::string::npos);
}

TEST(ConfigTest, ErrorsNameTheFileLineAndProblem) {
  Config config;
  absl::Status status = ApplyConfigText("zstd_level = 1\nmax_cache_sise = 1GiB\n", "k.conf", config);
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_NE(status.message().find("k.conf:2"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("max_cache_sise"), absl::string_view::npos) << status;

  status = ApplyConfigText("max_cache_size = lots\n", "k.conf", config);
  EXPECT_NE(status.message().find("GiB"), absl::string_view::npos) << status;
  EXPECT_TRUE(absl::IsInvalidArgument(ApplyConfigText("zstd_level = 40\n", "k.conf", config)));
  EXPECT_TRUE(absl::IsInvalidArgument(ApplyConfigText("no equals sign\n", "k.conf", config)));
}

TEST(ConfigTest, FlagsOverrideTheConfigFile) {
  testing::TestDir dir;
  const std::string file = (dir.path() / "kilnd.conf").string();
  std::ofstream(file) << "max_cache_size = 1GiB\nzstd_level = 3\n";
  absl::StatusOr<CommandLine> parsed =
      ParseCommandLine({"--config", file, "--max-cache-size=5GiB", "--data-dir", "/tmp/x"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->config.max_cache_size, 5ull << 30);
  EXPECT_EQ(parsed->config.zstd_level, 3);
  EXPECT_EQ(parsed->config.data_dir, "/tmp/x");
  EXPECT_EQ(parsed->command, Command::kServe);
}

TEST(ConfigTest, MissingConfigFileIsAClearError) {
  absl::StatusOr<CommandLine> parsed = ParseCommandLine({"--config", "/nonexistent/kilnd.conf"});
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("/nonexistent/kilnd.conf"), absl::string_view::npos);
}

TEST(ConfigTest, ASocketGroupNeedsASocket) {
  Config config = DefaultConfig();
  config.tcp_listen = "127.0.0.1:7733";
  config.local_socket = "none";
  config.local_socket_group = "kiln";
  absl::Status status = ValidateConfig(config);
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_NE(status.message().find("local_socket is 'none'"), absl::string_view::npos) << status;
  config.local_socket = "/run/kiln/kilnd.sock";
  EXPECT_TRUE(ValidateConfig(config).ok());
}

TEST(ConfigTest, RemoteListenersNeedAllowRemoteFromTheFile) {
  Config config = DefaultConfig();
  config.tcp_listen = "0.0.0.0:7733";
  absl::Status status = ValidateConfig(config);
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_NE(status.message().find("allow_remote"), absl::string_view::npos);
  config.allow_remote = true;
  // allow_remote alone is not enough: TLS and a way to tell clients apart.
  status = ValidateConfig(config);
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  for (const char* setting : {"tls_cert", "tls_key", "tls_client_ca", "client_tokens"}) {
    EXPECT_NE(status.message().find(setting), absl::string_view::npos) << setting;
  }
  config.tls_cert = "/etc/kiln/farm.pem";
  config.tls_key = "/etc/kiln/farm.key";
  EXPECT_FALSE(ValidateConfig(config).ok()) << "TLS without client identity";
  config.client_tokens = "/etc/kiln/client_tokens";
  EXPECT_TRUE(ValidateConfig(config).ok());
  config.client_tokens.clear();
  config.tls_client_ca = "/etc/kiln/clients-ca.pem";
  EXPECT_TRUE(ValidateConfig(config).ok());
  config.tls_key.clear();
  EXPECT_NE(ValidateConfig(config).message().find("tls_key"), absl::string_view::npos);
  config.tls_cert.clear();
  EXPECT_FALSE(ValidateConfig(config).ok()) << "a client CA without TLS";

  config = DefaultConfig();
  config.tcp_listen = "127.0.0.1:7733";
  EXPECT_TRUE(ValidateConfig(config).ok()) << "loopback needs none of it";
  // Exposing the cache is never a flag away.
  EXPECT_FALSE(ParseCommandLine({"--allow-remote=true"}).ok());
}

TEST(ConfigTest, ClientTokensFileHoldsTenantsAndTokenDigests) {
  const std::string digest(64, 'a');
  absl::StatusOr<std::map<std::string, std::string>> tokens = ParseClientTokens(
      "# farm clients\nalpha " + digest + "\n\n  beta\t" + std::string(64, 'B') + "  # ci\n",
      "tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->at(digest), "alpha");
  EXPECT_EQ(tokens->at(std::string(64, 'b')), "beta");
  const std::vector<std::string> malformed = {"alpha", "alpha abc", "al/pha " + digest,
                                              "alpha " + digest + " extra"};
  for (const std::string& bad : malformed) {
    absl::StatusOr<std::map<std::string, std::string>> parsed =
        ParseClientTokens("\n" + bad, "tokens");
    EXPECT_TRUE(absl::IsInvalidArgument(parsed.status())) << bad;
    EXPECT_NE(parsed.status().message().find("tokens:2"), absl::string_view::npos)
        << parsed.status();
  }
}

TEST(ConfigTest, TcpIdleLimitAndConnectionCapHaveFarmDefaultsAndRefuseNonsense) {
  Config config = DefaultConfig();
  EXPECT_EQ(config.tcp_idle_seconds, 300);
  EXPECT_EQ(config.tcp_max_connections, 4096);
  ASSERT_TRUE(ApplyConfigText("tcp_idle_seconds = 30\ntcp_max_connections = 64\n", "k.conf", config)
                  .ok());
  EXPECT_EQ(config.tcp_idle_seconds, 30);
  EXPECT_EQ(config.tcp_max_connections, 64);
  for (const char* setting : {"tcp_idle_seconds", "tcp_max_connections"}) {
    for (const char* bad : {"0", "-5", "ten", "1.5", ""}) {
      const absl::Status status =
          ApplyConfigText(absl::StrCat(setting, " = ", bad, "\n"), "k.conf", config);
      EXPECT_TRUE(absl::IsInvalidArgument(status)) << setting << " = " << bad;
      EXPECT_NE(status.message().find(absl::StrCat("k.conf:1: ", setting, ": '", bad,
                                                   "' is not a whole number from 1")),
                absl::string_view::npos)
          << status;
    }
  }
  EXPECT_FALSE(ApplyConfigText("tcp_idle_seconds = 86401\n", "k.conf", config).ok());
  absl::StatusOr<CommandLine> parsed =
      ParseCommandLine({"--tcp-idle-seconds=5", "--tcp-max-connections", "8"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->config.tcp_idle_seconds, 5);
  EXPECT_EQ(parsed->config.tcp_max_connections, 8);
}

TEST(ConfigTest, RefusesToListenNowhere) {
  Config config = DefaultConfig();
  config.local_socket = "none";
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateConfig(config)));
}

}  // namespace
}  // namespace kiln::service
