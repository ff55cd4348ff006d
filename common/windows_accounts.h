#ifndef KILN_COMMON_WINDOWS_ACCOUNTS_H_
#define KILN_COMMON_WINDOWS_ACCOUNTS_H_

// Windows only: account names to SIDs, for ACLs.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln {

// The SID of `account`, as bytes. The built-in service accounts are known by
// their English names on every Windows (whose localized names differ:
// "NT-AUTORITÄT\LOKALER DIENST"), "S-1-5-..." strings are taken as SIDs, and
// anything else is looked up ("DOMAIN\user"). INVALID_ARGUMENT names an
// unknown account.
absl::StatusOr<std::vector<unsigned char>> AccountSid(const std::string& account);

}  // namespace kiln

#endif  // KILN_COMMON_WINDOWS_ACCOUNTS_H_
