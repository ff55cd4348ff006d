#ifndef KILN_SERVICE_REQUEST_VALIDATION_H_
#define KILN_SERVICE_REQUEST_VALIDATION_H_

// Checks of client-supplied fields. Each failure is INVALID_ARGUMENT naming the
// field, what was wrong and what is accepted.

#include "absl/status/status.h"
#include "kiln/v1/kiln.pb.h"

namespace kiln::service {

absl::Status ValidateLookup(const v1::LookupRequest& request);
absl::Status ValidateRecordHits(const v1::RecordHitsRequest& request);
absl::Status ValidatePut(const v1::PutRequest& request);
// The call as a whole; each entry is checked by ValidatePut.
absl::Status ValidatePutMany(const v1::PutManyRequest& request);
absl::Status ValidateCompile(const v1::CompileRequest& request);
absl::Status ValidateBuildLauncher(const v1::BuildLauncherRequest& request);
absl::Status ValidatePrewarm(const v1::PrewarmRequest& request);
absl::Status ValidateCompileInductorKernel(const v1::CompileInductorKernelRequest& request);
absl::Status ValidateListEntries(const v1::ListEntriesRequest& request);

}  // namespace kiln::service

#endif  // KILN_SERVICE_REQUEST_VALIDATION_H_
