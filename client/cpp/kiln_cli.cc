// kiln: command-line client of kilnd.
//
// Exit codes a script can rely on:
//   0 success, 1 cache miss (get), 2 bad usage or input, 3 kilnd unreachable,
//   4 any other error reported by kilnd.

#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "kiln/client.h"

namespace {

namespace fs = std::filesystem;

enum ExitCode { kOk = 0, kMiss = 1, kUsage = 2, kUnreachable = 3, kServiceError = 4 };

constexpr const char* kUsageText =
    "usage: kiln [--endpoint TARGET] COMMAND ...\n"
    "  health [--wait SECONDS]          check that kilnd is serving\n"
    "  put NAMESPACE KEY NAME=FILE ...  store files as one cache entry\n"
    "  get NAMESPACE KEY [-o DIR]       fetch an entry; writes its blobs into DIR\n"
    "  stats [--json]                   print kilnd's statistics\n"
    "Endpoint: --endpoint, else $KILN_ENDPOINT, else the per-user local socket.\n"
    "Exit codes: 0 ok, 1 miss, 2 usage, 3 kilnd unreachable, 4 service error.\n";

int Fail(const absl::Status& status) {
  std::cerr << "kiln: " << status.message() << "\n";
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) return kUnreachable;
  if (absl::IsInvalidArgument(status)) return kUsage;
  return kServiceError;
}

int Usage(absl::string_view problem) {
  std::cerr << "kiln: " << problem << "\n" << kUsageText;
  return kUsage;
}

int Health(kiln::Client& client, const std::vector<std::string>& args) {
  double wait_seconds = 0;
  if (args.size() == 2 && args[0] == "--wait") {
    if (!absl::SimpleAtod(args[1], &wait_seconds) || wait_seconds < 0) {
      return Usage("--wait needs a number of seconds");
    }
  } else if (!args.empty()) {
    return Usage("health takes only --wait SECONDS");
  }
  const absl::Status status = wait_seconds > 0
                                  ? client.WaitUntilServing(absl::Seconds(wait_seconds))
                                  : client.CheckHealth();
  if (!status.ok()) return Fail(status);
  std::cout << "SERVING " << client.endpoint() << "\n";
  return kOk;
}

int Put(kiln::Client& client, const std::vector<std::string>& args) {
  if (args.size() < 3) return Usage("put needs NAMESPACE KEY and at least one NAME=FILE");
  std::vector<std::pair<std::string, std::string>> blobs;
  for (size_t i = 2; i < args.size(); ++i) {
    const size_t equals = args[i].find('=');
    if (equals == std::string::npos || equals == 0) {
      return Usage(absl::StrFormat("'%s' is not NAME=FILE", args[i]));
    }
    const std::string path = args[i].substr(equals + 1);
    std::ifstream in(path, std::ios::binary);
    if (!in) return Usage(absl::StrFormat("cannot read %s", path));
    blobs.emplace_back(args[i].substr(0, equals),
                       std::string(std::istreambuf_iterator<char>(in), {}));
  }
  if (absl::Status status = client.Put(args[0], args[1], blobs); !status.ok()) {
    return Fail(status);
  }
  std::cout << "stored " << blobs.size() << " blob(s) under " << args[0] << "/" << args[1] << "\n";
  return kOk;
}

int Get(kiln::Client& client, const std::vector<std::string>& args) {
  if (args.size() != 2 && !(args.size() == 4 && args[2] == "-o")) {
    return Usage("get needs NAMESPACE KEY [-o DIR]");
  }
  absl::StatusOr<std::optional<kiln::v1::CacheEntry>> entry = client.Lookup(args[0], args[1]);
  if (!entry.ok()) return Fail(entry.status());
  if (!entry->has_value()) {
    std::cerr << "kiln: miss: no entry " << args[0] << "/" << args[1] << "\n";
    return kMiss;
  }
  for (const kiln::v1::Blob& blob : (*entry)->blobs()) {
    std::cout << absl::StrFormat("%-40s %10d bytes\n", blob.name(), blob.size());
    if (args.size() != 4) continue;
    std::error_code error;
    fs::create_directories(args[3], error);
    std::ofstream out(fs::path(args[3]) / blob.name(), std::ios::binary);
    out << blob.data();
    if (!out) {
      std::cerr << "kiln: cannot write " << (fs::path(args[3]) / blob.name()).string() << "\n";
      return kUsage;
    }
  }
  return kOk;
}

int Stats(kiln::Client& client, const std::vector<std::string>& args) {
  const bool json = args.size() == 1 && args[0] == "--json";
  if (!args.empty() && !json) return Usage("stats takes only --json");
  absl::StatusOr<kiln::v1::GetStatsResponse> stats = client.Stats();
  if (!stats.ok()) return Fail(stats.status());
  std::cout << (json ? kiln::FormatStatsJson(*stats) : kiln::FormatStats(*stats));
  return kOk;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  kiln::ClientOptions options;
  if (args.size() >= 2 && args[0] == "--endpoint") {
    options.endpoint = args[1];
    args.erase(args.begin(), args.begin() + 2);
  }
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kUsageText;
    return args.empty() ? kUsage : kOk;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  kiln::Client client(options);
  if (command == "health") return Health(client, args);
  if (command == "put") return Put(client, args);
  if (command == "get") return Get(client, args);
  if (command == "stats") return Stats(client, args);
  return Usage(absl::StrFormat("unknown command '%s'", command));
}
