#ifndef KILN_COMPILER_WINDOWS_BUILD_H_
#define KILN_COMPILER_WINDOWS_BUILD_H_

// Building Triton's launcher modules on Windows: finding CUDA, Python's
// headers and import library, and the C compiler's command line. These are
// plain functions of an environment snapshot and a file tree, so they are
// tested on any OS against a fake tree; the Windows build of kilnd feeds them
// the real environment.

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln::compiler {

// Environment variables by upper-case name (Windows names are case-insensitive).
using WindowsEnvironment = std::map<std::string, std::string>;

struct CudaToolkit {
  std::filesystem::path root;
  std::filesystem::path include_dir;  // has cuda.h
  std::filesystem::path lib_dir;      // has cuda.lib (x64)
  std::filesystem::path ptxas;        // bin\ptxas.exe
};

// The first CUDA with cuda.h and cuda.lib among: %CUDA_PATH%, the newest
// %CUDA_PATH_Vxx_y%, for each Triton package dir in `triton_dirs` the CUDA
// files triton-windows bundles (backends\nvidia) and pip's nvidia\cuda_nvcc
// (plus cuda_runtime) beside it, then the newest %ProgramFiles%\NVIDIA GPU
// Computing Toolkit\CUDA\v*. FAILED_PRECONDITION lists where it looked.
absl::StatusOr<CudaToolkit> FindCudaOnWindows(const WindowsEnvironment& environment,
                                              const std::vector<std::filesystem::path>& triton_dirs);

struct PythonBuildFiles {
  std::filesystem::path include_dir;  // has Python.h
  std::filesystem::path library_dir;  // has python3XY.lib, or for TinyCC python3XY.def
  std::string library;                // "python312"
};

enum class WindowsCompiler { kMsvc, kClang, kTinyCC };

// The compiler, by preference: MSVC's cl.exe from a Visual Studio developer
// environment (%VCToolsInstallDir%) or from `vs_install_dir` (what vswhere
// reports), clang on %PATH%, then the TinyCC Triton ships
// (triton\runtime\tcc\tcc.exe under `triton_dir`).
struct FoundCompiler {
  WindowsCompiler kind;
  std::filesystem::path path;
};
absl::StatusOr<FoundCompiler> FindCompilerOnWindows(const WindowsEnvironment& environment,
                                                    const std::filesystem::path& vs_install_dir,
                                                    const std::filesystem::path& triton_dir);

// Python.h and an import library for the Python installed at `prefix`
// (version "3.13"), for `compiler` to build its launchers with. Embedded
// Pythons (ComfyUI's python_embeded) ship neither, so after `prefix`\include
// and `prefix`\libs come Kiln's copies, each `kiln_python_dirs`\3.13\{include,
// libs}: the installer's, then the headers Kiln's release carries. TinyCC
// links with the python313.def that triton-windows ships beside tcc.exe
// (lib\), so for it headers are all that must be found. FAILED_PRECONDITION
// says what is missing, where it looked, and how to provide it.
absl::StatusOr<PythonBuildFiles> FindPythonBuildFiles(
    const std::filesystem::path& prefix, absl::string_view version,
    const std::vector<std::filesystem::path>& kiln_python_dirs, const FoundCompiler& compiler);

// The command that builds `source` into the extension module `output`,
// linking `libraries` by name ("cuda", "python312"): MSVC `/O2 /LD ... /link
// cuda.lib`, clang and tcc `-shared -l...`; never -fPIC (not a Windows flag).
std::vector<std::string> WindowsLauncherCommand(WindowsCompiler kind,
                                                const std::filesystem::path& compiler,
                                                const std::filesystem::path& source,
                                                const std::filesystem::path& output,
                                                const std::vector<std::string>& include_dirs,
                                                const std::vector<std::string>& library_dirs,
                                                const std::vector<std::string>& libraries);

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_WINDOWS_BUILD_H_
