#include "registry_auth.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "json_object.h"
#include "common/platform.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "google/protobuf/struct.pb.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// What a credential helper may take to answer, and write.
constexpr absl::Duration kHelperTimeout = absl::Seconds(30);
constexpr size_t kMaxHelperAnswer = 64 << 10;
// A token is not used this close to its expiry: a request may take that long to arrive.
constexpr absl::Duration kExpiryMargin = absl::Seconds(10);

// RFC 7230's tchar: what a scheme, a parameter's name or an unquoted value is made of.
bool IsTokenChar(char c) {
  return absl::ascii_isalnum(c) || absl::StrContains("!#$%&'*+-.^_`|~/:=", c);
}

class ChallengeReader {
 public:
  explicit ChallengeReader(absl::string_view text) : rest_(text) {}

  std::vector<AuthChallenge> ReadAll() {
    std::vector<AuthChallenge> challenges;
    SkipSeparators();
    while (!rest_.empty()) {
      std::string scheme = Token(/*with_equals=*/false);
      if (scheme.empty()) break;  // malformed: what was read stands
      AuthChallenge challenge{absl::AsciiStrToLower(scheme), {}};
      SkipSpaces();
      // Parameters until one that is not name=value: that word is the next scheme.
      while (!rest_.empty()) {
        const absl::string_view before = rest_;
        std::string name = Token(/*with_equals=*/false);
        SkipSpaces();
        if (name.empty() || !absl::ConsumePrefix(&rest_, "=")) {
          rest_ = before;
          break;
        }
        SkipSpaces();
        std::optional<std::string> value = Value();
        if (!value.has_value()) {
          rest_ = {};
          break;
        }
        challenge.params[absl::AsciiStrToLower(name)] = *std::move(value);
        SkipSeparators();
      }
      challenges.push_back(std::move(challenge));
      SkipSeparators();
    }
    return challenges;
  }

 private:
  void SkipSpaces() {
    while (!rest_.empty() && (rest_.front() == ' ' || rest_.front() == '\t')) rest_.remove_prefix(1);
  }
  void SkipSeparators() {
    while (!rest_.empty() && (rest_.front() == ' ' || rest_.front() == '\t' || rest_.front() == ',')) {
      rest_.remove_prefix(1);
    }
  }
  std::string Token(bool with_equals) {
    size_t length = 0;
    while (length < rest_.size() && IsTokenChar(rest_[length]) && (with_equals || rest_[length] != '=')) {
      ++length;
    }
    std::string token(rest_.substr(0, length));
    rest_.remove_prefix(length);
    return token;
  }
  // A quoted string (its backslash escapes undone) or a token; nullopt when
  // a quote is never closed.
  std::optional<std::string> Value() {
    if (!absl::ConsumePrefix(&rest_, "\"")) return Token(/*with_equals=*/true);
    std::string value;
    while (!rest_.empty()) {
      const char c = rest_.front();
      rest_.remove_prefix(1);
      if (c == '"') return value;
      if (c == '\\' && !rest_.empty()) {
        value += rest_.front();
        rest_.remove_prefix(1);
      } else {
        value += c;
      }
    }
    return std::nullopt;
  }

  absl::string_view rest_;
};

fs::path DockerConfigFile() {
  if (const char* dir = std::getenv("DOCKER_CONFIG"); dir != nullptr && *dir != '\0') {
    return fs::path(dir) / "config.json";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return fs::path(home) / ".docker" / "config.json";
  }
  if (const char* profile = std::getenv("USERPROFILE"); profile != nullptr && *profile != '\0') {
    return fs::path(profile) / ".docker" / "config.json";
  }
  return {};
}

// Docker Hub's logins are kept under its old index address.
bool IsDockerHub(absl::string_view registry) {
  return registry == "docker.io" || registry == "index.docker.io" || registry == "registry-1.docker.io";
}
constexpr absl::string_view kDockerHubKey = "https://index.docker.io/v1/";

// Whether a config.json key ("ghcr.io", "https://ghcr.io/v2/", ...) names `registry`.
bool KeyNames(absl::string_view key, absl::string_view registry) {
  if (IsDockerHub(registry)) return key == kDockerHubKey || IsDockerHub(key);
  absl::ConsumePrefix(&key, "https://");
  absl::ConsumePrefix(&key, "http://");
  return key.substr(0, key.find('/')) == registry;
}

// `docker-credential-NAME get`'s login for `server`, as the credential helper protocol has it.
absl::StatusOr<std::optional<DockerLogin>> AskHelper(const std::string& name, const std::string& server) {
  const std::string program = absl::StrCat("docker-credential-", name);
  absl::StatusOr<std::unique_ptr<Subprocess>> helper = Subprocess::Spawn({program, "get"});
  if (!helper.ok()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s names the credential helper '%s', but %s cannot be run (%s): install it or put it "
        "on PATH, or remove it from the file",
        DockerConfigFile().string(), name, program, helper.status().message()));
  }
  (void)(*helper)->Write(server);  // a helper that exits unread says why on stderr
  (*helper)->CloseStdin();
  std::string answer;
  const absl::Time deadline = absl::Now() + kHelperTimeout;
  while (answer.size() <= kMaxHelperAnswer) {
    absl::StatusOr<std::string> some = (*helper)->ReadSome(kMaxHelperAnswer, deadline);
    if (!some.ok()) {
      (*helper)->Kill();
      (*helper)->Wait();
      return absl::FailedPreconditionError(absl::StrFormat(
          "the credential helper %s did not answer for %s within %s", program, server,
          absl::FormatDuration(kHelperTimeout)));
    }
    if (some->empty()) break;
    answer += *some;
  }
  if (answer.size() > kMaxHelperAnswer) {
    (*helper)->Kill();
    (*helper)->Wait();
    return absl::FailedPreconditionError(
        absl::StrFormat("the credential helper %s wrote more than %d bytes", program, kMaxHelperAnswer));
  }
  const std::string ended = (*helper)->Wait();
  if (!(*helper)->Succeeded()) {
    const std::string said = absl::StrCat(answer, (*helper)->StderrTail());
    // The protocol's answer for a server it keeps nothing for.
    if (absl::StrContains(absl::AsciiStrToLower(said), "credentials not found")) return std::nullopt;
    return absl::FailedPreconditionError(absl::StrFormat(
        "the credential helper %s failed for %s (%s): %s", program, server, ended,
        absl::StripAsciiWhitespace(said)));
  }
  absl::StatusOr<google::protobuf::Struct> login = ParseJsonObject(answer, absl::StrCat(program, "'s answer"));
  if (!login.ok()) return login.status();
  DockerLogin found{StringField(*login, "Username"), StringField(*login, "Secret"),
                    absl::StrCat("the credential helper ", program)};
  if (found.secret.empty()) return std::nullopt;
  return found;
}

// The scopes `own` and `named` (space-separated) as one per resource, each
// with the actions either asks for ("repository:team/kernels:pull,push"),
// sorted. A scope that is not TYPE:NAME:ACTIONS is passed on as it is.
std::vector<std::string> MergedScopes(absl::string_view own, absl::string_view named) {
  std::map<std::string, std::set<std::string>> actions_by_resource;
  std::set<std::string> others;
  for (absl::string_view scope : absl::StrSplit(absl::StrCat(own, " ", named), ' ', absl::SkipEmpty())) {
    const size_t last_colon = scope.rfind(':');
    if (last_colon == absl::string_view::npos || scope.find(':') == last_colon) {
      others.emplace(scope);
      continue;
    }
    std::set<std::string>& actions = actions_by_resource[std::string(scope.substr(0, last_colon))];
    for (absl::string_view action : absl::StrSplit(scope.substr(last_colon + 1), ',', absl::SkipEmpty())) {
      actions.emplace(action);
    }
  }
  std::vector<std::string> scopes(others.begin(), others.end());
  for (const auto& [resource, actions] : actions_by_resource) {
    scopes.push_back(absl::StrCat(resource, ":", absl::StrJoin(actions, ",")));
  }
  std::sort(scopes.begin(), scopes.end());
  return scopes;
}

}  // namespace

std::vector<AuthChallenge> ParseChallenges(absl::string_view header) {
  return ChallengeReader(header).ReadAll();
}

absl::StatusOr<IssuedToken> ParseTokenAnswer(absl::string_view body, absl::string_view registry) {
  absl::StatusOr<google::protobuf::Struct> parsed = ParseJsonObject(body, "the token service's answer");
  if (!parsed.ok()) return absl::UnavailableError(absl::StrCat(registry, ": ", parsed.status().message()));
  IssuedToken token;
  token.value = StringField(*parsed, "token");
  if (token.value.empty()) token.value = StringField(*parsed, "access_token");
  if (token.value.empty() || token.value.find_first_of("\r\n") != std::string::npos) {
    return absl::UnavailableError(absl::StrFormat("%s's token service answered with no usable token", registry));
  }
  // Docker's floor: a shorter lifetime (a few seconds, or 1e-300) would have
  // the token dropped as expiring before it was ever sent (kExpiryMargin).
  if (const google::protobuf::Value* expires_in = FieldOf(*parsed, "expires_in");
      expires_in != nullptr && expires_in->kind_case() == google::protobuf::Value::kNumberValue &&
      std::isfinite(expires_in->number_value()) && expires_in->number_value() > 0) {
    token.lifetime = absl::Seconds(std::clamp(expires_in->number_value(), 60.0, 86400.0));
  }
  return token;
}

std::string UrlEncodeComponent(absl::string_view text) {
  std::string out;
  for (char c : text) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += c;
    } else {
      absl::StrAppendFormat(&out, "%%%02X", static_cast<unsigned char>(c));
    }
  }
  return out;
}

absl::StatusOr<std::optional<DockerLogin>> FindDockerLogin(const std::string& registry) {
  const fs::path config = DockerConfigFile();
  if (config.empty()) return std::nullopt;
  absl::StatusOr<std::string> text = platform::ReadWholeFile(config);
  if (!text.ok()) return std::nullopt;  // no login kept
  absl::StatusOr<google::protobuf::Struct> parsed = ParseJsonObject(*text, config.string());
  if (!parsed.ok()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not a JSON object: mend it, or log in again (docker login %s)", config.string(), registry));
  }
  const std::string server = IsDockerHub(registry) ? std::string(kDockerHubKey) : registry;
  // docker's order: a helper for this registry, then the one for all of them.
  std::string helper;
  if (const google::protobuf::Value* helpers = FieldOf(*parsed, "credHelpers"); helpers != nullptr) {
    for (const auto& [key, name] : helpers->struct_value().fields()) {
      if (KeyNames(key, registry) && name.kind_case() == google::protobuf::Value::kStringValue) {
        helper = name.string_value();
      }
    }
  }
  if (helper.empty()) helper = StringField(*parsed, "credsStore");
  if (!helper.empty()) {
    ASSIGN_OR_RETURN(std::optional<DockerLogin> login, AskHelper(helper, server));
    if (login.has_value()) return login;
  }
  const google::protobuf::Value* auths = FieldOf(*parsed, "auths");
  if (auths == nullptr) return std::nullopt;
  for (const auto& [key, entry] : auths->struct_value().fields()) {
    if (!KeyNames(key, registry)) continue;
    const std::string source = absl::StrFormat("the login for %s in %s", key, config.string());
    if (std::string identity = StringField(entry.struct_value(), "identitytoken"); !identity.empty()) {
      return DockerLogin{"<token>", std::move(identity), source};
    }
    std::string decoded;
    if (!absl::Base64Unescape(StringField(entry.struct_value(), "auth"), &decoded)) continue;
    const size_t colon = decoded.find(':');
    if (colon == std::string::npos) continue;
    return DockerLogin{decoded.substr(0, colon), decoded.substr(colon + 1), source};
  }
  return std::nullopt;
}

RegistryAuth::RegistryAuth(std::string registry, std::string repository, std::string actions, Sender send)
    : registry_(std::move(registry)),
      repository_(std::move(repository)),
      actions_(std::move(actions)),
      send_(std::move(send)) {
  if (const char* token = std::getenv("KILN_REGISTRY_TOKEN"); token != nullptr && *token != '\0') {
    caller_token_ = token;
  }
}

std::string RegistryAuth::Authorization() {
  if (!caller_token_.empty()) return absl::StrCat("Bearer ", caller_token_);
  if (!basic_.empty()) return basic_;
  auto token = tokens_.find(current_scopes_);
  if (token == tokens_.end() || absl::Now() + kExpiryMargin >= token->second.expires) return "";
  return absl::StrCat("Bearer ", token->second.value);
}

absl::Status RegistryAuth::LoadLogin() {
  if (login_loaded_) return absl::OkStatus();
  ASSIGN_OR_RETURN(login_, FindDockerLogin(registry_));
  login_loaded_ = true;
  return absl::OkStatus();
}

std::string RegistryAuth::NoLogin() const {
  return absl::StrFormat(
      "%s asks for a login to %s %s, and none was found: run `docker login %s` (kiln reads "
      "%s: its credHelpers, credsStore and auths), or set KILN_REGISTRY_TOKEN to a bearer token",
      registry_, actions_ == "pull" ? "pull from" : "push to", repository_, registry_,
      DockerConfigFile().empty() ? "docker's config.json" : DockerConfigFile().string());
}

std::string RegistryAuth::Refused() const {
  if (!caller_token_.empty()) {
    return absl::StrFormat("%s refused the bearer token in KILN_REGISTRY_TOKEN for %s: set a current one",
                           registry_, repository_);
  }
  return absl::StrFormat("%s refused the credentials of %s (user %s) for %s: log in again (docker login %s)",
                         registry_, login_->source, login_->username, repository_, registry_);
}

absl::Status RegistryAuth::Answer(absl::string_view challenge_header) {
  if (!caller_token_.empty()) return absl::UnauthenticatedError(Refused());
  const std::vector<AuthChallenge> challenges = ParseChallenges(challenge_header);
  const auto of_scheme = [&](absl::string_view scheme) -> const AuthChallenge* {
    for (const AuthChallenge& challenge : challenges) {
      if (challenge.scheme == scheme) return &challenge;
    }
    return nullptr;
  };
  RETURN_IF_ERROR(LoadLogin());
  if (const AuthChallenge* bearer = of_scheme("bearer"); bearer != nullptr && bearer->params.contains("realm")) {
    // Every scope the challenge names, and this operation's own: a push's
    // first request (a HEAD) is challenged for pull alone, and a token of
    // that would not do for the upload after it.
    const std::vector<std::string> scopes = MergedScopes(
        absl::StrFormat("repository:%s:%s", repository_, actions_),
        bearer->params.contains("scope") ? bearer->params.at("scope") : "");
    const std::string key = absl::StrJoin(scopes, " ");
    auto cached = tokens_.find(key);
    // The token just sent is not asked for again: it was refused.
    if (cached != tokens_.end() && key != current_scopes_ && absl::Now() + kExpiryMargin < cached->second.expires) {
      current_scopes_ = key;
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(Token token, FetchToken(*bearer, scopes));
    tokens_[key] = std::move(token);
    current_scopes_ = key;
    return absl::OkStatus();
  }
  if (of_scheme("basic") != nullptr) {
    if (!login_.has_value() || login_->username == "<token>") return absl::UnauthenticatedError(NoLogin());
    basic_ = absl::StrCat("Basic ", absl::Base64Escape(absl::StrCat(login_->username, ":", login_->secret)));
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(absl::StrFormat(
      "%s asks for authentication kiln does not speak (%s)", registry_, challenge_header.substr(0, 200)));
}

absl::StatusOr<RegistryAuth::Token> RegistryAuth::FetchToken(const AuthChallenge& challenge,
                                                             const std::vector<std::string>& scopes) {
  const std::string& realm = challenge.params.at("realm");
  if (!absl::StartsWith(realm, "https://")) {
    return absl::UnauthenticatedError(absl::StrFormat(
        "%s's token service is at '%s', which is not https: kiln sends no login there", registry_, realm));
  }
  const auto service = challenge.params.find("service");
  TokenRequest request;
  request.url = realm;
  if (login_.has_value() && login_->username == "<token>") {
    // An identity token (`docker login` to a registry that hands out
    // refresh tokens): traded with the OAuth2 form of the token spec.
    request.method = "POST";
    request.headers.emplace_back("Content-Type", "application/x-www-form-urlencoded");
    request.body = absl::StrCat("grant_type=refresh_token&client_id=kiln&refresh_token=",
                                UrlEncodeComponent(login_->secret), "&scope=",
                                UrlEncodeComponent(absl::StrJoin(scopes, " ")));
    if (service != challenge.params.end()) {
      absl::StrAppend(&request.body, "&service=", UrlEncodeComponent(service->second));
    }
  } else {
    request.method = "GET";
    std::vector<std::string> query;
    if (service != challenge.params.end()) query.push_back(absl::StrCat("service=", UrlEncodeComponent(service->second)));
    for (const std::string& scope : scopes) query.push_back(absl::StrCat("scope=", UrlEncodeComponent(scope)));
    absl::StrAppend(&request.url, absl::StrContains(realm, '?') ? "&" : "?", absl::StrJoin(query, "&"));
    if (login_.has_value()) {
      request.headers.emplace_back(
          "Authorization",
          absl::StrCat("Basic ", absl::Base64Escape(absl::StrCat(login_->username, ":", login_->secret))));
    }
  }
  ASSIGN_OR_RETURN(TokenAnswer answer, send_(request));
  if (answer.status == 401 || answer.status == 403) {
    return absl::UnauthenticatedError(login_.has_value() ? Refused() : NoLogin());
  }
  if (answer.status != 200) {
    return absl::UnavailableError(absl::StrFormat("%s's token service (%s) answered %d", registry_, realm,
                                                  answer.status));
  }
  ASSIGN_OR_RETURN(IssuedToken issued, ParseTokenAnswer(answer.body, registry_));
  return Token{std::move(issued.value), absl::Now() + issued.lifetime};
}

absl::Status RegistryAuth::Refusal(int status, absl::string_view challenge_header) {
  const std::vector<AuthChallenge> challenges = ParseChallenges(challenge_header);
  std::string error;
  for (const AuthChallenge& challenge : challenges) {
    if (auto found = challenge.params.find("error"); found != challenge.params.end()) error = found->second;
  }
  const bool logged_in = !caller_token_.empty() || login_.has_value();
  if (!logged_in) return absl::UnauthenticatedError(NoLogin());
  // Known who, not allowed what: the token service left out an action.
  if (status == 403 || error == "insufficient_scope") {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s may not %s %s on %s: ask its owner for %s access, or log in as an account that has it",
        caller_token_.empty() ? absl::StrCat("user ", login_->username, " (", login_->source, ")")
                              : std::string("the bearer token in KILN_REGISTRY_TOKEN"),
        actions_ == "pull" ? "pull from" : "push to", repository_, registry_, actions_));
  }
  return absl::UnauthenticatedError(Refused());
}

}  // namespace kiln
