#ifndef KILN_SERVICE_MALFORMED_REQUESTS_H_
#define KILN_SERVICE_MALFORMED_REQUESTS_H_

// A request whose bytes do not parse as its method's request message never
// reaches a handler: gRPC 1.51's callback API then answers UNIMPLEMENTED with
// no detail (server_callback_handlers.h drops the parse error), which reads as
// "kilnd lacks this method". kilnd answers such a call INVALID_ARGUMENT,
// naming the method and the message it expected, through a server interceptor:
// it sees the request arrive unparsed (a null message after POST_RECV_MESSAGE)
// and rewrites the status as the call finishes. One place for every method of
// every service, including ones added later; the handlers stay as generated.

#include <string>

#include "absl/strings/string_view.h"
#include "grpcpp/server_builder.h"

namespace kiln::service {

// What a call to `method` ("/kiln.v1.Kiln/Put") whose request did not parse is
// told: the method, the message it expects (when the method is one of the
// protobuf services linked in), and the likely cause and fix.
std::string MalformedRequestMessage(absl::string_view method);

// Makes the server `builder` builds answer calls whose request does not parse
// with INVALID_ARGUMENT and MalformedRequestMessage. Replaces any interceptors
// set on `builder` before.
void AnswerMalformedRequestsWithInvalidArgument(grpc::ServerBuilder& builder);

}  // namespace kiln::service

#endif  // KILN_SERVICE_MALFORMED_REQUESTS_H_
