#ifndef KILN_CLIENT_TARGET_BUNDLES_H_
#define KILN_CLIENT_TARGET_BUNDLES_H_

// A bundle for each GPU target (`kiln push --target`): a bundle's Triton
// kernels, recorded on one GPU, compiled by kilnd for each other target as
// `kiln prewarm` compiles them (on a CPU: the publisher needs no GPU), and
// written with the bundle's other entries into a bundle per target.

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/ed25519.h"
#include "kiln/client.h"
#include "kiln/v1/kiln.pb.h"

namespace kiln {

// A recorded Triton kernel of a bundle, as Prewarm takes it.
struct RecordedKernel {
  std::string name;
  std::string key;                   // its entry's key in the bundle
  std::string recorded_target;       // "cuda:90" (from its key inputs); empty if unknown
  std::string triton_version;        // "3.6.0": of the Triton that compiled it; empty if unknown
  v1::PrewarmRequest request;        // without its target
};

// The recorded kernels of the bundle at `file`: memory holds their frontend
// outputs and key inputs, never the bundle.
absl::StatusOr<std::vector<RecordedKernel>> RecordedKernels(const std::string& file);

// Prewarms kernels[k] for targets[t] for each (k, t) of `jobs`, a few at a
// time; `done` is told of each (k, t, result) as they end, and `tick` (when
// given) of how many are running, at least every 100 ms: both on the
// calling thread. Stops sending after an error no other kernel would escape
// (kilnd gone, no toolchain of the bundle's Triton): returns false then.
bool PrewarmEach(Client& client, const std::vector<RecordedKernel>& kernels,
                 const std::vector<v1::Target>& targets, const std::vector<std::pair<size_t, size_t>>& jobs,
                 const std::function<void(size_t, size_t, const absl::StatusOr<v1::PrewarmResponse>&)>& done,
                 const std::function<void(size_t running)>& tick = nullptr);

struct TargetBundle {
  std::filesystem::path file;
  std::string target;  // "cuda:89"
  uint64_t entries = 0;
  uint64_t kernels = 0;          // of them, Triton kernels
  std::vector<std::string> tritons;   // the Triton versions of its kernels, sorted
  std::vector<std::string> left_out;  // "KERNEL: why", of kernels not in it
};

// Writes a bundle per target into `directory` (signed by `signer` when
// given): the bundle's entries that are no Triton kernel, its kernels
// recorded for that target as they are, and its other kernels compiled by
// kilnd for the target. `progress` is told of each compile.
absl::StatusOr<std::vector<TargetBundle>> MakeTargetBundles(Client& client, const std::string& file,
                                                            const std::vector<v1::Target>& targets,
                                                            const Ed25519PrivateKey* signer,
                                                            const std::filesystem::path& directory,
                                                            const std::function<void(const std::string&)>& progress);

std::string TargetName(const v1::Target& target);  // "cuda:89"

}  // namespace kiln

#endif  // KILN_CLIENT_TARGET_BUNDLES_H_
