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
#include "compiler/toolchains.h"

namespace kiln::compiler {

struct PythonAbi {
  std::string version;     // "3.11"
  std::string abiflags;
  std::string ext_suffix;  // ".cpython-311-x86_64-linux-gnu.so"
  std::string platform;    // sysconfig.get_platform()
  std::string include_dir; // where Python.h is
};

struct LauncherRequest {
  std::string module_name;
  std::string c_source;
  PythonAbi abi;
  std::vector<std::string> include_dirs;
  std::vector<std::string> library_dirs;
  std::vector<std::string> libraries;
};

struct CCompiler {
  // TinyCC takes other flags than gcc and clang (no -O3, no -l:file).
  enum class Flavor { kGccLike, kTinyCC };
  std::filesystem::path path;
  std::string version;  // first line of `cc --version` (tcc: `tcc -v`)
  Flavor flavor = Flavor::kGccLike;
};

// The C compilers and CUDA headers found on this machine, in one place.
// Compilers in order of use: $CC or the configured one if set; otherwise
// TinyCC when present (a launcher builds in ~0.01 s instead of gcc -O3's
// ~0.13 s on a 2-core machine, and it is glue code that -O3 does not speed up),
// then gcc, clang. The next one is the fallback if the first fails.
// CUDA headers from $CUDA_PATH, $CUDA_HOME, /usr/local/cuda.
struct BuildEnvironment {
  std::vector<CCompiler> compilers;
  std::vector<std::filesystem::path> cuda_include_dirs;
};

absl::StatusOr<BuildEnvironment> DiscoverBuildEnvironment(const std::string& configured_compiler);

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
  absl::StatusOr<CommandResult> RunCompiler(const CCompiler& compiler,
                                            const LauncherRequest& request,
                                            const std::filesystem::path& scratch) const;

  const BuildEnvironment environment_;
  const absl::Duration timeout_;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_LAUNCHER_BUILDER_H_
