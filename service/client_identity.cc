#include "service/client_identity.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/fmt_absl.h"
#include "common/sha256.h"
#include "spdlog/spdlog.h"

namespace kiln::service {

bool IsValidTenantName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::map<std::string, std::string>> ParseClientTokens(absl::string_view text,
                                                                     absl::string_view origin) {
  std::map<std::string, std::string> tenant_of_digest;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const bool digest_ok = fields.size() == 2 && fields[1].size() == 64 &&
                           std::all_of(fields[1].begin(), fields[1].end(), [](char c) {
                             return absl::ascii_isxdigit(static_cast<unsigned char>(c));
                           });
    if (!digest_ok || !IsValidTenantName(fields[0])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s:%d: expected 'TENANT SHA256-HEX' (a tenant of [A-Za-z0-9._-], then the SHA-256 of "
          "its token, e.g. from `printf %%s TOKEN | sha256sum`)",
          origin, line_number));
    }
    tenant_of_digest[absl::AsciiStrToLower(fields[1])] = std::string(fields[0]);
  }
  return tenant_of_digest;
}

namespace {

absl::StatusOr<std::map<std::string, std::string>> ReadClientTokens(
    const std::filesystem::path& path) {
  absl::StatusOr<std::string> text = platform::ReadWholeFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot read client_tokens file %s; check the path", path.string()));
  }
  return ParseClientTokens(*text, path.string());
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClientTokens>> ClientTokens::Load(std::filesystem::path path) {
  std::unique_ptr<ClientTokens> tokens(new ClientTokens(std::move(path)));
  absl::StatusOr<platform::FileStamp> stamp = platform::StampOf(tokens->path_);
  absl::StatusOr<std::map<std::string, std::string>> parsed = ReadClientTokens(tokens->path_);
  if (!parsed.ok()) return parsed.status();
  tokens->tenant_of_digest_ = *std::move(parsed);
  if (stamp.ok()) tokens->stamp_ = *stamp;
  tokens->checked_ = absl::Now();
  return tokens;
}

void ClientTokens::RefreshLocked() {
  const absl::Time now = absl::Now();
  if (now - checked_ < absl::Seconds(1)) return;
  checked_ = now;
  absl::StatusOr<platform::FileStamp> stamp = platform::StampOf(path_);
  if (stamp.ok() && stamp_.has_value() && *stamp == *stamp_) return;
  absl::StatusOr<std::map<std::string, std::string>> parsed = ReadClientTokens(path_);
  if (!parsed.ok()) {
    spdlog::error("client_tokens: keeping the tokens last read: {}", parsed.status().message());
    return;
  }
  tenant_of_digest_ = *std::move(parsed);
  stamp_ = stamp.ok() ? std::optional(*stamp) : std::nullopt;
  spdlog::info("client_tokens: reread {} ({} tokens)", path_.string(), tenant_of_digest_.size());
}

absl::StatusOr<std::string> ClientTokens::TenantOf(absl::string_view token) {
  // Only the digest is compared, so the lookup's timing tells nothing of the token.
  const std::string digest = DigestHex(DigestBytes(Sha256(token)));
  std::lock_guard lock(mutex_);
  RefreshLocked();
  const auto found = tenant_of_digest_.find(digest);
  if (found == tenant_of_digest_.end()) {
    return absl::UnauthenticatedError(
        "kilnd does not know this token (revoked, mistyped, or for another kilnd); ask the farm's "
        "admin for one, and check KILN_TOKEN_FILE");
  }
  return found->second;
}

}  // namespace kiln::service
