#ifndef KILN_COMPILER_LAUNCHER_BUILDER_H_
#define KILN_COMPILER_LAUNCHER_BUILDER_H_

// Builds Triton's launcher and cuda_utils C sources into Python extension
// modules with the machine's C compiler, as triton.runtime.build does.

#include <filesystem>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "compiler/build_environment.h"
#include "compiler/toolchains.h"

namespace kiln::compiler {

class LauncherBuilder {
 public:
  LauncherBuilder(BuildEnvironment environment, absl::Duration timeout)
      : environment_(std::move(environment)), timeout_(timeout) {}

  // Covers the source, the Python ABI, the compiler and its version, the CUDA
  // header version and the search paths, so a changed environment never gets
  // a stale module.
  std::string CacheKey(const LauncherRequest& request) const;

  // The built module's bytes, or the compiler's failure. INVALID_ARGUMENT for
  // an unusable request (no module name, no Python headers).
  absl::StatusOr<std::variant<std::string, CompileFailure>> Build(
      const LauncherRequest& request) const;

  const BuildEnvironment& environment() const { return environment_; }

 private:
  std::string CudaHeaderVersion(const LauncherRequest& request) const;

  const BuildEnvironment environment_;
  const absl::Duration timeout_;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_LAUNCHER_BUILDER_H_
