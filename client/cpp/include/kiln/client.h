#ifndef KILN_CLIENT_CLIENT_H_
#define KILN_CLIENT_CLIENT_H_

// A synchronous client of kilnd. Every call has a deadline; a call that cannot
// reach the service returns UNAVAILABLE naming the endpoint.

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kiln/v1/kiln.grpc.pb.h"

namespace kiln {

struct ClientOptions {
  // A gRPC target; empty means $KILN_ENDPOINT, else the per-user local socket.
  std::string endpoint;
  absl::Duration timeout = absl::Seconds(30);
};

// The endpoint a client uses when none is configured.
std::string DefaultEndpoint();

class Client {
 public:
  explicit Client(ClientOptions options);

  const std::string& endpoint() const { return endpoint_; }

  // OK when the service reports SERVING; UNAVAILABLE otherwise.
  absl::Status CheckHealth();
  // Polls CheckHealth() until it succeeds or `deadline` passes.
  absl::Status WaitUntilServing(absl::Duration deadline);

  // Stores named artifacts under (ns, key).
  absl::Status Put(absl::string_view ns, absl::string_view key,
                   const std::vector<std::pair<std::string, std::string>>& named_blobs);
  // The entry, or nullopt on a miss.
  absl::StatusOr<std::optional<v1::CacheEntry>> Lookup(absl::string_view ns,
                                                       absl::string_view key);
  absl::StatusOr<v1::GetStatsResponse> Stats();

 private:
  std::unique_ptr<grpc::ClientContext> NewContext() const;
  absl::Status FromGrpc(const grpc::Status& status, absl::string_view method) const;

  std::string endpoint_;
  absl::Duration timeout_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Kiln::Stub> stub_;
};

// Human-readable stats, as printed by `kilnd --stats` and `kiln stats`.
std::string FormatStats(const v1::GetStatsResponse& stats);
// The same as one JSON object.
std::string FormatStatsJson(const v1::GetStatsResponse& stats);

}  // namespace kiln

#endif  // KILN_CLIENT_CLIENT_H_
