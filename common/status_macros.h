#ifndef KILN_COMMON_STATUS_MACROS_H_
#define KILN_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Propagates a non-OK absl::Status to the caller.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    if (::absl::Status kiln_status_ = (expr);          \
        !kiln_status_.ok()) {                          \
      return kiln_status_;                             \
    }                                                  \
  } while (false)

#define KILN_CONCAT_INNER_(a, b) a##b
#define KILN_CONCAT_(a, b) KILN_CONCAT_INNER_(a, b)

// Declares or assigns `lhs` from an absl::StatusOr, returning its status on error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL_(KILN_CONCAT_(kiln_statusor_, __LINE__), lhs, expr)

#define KILN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                \
  if (!statusor.ok()) return statusor.status();          \
  lhs = std::move(statusor).value()

#endif  // KILN_COMMON_STATUS_MACROS_H_
