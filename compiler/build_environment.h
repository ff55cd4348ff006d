#ifndef KILN_COMPILER_BUILD_ENVIRONMENT_H_
#define KILN_COMPILER_BUILD_ENVIRONMENT_H_

// What building a Triton launcher module needs from the machine: C compilers,
// CUDA's headers and import library, Python's build files; and the compiler
// command line. DiscoverBuildEnvironment has one implementation per OS
// (build_environment_posix.cc, build_environment_win.cc); the command lines
// are plain functions, tested everywhere.

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/windows_build.h"

namespace kiln::compiler {

struct PythonAbi {
  std::string version;     // "3.11"
  std::string abiflags;
  std::string ext_suffix;  // ".cpython-311-x86_64-linux-gnu.so", ".cp312-win_amd64.pyd"
  std::string platform;    // sysconfig.get_platform()
  std::string include_dir; // where Python.h is (embedded Windows Pythons: nowhere)
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
  std::string version;  // first line of `cc --version` (tcc: `tcc -v`, MSVC: cl's banner)
  Flavor flavor = Flavor::kGccLike;
  // Set on Windows: MSVC, clang or TinyCC with Windows command lines
  // (WindowsLauncherCommand), linking python3XY.lib and cuda.lib.
  std::optional<WindowsCompiler> windows;
};

// The C compilers and CUDA files found on this machine, in one place.
// Linux: $CC or the configured one if set; otherwise TinyCC when present (a
// launcher builds in ~0.01 s instead of gcc -O3's ~0.13 s on a 2-core machine,
// and it is glue code that -O3 does not speed up), then gcc, clang; the next
// one is the fallback if the first fails. CUDA headers from $CUDA_PATH,
// $CUDA_HOME, /usr/local/cuda. Windows: see FindCompilerOnWindows and
// FindCudaOnWindows.
struct BuildEnvironment {
  std::vector<CCompiler> compilers;
  std::vector<std::filesystem::path> cuda_include_dirs;
  std::vector<std::filesystem::path> cuda_library_dirs;  // Windows: cuda.lib
  // Linux: the CUDA toolkit's link stubs (libcuda.so), for a machine without
  // a GPU driver (see LinkStubWithoutDriver).
  std::vector<std::filesystem::path> cuda_stub_dirs;
  // Python headers and import libraries Kiln provides for embedded Pythons,
  // each dir holding 3.XY\{include,libs}: the installer's
  // (platform::KilnPythonDir), then the headers carried beside kilnd.exe.
  std::vector<std::filesystem::path> kiln_python_dirs;
};

// `triton_dirs`: the triton packages of the toolchains registered at start;
// on Windows the TinyCC that triton-windows bundles there is the last resort.
absl::StatusOr<BuildEnvironment> DiscoverBuildEnvironment(
    const std::string& configured_compiler, const std::vector<std::filesystem::path>& kiln_python_dirs,
    const std::vector<std::filesystem::path>& triton_dirs = {});

// The command that builds `request` (its source written to
// scratch/<module>.c) into scratch/<module><ext_suffix> with `compiler`.
// gcc/clang get triton.runtime.build's flags; Windows compilers link the
// Python import library, found beside the client's Python or in Kiln's copy.
// FAILED_PRECONDITION when a Windows Python's build files are missing.
absl::StatusOr<std::vector<std::string>> LauncherCompileCommand(
    const CCompiler& compiler, const BuildEnvironment& environment,
    const LauncherRequest& request, const std::filesystem::path& scratch);

// A launcher built where no GPU driver is installed (a build farm) has no
// libcuda.so.1 to link: links the CUDA toolkit's stub instead, whose SONAME is
// libcuda.so.1, so the module loads the driver of the machine it runs on.
// FAILED_PRECONDITION when neither is here, naming what to install.
absl::Status LinkStubWithoutDriver(const BuildEnvironment& environment, LauncherRequest& request);

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_BUILD_ENVIRONMENT_H_
