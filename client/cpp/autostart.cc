#include "kiln/autostart.h"

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/platform.h"
#include "common/subprocess.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// A local kilnd answers in milliseconds; one that is not there fails at once.
constexpr absl::Duration kAskTimeout = absl::Seconds(2);

// Variables of this client that a kilnd serving every process must not take.
const std::vector<std::string>& ClientOnlyVariables() {
  static const auto* prefixes = new std::vector<std::string>{"KILN", "TRITON_CACHE_MANAGER"};
  return *prefixes;
}

bool Serving(const ClientOptions& options, absl::Duration timeout) {
  ClientOptions quick = options;
  quick.timeout = timeout;
  quick.max_attempts = 1;
  return Client(std::move(quick)).CheckHealth().ok();
}

// The kilnd to start (see StartUserKilndIfNotServing), or UNAVAILABLE.
absl::StatusOr<fs::path> KilndProgram() {
  if (const char* configured = std::getenv("KILN_KILND");
      configured != nullptr && configured[0] != '\0') {
    if (fs::path found = FindOnPath(configured); !found.empty()) return found;
    return absl::UnavailableError(absl::StrFormat(
        "KILN_KILND=%s is not a program that can be run; set it to kilnd's path", configured));
  }
  // FindOnPath with a directory checks that one file, adding .exe on Windows.
  const fs::path here = ExecutableDir();
  for (const fs::path& candidate : {here / "kilnd", here / ".." / ".." / "service" / "kilnd"}) {
    if (fs::path found = FindOnPath(candidate.string()); !found.empty()) {
      return found.lexically_normal();
    }
  }
  if (fs::path found = FindOnPath("kilnd"); !found.empty()) return found;
  return absl::UnavailableError(
      "kilnd is not running and there is none to start: put kilnd on PATH, set KILN_KILND to its "
      "path, or start it yourself");
}

}  // namespace

absl::StatusOr<Autostart> StartUserKilndIfNotServing(const ClientOptions& options,
                                                     absl::Duration deadline) {
  const absl::Time give_up = absl::Now() + deadline;
  if (!ResolveEndpoint(options).is_user_default || Serving(options, kAskTimeout)) {
    return Autostart::kNotNeeded;
  }
  absl::StatusOr<fs::path> kilnd = KilndProgram();
  if (!kilnd.ok()) return kilnd.status();
  const fs::path runtime_dir = platform::DefaultRuntimeDir();
  if (absl::Status made = platform::EnsurePrivateDirectory(runtime_dir); !made.ok()) {
    return absl::UnavailableError(made.message());
  }
  // A client that holds the lock is starting kilnd: it is waited for, then asked.
  absl::StatusOr<std::unique_ptr<platform::ExclusiveLock>> lock =
      platform::WaitForFileLock(runtime_dir / "autostart.lock", give_up + absl::Seconds(5));
  if (!lock.ok()) return absl::UnavailableError(lock.status().message());
  if (Serving(options, absl::Milliseconds(200))) return Autostart::kNotNeeded;
  if (absl::Status spawned = SpawnDetached({kilnd->string()}, ClientOnlyVariables());
      !spawned.ok()) {
    return absl::UnavailableError(spawned.message());
  }
  // Asked again from the start: on Windows the new kilnd writes a new
  // endpoint file, with a port and token of its own.
  Client client(options);
  if (absl::Status serving = client.WaitUntilServing(give_up - absl::Now()); !serving.ok()) {
    return absl::UnavailableError(absl::StrFormat(
        "started %s, but it did not serve within %s (%s); its log is in %s", kilnd->string(),
        absl::FormatDuration(deadline), serving.message(),
        (platform::DefaultDataDir() / "logs" / "kilnd.log").string()));
  }
  return Autostart::kStarted;
}

}  // namespace kiln
