#include "service/malformed_requests.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/support/server_interceptor.h"
#include "spdlog/spdlog.h"

namespace kiln::service {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::ServerRpcInfo;

// The full name of the message `method` takes ("kiln.v1.PutRequest"), or
// empty when the method is not one of the protobuf services linked in.
std::string RequestTypeOf(absl::string_view method) {
  std::string name(absl::StripPrefix(method, "/"));
  const size_t slash = name.rfind('/');
  if (slash == std::string::npos) return "";
  name[slash] = '.';  // "kiln.v1.Kiln/Put" is the descriptor pool's "kiln.v1.Kiln.Put"
  const google::protobuf::MethodDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(name);
  return descriptor == nullptr ? "" : descriptor->input_type()->full_name();
}

class MalformedRequestInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit MalformedRequestInterceptor(const ServerRpcInfo& info) : method_(info.method()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      request_unparsed_ = true;
    }
    // Whatever gRPC answers then (UNIMPLEMENTED in 1.51), no handler has run.
    if (request_unparsed_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const std::string message = MalformedRequestMessage(method_);
      spdlog::debug("{} refused: {}", method_, message);
      methods->ModifySendStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  bool request_unparsed_ = false;
};

class MalformedRequestInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(ServerRpcInfo* info) override {
    // Only a call with a single request parses it before its handler runs; a
    // streaming request's reads also end with no message at the stream's end.
    const ServerRpcInfo::Type type = info->type();
    if (type != ServerRpcInfo::Type::UNARY && type != ServerRpcInfo::Type::SERVER_STREAMING) {
      return nullptr;
    }
    return new MalformedRequestInterceptor(*info);
  }
};

}  // namespace

std::string MalformedRequestMessage(absl::string_view method) {
  const absl::string_view name = absl::StripPrefix(method, "/");
  const std::string type = RequestTypeOf(method);
  return absl::StrFormat(
      "the request to %s does not parse as %s; do the client's and kilnd's versions of the "
      "kiln.v1 API differ? use a client of kilnd %s's release",
      name, type.empty() ? "its request message" : absl::StrCat("a ", type), KILN_VERSION);
}

void AnswerMalformedRequestsWithInvalidArgument(grpc::ServerBuilder& builder) {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(std::make_unique<MalformedRequestInterceptorFactory>());
  builder.experimental().SetInterceptorCreators(std::move(creators));
}

}  // namespace kiln::service
