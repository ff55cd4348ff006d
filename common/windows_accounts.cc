#include "common/windows_accounts.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "common/windows_api.h"
#include "common/windows_text.h"

namespace kiln {
namespace {

// The names CreateService accepts for the built-in accounts, in any language.
const char* WellKnownSid(const std::string& account) {
  const std::string name = absl::AsciiStrToLower(account);
  if (name == "nt authority\\localservice" || name == "nt authority\\local service" ||
      name == "localservice") {
    return "S-1-5-19";
  }
  if (name == "nt authority\\networkservice" || name == "nt authority\\network service" ||
      name == "networkservice") {
    return "S-1-5-20";
  }
  if (name == "localsystem" || name == "nt authority\\system") return "S-1-5-18";
  return nullptr;
}

absl::StatusOr<std::vector<unsigned char>> ParseSid(const std::string& text) {
  PSID sid = nullptr;
  const std::wstring wide = Widen(text);
  if (!ConvertStringSidToSidW(wide.c_str(), &sid)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s' is not a SID (%s)", text, LastErrorText()));
  }
  const auto* bytes = static_cast<unsigned char*>(sid);
  std::vector<unsigned char> result(bytes, bytes + GetLengthSid(sid));
  LocalFree(sid);
  return result;
}

}  // namespace

absl::StatusOr<std::vector<unsigned char>> AccountSid(const std::string& account) {
  if (const char* well_known = WellKnownSid(account)) return ParseSid(well_known);
  if (absl::StartsWith(account, "S-1-")) return ParseSid(account);
  DWORD sid_size = 0;
  DWORD domain_size = 0;
  SID_NAME_USE use;
  const std::wstring name = Widen(account);
  LookupAccountNameW(nullptr, name.c_str(), nullptr, &sid_size, nullptr, &domain_size, &use);
  std::vector<unsigned char> sid(sid_size);
  std::wstring domain(domain_size, L'\0');
  if (sid_size == 0 || !LookupAccountNameW(nullptr, name.c_str(), sid.data(), &sid_size,
                                           domain.data(), &domain_size, &use)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "unknown account '%s' (%s); write it as DOMAIN\\user or COMPUTER\\user", account,
        LastErrorText()));
  }
  return sid;
}

}  // namespace kiln
