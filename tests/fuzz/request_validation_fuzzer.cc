// Feeds kilnd's request checks (service/request_validation.h) the requests a
// client may send: the first byte picks the RPC, the rest is its request
// message as protobuf's wire format (what gRPC hands kilnd). A message
// protobuf cannot parse is skipped, as gRPC refuses it before kilnd; a
// refusal must be INVALID_ARGUMENT, as the header promises. Traps otherwise.
// A PutMany's entries go through ValidatePut too, as kilnd checks them.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "google/protobuf/stubs/logging.h"
#include "kiln/v1/kiln.pb.h"
#include "service/request_validation.h"

namespace {

namespace v1 = kiln::v1;
namespace service = kiln::service;

void Check(const absl::Status& status, const char* rpc) {
  if (status.ok() || absl::IsInvalidArgument(status)) return;
  std::fprintf(stderr, "request_validation_fuzzer: %s: %s, not INVALID_ARGUMENT\n", rpc,
               status.ToString().c_str());
  std::abort();
}

// Parses `data` as a `Request` and checks it with `validate`.
template <typename Request>
void Validate(const uint8_t* data, size_t size, absl::Status (*validate)(const Request&), const char* rpc) {
  Request request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  Check(validate(request), rpc);
}

absl::Status ValidatePutManyAndEntries(const v1::PutManyRequest& request) {
  RETURN_IF_ERROR(service::ValidatePutMany(request));
  for (const v1::PutRequest& entry : request.entries()) RETURN_IF_ERROR(service::ValidatePut(entry));
  return absl::OkStatus();
}

using Validator = void (*)(const uint8_t*, size_t);

// By the first byte, modulo their count.
constexpr Validator kValidators[] = {
    [](const uint8_t* d, size_t n) { Validate<v1::LookupRequest>(d, n, service::ValidateLookup, "Lookup"); },
    [](const uint8_t* d, size_t n) {
      Validate<v1::RecordHitsRequest>(d, n, service::ValidateRecordHits, "RecordHits");
    },
    [](const uint8_t* d, size_t n) { Validate<v1::PutRequest>(d, n, service::ValidatePut, "Put"); },
    [](const uint8_t* d, size_t n) { Validate<v1::PutManyRequest>(d, n, ValidatePutManyAndEntries, "PutMany"); },
    [](const uint8_t* d, size_t n) { Validate<v1::CompileRequest>(d, n, service::ValidateCompile, "Compile"); },
    [](const uint8_t* d, size_t n) {
      Validate<v1::BuildLauncherRequest>(d, n, service::ValidateBuildLauncher, "BuildLauncher");
    },
    [](const uint8_t* d, size_t n) { Validate<v1::PrewarmRequest>(d, n, service::ValidatePrewarm, "Prewarm"); },
    [](const uint8_t* d, size_t n) {
      Validate<v1::CompileInductorKernelRequest>(d, n, service::ValidateCompileInductorKernel,
                                                 "CompileInductorKernel");
    },
    [](const uint8_t* d, size_t n) {
      Validate<v1::ListEntriesRequest>(d, n, service::ValidateListEntries, "ListEntries");
    },
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // protobuf logs each string field that is not UTF-8 it parses: noise here.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  kValidators[data[0] % std::size(kValidators)](data + 1, size - 1);
  return 0;
}
