// Finding the launcher-build toolchain on Windows: a snapshot of the process
// environment and vswhere's answer, fed to the discovery functions of
// windows_build.h.

#include "common/windows_api.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/subprocess.h"
#include "common/windows_text.h"
#include "compiler/build_environment.h"

namespace kiln::compiler {
namespace {

namespace fs = std::filesystem;

constexpr absl::Duration kProbeTimeout = absl::Seconds(20);

WindowsEnvironment EnvironmentSnapshot() {
  WindowsEnvironment environment;
  if (wchar_t* block = GetEnvironmentStringsW()) {
    for (const wchar_t* entry = block; *entry != L'\0'; entry += wcslen(entry) + 1) {
      const std::string text = Narrow(entry);
      const size_t equals = text.find('=', 1);  // "=C:=C:\dir" entries start with '='
      if (equals == std::string::npos) continue;
      environment[absl::AsciiStrToUpper(text.substr(0, equals))] = text.substr(equals + 1);
    }
    FreeEnvironmentStringsW(block);
  }
  return environment;
}

// The newest Visual Studio with the C++ tools, as vswhere (installed with
// every Visual Studio since 2017) reports it; empty when there is none.
fs::path VisualStudioDir(const WindowsEnvironment& environment) {
  const auto program_files = environment.find("PROGRAMFILES(X86)");
  if (program_files == environment.end()) return {};
  const fs::path vswhere =
      fs::path(Widen(program_files->second)) / "Microsoft Visual Studio" / "Installer" / "vswhere.exe";
  if (!fs::exists(vswhere)) return {};
  absl::StatusOr<CommandResult> found = RunCommand(
      {PathText(vswhere), "-latest", "-products", "*", "-requires",
       "Microsoft.VisualStudio.Component.VC.Tools.x86.x64", "-property", "installationPath"},
      kProbeTimeout);
  if (!found.ok() || !found->succeeded) return {};
  std::string path(absl::StripAsciiWhitespace(found->output));
  return path.empty() ? fs::path() : fs::path(Widen(path));
}

std::string FirstLine(const std::string& text) {
  return std::string(absl::StripAsciiWhitespace(text.substr(0, text.find('\n'))));
}

}  // namespace

absl::StatusOr<BuildEnvironment> DiscoverBuildEnvironment(const std::string& configured_compiler,
                                                          const std::vector<fs::path>& kiln_python_dirs,
                                                          const std::vector<fs::path>& triton_dirs) {
  const WindowsEnvironment environment = EnvironmentSnapshot();
  BuildEnvironment build;
  build.kiln_python_dirs = kiln_python_dirs;
  absl::StatusOr<FoundCompiler> found;
  if (!configured_compiler.empty()) {
    // launcher_cc names the compiler; its file name says which kind it is.
    const fs::path path = fs::path(Widen(configured_compiler));
    const std::string name = absl::AsciiStrToLower(PathText(path.filename()));
    const WindowsCompiler kind = name == "cl.exe"    ? WindowsCompiler::kMsvc
                                 : name == "tcc.exe" ? WindowsCompiler::kTinyCC
                                                     : WindowsCompiler::kClang;
    found = FoundCompiler{kind, path};
  } else {
    const fs::path vs_dir = VisualStudioDir(environment);
    found = FindCompilerOnWindows(environment, vs_dir, fs::path());
    for (const fs::path& triton_dir : triton_dirs) {
      if (found.ok()) break;
      found = FindCompilerOnWindows(environment, vs_dir, triton_dir);
    }
  }
  if (!found.ok()) return found.status();
  CCompiler compiler;
  compiler.path = found->path;
  compiler.windows = found->kind;
  compiler.flavor =
      found->kind == WindowsCompiler::kTinyCC ? CCompiler::Flavor::kTinyCC : CCompiler::Flavor::kGccLike;
  // cl prints its banner when run without arguments.
  const std::vector<std::string> probe =
      found->kind == WindowsCompiler::kMsvc     ? std::vector<std::string>{PathText(found->path)}
      : found->kind == WindowsCompiler::kTinyCC ? std::vector<std::string>{PathText(found->path), "-v"}
                                                : std::vector<std::string>{PathText(found->path), "--version"};
  absl::StatusOr<CommandResult> version = RunCommand(probe, kProbeTimeout);
  if (!version.ok()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the C compiler %s does not run: %s", PathText(found->path), version.status().message()));
  }
  // cl's banner is on stderr (its stdout is usage); the others print to stdout.
  const bool banner_on_stderr = found->kind == WindowsCompiler::kMsvc || version->output.empty();
  compiler.version = FirstLine(banner_on_stderr ? version->errors : version->output);
  build.compilers.push_back(std::move(compiler));

  absl::StatusOr<CudaToolkit> cuda = FindCudaOnWindows(environment, triton_dirs);
  if (!cuda.ok()) return cuda.status();
  build.cuda_include_dirs.push_back(cuda->include_dir);
  build.cuda_library_dirs.push_back(cuda->lib_dir);
  return build;
}

}  // namespace kiln::compiler
