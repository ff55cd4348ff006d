#ifndef KILN_CLIENT_AUTOSTART_H_
#define KILN_CLIENT_AUTOSTART_H_

// Starting the user's own kilnd on demand, as the Python client and sccache
// do: a command that needs kilnd works whether or not one is running.

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kiln/client.h"

namespace kiln {

// What StartUserKilndIfNotServing did.
enum class Autostart {
  kNotNeeded,  // kilnd answered, or the options name a kilnd that is not the user's own
  kStarted,    // this call started the user's kilnd, and it serves now
};

// Starts the user's own kilnd when `options` name it (no endpoint given:
// ResolvedEndpoint::is_user_default) and it does not answer. The rule is the
// Python client's (kiln/service/connection.py, after ccache's storage helpers): ask;
// else take the lock <user runtime dir>/autostart.lock, ask again, start kilnd
// detached, and ask until it serves or `deadline` passes. Clients racing
// (this SDK's and Python's alike) start one kilnd between them. The program
// started: $KILN_KILND, else kilnd beside this executable (an install, the
// Windows zip), else the build tree's service/kilnd, else kilnd on PATH. It
// gets this process's environment less the KILN_* variables and
// TRITON_CACHE_MANAGER: it serves other processes too.
// UNAVAILABLE when there is no kilnd to start or it did not serve in time,
// saying what to do.
absl::StatusOr<Autostart> StartUserKilndIfNotServing(const ClientOptions& options,
                                                     absl::Duration deadline = absl::Seconds(20));

}  // namespace kiln

#endif  // KILN_CLIENT_AUTOSTART_H_
