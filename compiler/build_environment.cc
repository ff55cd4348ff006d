#include "compiler/build_environment.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kiln::compiler {
namespace {

namespace fs = std::filesystem;

// "-l:libcuda.so.1" for a file name, "-lcuda" for a library name, as Triton does.
std::string LibraryFlag(const std::string& library) {
  const bool is_file = absl::StrContains(library, ".so") || absl::EndsWith(library, ".a");
  return is_file ? absl::StrCat("-l:", library) : absl::StrCat("-l", library);
}

absl::StatusOr<std::vector<std::string>> WindowsCommand(const CCompiler& compiler,
                                                        const BuildEnvironment& environment,
                                                        const LauncherRequest& request,
                                                        const fs::path& scratch) {
  // sysconfig names <prefix>\Include even where an embedded Python has none.
  const fs::path prefix = fs::path(request.abi.include_dir).parent_path();
  absl::StatusOr<PythonBuildFiles> python =
      FindPythonBuildFiles(prefix, request.abi.version, environment.kiln_python_dirs,
                           FoundCompiler{*compiler.windows, compiler.path});
  if (!python.ok()) return python.status();
  std::vector<std::string> include_dirs = request.include_dirs;
  include_dirs.push_back(scratch.string());
  include_dirs.push_back(python->include_dir.string());
  for (const fs::path& dir : environment.cuda_include_dirs) include_dirs.push_back(dir.string());
  std::vector<std::string> library_dirs = request.library_dirs;
  library_dirs.push_back(python->library_dir.string());
  for (const fs::path& dir : environment.cuda_library_dirs) library_dirs.push_back(dir.string());
  std::vector<std::string> libraries = request.libraries;
  libraries.push_back(python->library);
  return WindowsLauncherCommand(*compiler.windows, compiler.path,
                                scratch / (request.module_name + ".c"),
                                scratch / (request.module_name + request.abi.ext_suffix),
                                include_dirs, library_dirs, libraries);
}

}  // namespace

absl::Status LinkStubWithoutDriver(const BuildEnvironment& environment, LauncherRequest& request) {
  for (std::string& library : request.libraries) {
    if (!absl::StartsWith(library, "libcuda.so")) continue;
    const bool found = std::any_of(request.library_dirs.begin(), request.library_dirs.end(),
                                   [&](const std::string& dir) {
                                     return fs::exists(fs::path(dir) / library);
                                   });
    if (found) continue;
    const auto stub = std::find_if(
        environment.cuda_stub_dirs.begin(), environment.cuda_stub_dirs.end(),
        [](const fs::path& dir) { return fs::exists(dir / "libcuda.so"); });
    if (stub == environment.cuda_stub_dirs.end()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "no %s to link the launcher against: install the CUDA toolkit (its lib64/stubs) or a "
          "GPU driver on this machine, or set CUDA_HOME for kilnd",
          library));
    }
    library = "cuda";  // -lcuda finds the stub's libcuda.so
    request.library_dirs.push_back(stub->string());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> LauncherCompileCommand(
    const CCompiler& compiler, const BuildEnvironment& environment,
    const LauncherRequest& request, const fs::path& scratch) {
  if (compiler.windows.has_value()) return WindowsCommand(compiler, environment, request, scratch);
  const fs::path source = scratch / (request.module_name + ".c");
  const fs::path module = scratch / (request.module_name + request.abi.ext_suffix);
  const bool tiny = compiler.flavor == CCompiler::Flavor::kTinyCC;
  // gcc and clang get the command line of triton.runtime.build._build.
  std::vector<std::string> command = {compiler.path.string(), source.string(), "-shared", "-fPIC",
                                      "-o", module.string()};
  if (!tiny) command.insert(command.end(), {"-O3", "-Wno-psabi"});
  for (const std::string& library : request.libraries) {
    std::string flag = LibraryFlag(library);
    if (tiny && absl::StartsWith(flag, "-l:")) {
      // TinyCC has no -l:FILE; link the file itself from the first dir that has it.
      for (const std::string& dir : request.library_dirs) {
        if (fs::exists(fs::path(dir) / library)) flag = (fs::path(dir) / library).string();
      }
    }
    command.push_back(flag);
  }
  for (const std::string& dir : request.library_dirs) command.push_back("-L" + dir);
  for (const std::string& dir : request.include_dirs) command.push_back("-I" + dir);
  command.push_back("-I" + scratch.string());
  command.push_back("-I" + request.abi.include_dir);
  return command;
}

}  // namespace kiln::compiler
