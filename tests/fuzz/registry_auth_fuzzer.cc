// Feeds what a registry's authentication hands kiln (client/cpp/registry_auth.h):
// the first byte picks the reader, the rest is its text.
//   0: a WWW-Authenticate header, ParseChallenges: schemes and parameter
//      names come back non-empty and in lower case;
//   1: a token service's answer, ParseTokenAnswer: refused with UNAVAILABLE,
//      or a token on one line lasting from a minute to a day;
//   2: a challenge and the token service's answer to it, split at the first
//      NUL, through RegistryAuth::Answer, Authorization and Refusal with a
//      token service that is a function here (no network, no docker login:
//      DOCKER_CONFIG names a directory that does not exist).
// Traps where one does otherwise.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/cpp/registry_auth.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "registry_auth_fuzzer: %s: %s\n", what, detail.c_str());
  std::abort();
}

void Challenges(absl::string_view header) {
  for (const kiln::AuthChallenge& challenge : kiln::ParseChallenges(header)) {
    if (challenge.scheme.empty() || challenge.scheme != absl::AsciiStrToLower(challenge.scheme)) {
      Fail("a scheme that is empty or not lower case", challenge.scheme);
    }
    for (const auto& [name, value] : challenge.params) {
      if (name.empty() || name != absl::AsciiStrToLower(name)) Fail("a parameter name that is empty or not lower case", name);
    }
  }
}

void TokenAnswer(absl::string_view body) {
  const absl::StatusOr<kiln::IssuedToken> token = kiln::ParseTokenAnswer(body, "registry.example");
  if (!token.ok()) {
    if (!absl::IsUnavailable(token.status())) Fail("an unexpected refusal", token.status().ToString());
    return;
  }
  if (token->value.empty() || absl::StrContains(token->value, '\n') || absl::StrContains(token->value, '\r')) {
    Fail("a token that does not fit a header line", token->value);
  }
  if (token->lifetime < absl::Seconds(60) || token->lifetime > absl::Hours(24)) {
    Fail("a lifetime out of range", absl::FormatDuration(token->lifetime));
  }
}

void Exchange(absl::string_view input) {
  const size_t nul = input.find('\0');
  const absl::string_view header = input.substr(0, nul);
  const absl::string_view answer = nul == absl::string_view::npos ? "" : input.substr(nul + 1);
  kiln::RegistryAuth auth("registry.example", "team/kernels", "pull",
                          [answer](const kiln::TokenRequest&) -> absl::StatusOr<kiln::TokenAnswer> {
                            return kiln::TokenAnswer{200, std::string(answer)};
                          });
  if (auth.Answer(header).ok()) {
    const std::string authorization = auth.Authorization();
    if (absl::StrContains(authorization, '\n') || absl::StrContains(authorization, '\r')) {
      Fail("an Authorization header of more than one line", authorization);
    }
  }
  if (auth.Refusal(401, header).ok()) Fail("a refusal that is OK", std::string(header));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // No login of this machine's is read, nor a token of the caller's.
  setenv("DOCKER_CONFIG", "/nonexistent/kiln-fuzz-docker-config", 1);
  unsetenv("KILN_REGISTRY_TOKEN");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: Challenges(text); break;
    case 1: TokenAnswer(text); break;
    case 2: Exchange(text); break;
  }
  return 0;
}
