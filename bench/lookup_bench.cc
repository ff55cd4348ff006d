// Lookup-hit latency and throughput of a running kilnd over gRPC.
//
// usage: lookup_bench --endpoint TARGET --size BYTES --clients N --seconds S [--as-files 1]
// Stores one entry of the given size, then N client threads, each with its own
// connection, look it up in a loop for S seconds. Prints one line of results.
// With --as-files 1 a hit names kilnd's served files (a local client's fast
// path) and each client then reads them, as Triton reads its cache's files.

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/latency_histogram.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "kiln/client.h"
#include "kiln/v1/kiln.grpc.pb.h"

namespace {

struct Args {
  std::string endpoint;
  uint64_t size = 20 * 1024;
  int clients = 1;
  double seconds = 3;
  bool as_files = false;
};

bool ParseArgs(int argc, char** argv, Args& args) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    bool ok = true;
    if (flag == "--endpoint") {
      args.endpoint = value;
    } else if (flag == "--size") {
      ok = absl::SimpleAtoi(value, &args.size);
    } else if (flag == "--clients") {
      ok = absl::SimpleAtoi(value, &args.clients) && args.clients > 0;
    } else if (flag == "--seconds") {
      ok = absl::SimpleAtod(value, &args.seconds) && args.seconds > 0;
    } else if (flag == "--as-files") {
      ok = absl::SimpleAtob(value, &args.as_files);
    } else {
      ok = false;
    }
    if (!ok) return false;
  }
  return !args.endpoint.empty();
}

std::unique_ptr<kiln::v1::Kiln::Stub> OwnConnection(const std::string& endpoint) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(std::numeric_limits<int>::max());
  // Without this, channels to one target share a connection inside a process.
  arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return kiln::v1::Kiln::NewStub(
      grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(), arguments));
}

// The content of a hit's first blob: its data, or its served file's content.
std::string Content(const kiln::v1::Blob& blob) {
  if (blob.path().empty()) return blob.data();
  std::ifstream in(blob.path(), std::ios::binary | std::ios::ate);
  std::string content(static_cast<size_t>(std::max<std::streamoff>(in.tellg(), 0)), '\0');
  in.seekg(0);
  in.read(content.data(), static_cast<std::streamsize>(content.size()));
  return content;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!ParseArgs(argc, argv, args)) {
    std::cerr << "usage: lookup_bench --endpoint TARGET [--size BYTES] [--clients N] "
                 "[--seconds S] [--as-files 0|1]\n";
    return 2;
  }
  kiln::ClientOptions options;
  options.endpoint = args.endpoint;
  kiln::Client setup(options);
  std::string cubin(args.size, '\0');
  std::mt19937_64 random(args.size);
  std::generate(cubin.begin(), cubin.end(), [&] { return static_cast<char>(random()); });
  const std::string key = absl::StrCat("bench-", args.size);
  if (absl::Status status = setup.Put("bench", key, {{"kernel.cubin", cubin},
                                                     {"kernel.json", "{\"name\": \"kernel\"}"}});
      !status.ok()) {
    std::cerr << "lookup_bench: " << status << "\n";
    return 1;
  }

  if (args.as_files) {
    // Served files are written by the first lookup asking for them, and their
    // stamps are trusted (no hashing on use) once older than the file system's
    // time granularity allows, 2 s: measure that steady state.
    auto stub = OwnConnection(args.endpoint);
    grpc::ClientContext context;
    kiln::v1::LookupRequest request;
    request.set_namespace_("bench");
    request.set_key(key);
    request.set_as_files(true);
    kiln::v1::LookupResponse response;
    if (!stub->Lookup(&context, request, &response).ok() || !response.found()) {
      std::cerr << "lookup_bench: the entry just stored is not found\n";
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(2100));
  }

  kiln::LatencyHistogram latency;
  std::atomic<uint64_t> failures{0};
  const absl::Time stop = absl::Now() + absl::Seconds(args.seconds);
  std::vector<std::thread> clients;
  for (int c = 0; c < args.clients; ++c) {
    clients.emplace_back([&] {
      auto stub = OwnConnection(args.endpoint);
      kiln::v1::LookupRequest request;
      request.set_namespace_("bench");
      request.set_key(key);
      request.set_as_files(args.as_files);
      while (absl::Now() < stop) {
        grpc::ClientContext context;
        kiln::v1::LookupResponse response;
        const absl::Time start = absl::Now();
        const grpc::Status status = stub->Lookup(&context, request, &response);
        size_t cubin_size = 0;
        if (status.ok() && response.found()) {
          cubin_size = Content(response.entry().blobs(0)).size();
          for (int b = 1; b < response.entry().blobs_size(); ++b) {
            Content(response.entry().blobs(b));
          }
        }
        latency.Record(absl::Now() - start);
        const bool sent_bytes = cubin_size > 0 && response.entry().blobs(0).path().empty();
        if (cubin_size != args.size || (args.as_files && sent_bytes)) {
          failures.fetch_add(1);
        }
      }
    });
  }
  const absl::Time started = absl::Now();
  for (std::thread& client : clients) client.join();
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - started);
  const kiln::LatencyHistogram::Summary summary = latency.Summarize();
  std::cout << absl::StrFormat(
      "%9d B  %3d clients  %8.3f ms p50  %8.3f ms p99  %9.0f hits/s  %d failures\n", args.size,
      args.clients, absl::ToDoubleMilliseconds(summary.p50),
      absl::ToDoubleMilliseconds(summary.p99), static_cast<double>(summary.count) / elapsed,
      failures.load());
  return failures.load() == 0 ? 0 : 1;
}
