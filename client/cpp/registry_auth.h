#ifndef KILN_CLIENT_CPP_REGISTRY_AUTH_H_
#define KILN_CLIENT_CPP_REGISTRY_AUTH_H_

// Logging in to an OCI registry as docker does (`kiln push`, `kiln pull`):
//   - the login docker keeps for the registry in $DOCKER_CONFIG/config.json
//     (or ~/.docker/config.json): its credential helper (credHelpers, then
//     credsStore, through `docker-credential-NAME get`), else its "auths"
//     entry; or a bearer token of the caller's own in $KILN_REGISTRY_TOKEN;
//   - a registry's challenge (WWW-Authenticate, RFC 7235) answered with Basic
//     or with a token from its token service, as the distribution token spec
//     says: every scope the challenge names and the operation's own asked for
//     at once, anonymously where there is no login, each token kept until it
//     expires;
//   - a refusal that says which of three things happened: no login was found,
//     the login was refused, or the login may not do what was asked.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kiln {

struct AuthChallenge {
  std::string scheme;                         // lower case: "bearer", "basic"
  std::map<std::string, std::string> params;  // names in lower case, quoted values unquoted
};

// The challenges of a WWW-Authenticate header. Quoted values keep their commas
// and spaces (a scope of "repository:team/kernels:pull,push"); malformed text
// ends the parse with what was read so far.
std::vector<AuthChallenge> ParseChallenges(absl::string_view header);

// A login docker keeps for a registry.
struct DockerLogin {
  std::string username;  // "<token>": `secret` is an identity (refresh) token
  std::string secret;
  std::string source;  // where it came from, for messages
};

// The login for `registry` (HOST[:PORT]); nullopt when there is none.
// FAILED_PRECONDITION when config.json names a credential helper that cannot
// be run or fails, saying which and why.
absl::StatusOr<std::optional<DockerLogin>> FindDockerLogin(const std::string& registry);

// `text` percent-encoded for a URL's query (RFC 3986's unreserved characters kept).
std::string UrlEncodeComponent(absl::string_view text);

// A request to a token service, and its answer: RegistryAuth's caller sends it.
struct TokenRequest {
  std::string method;  // GET, or POST for an OAuth2 refresh token
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};
struct TokenAnswer {
  int status = 0;
  std::string body;
};

// A token service's answer to a request, when it granted one (status 200).
struct IssuedToken {
  std::string value;
  // The distribution token spec's default for a token that states none, and
  // the least docker takes; at most a day.
  absl::Duration lifetime = absl::Seconds(60);
};
// The token in `body`: its "token", else its "access_token" (OAuth2's
// name), and its "expires_in". UNAVAILABLE naming `registry` when `body`
// is not a JSON object or holds no token that fits on one header line.
absl::StatusOr<IssuedToken> ParseTokenAnswer(absl::string_view body, absl::string_view registry);

// The Authorization header of one operation (pull, or push) on one repository.
class RegistryAuth {
 public:
  using Sender = std::function<absl::StatusOr<TokenAnswer>(const TokenRequest&)>;

  // `actions`: "pull", or "pull,push".
  RegistryAuth(std::string registry, std::string repository, std::string actions, Sender send);

  // What to send as Authorization now; empty for nothing.
  std::string Authorization();
  // After a 401: answers its WWW-Authenticate header, so that the request can
  // be sent again with Authorization().
  absl::Status Answer(absl::string_view challenge_header);
  // What to say when the request sent again after Answer was refused too
  // (`status` 401 or 403; `challenge_header` its WWW-Authenticate, if any).
  absl::Status Refusal(int status, absl::string_view challenge_header);

 private:
  struct Token {
    std::string value;
    absl::Time expires;
  };
  absl::Status LoadLogin();
  absl::StatusOr<Token> FetchToken(const AuthChallenge& challenge,
                                   const std::vector<std::string>& scopes);
  std::string NoLogin() const;
  std::string Refused() const;

  const std::string registry_;
  const std::string repository_;
  const std::string actions_;
  const Sender send_;
  std::string caller_token_;  // $KILN_REGISTRY_TOKEN
  bool login_loaded_ = false;
  std::optional<DockerLogin> login_;
  std::string basic_;  // "Basic ..." once a challenge asked for it
  std::map<std::string, Token> tokens_;  // by their scopes, space-separated and sorted
  std::string current_scopes_;           // the key of the token in use
};

}  // namespace kiln

#endif  // KILN_CLIENT_CPP_REGISTRY_AUTH_H_
