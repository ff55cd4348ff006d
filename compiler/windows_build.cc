#include "compiler/windows_build.h"

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace kiln::compiler {
namespace {

namespace fs = std::filesystem;

std::string Variable(const WindowsEnvironment& environment, const std::string& name) {
  const auto found = environment.find(name);
  return found == environment.end() ? "" : found->second;
}

bool IsCuda(const fs::path& root) {
  return fs::exists(root / "include" / "cuda.h") && fs::exists(root / "lib" / "x64" / "cuda.lib");
}

CudaToolkit ToolkitAt(const fs::path& root) {
  return {root, root / "include", root / "lib" / "x64", root / "bin" / "ptxas.exe"};
}

// "12_8" or "12.8" -> {12, 8}: versions compare as numbers, so 12.10 > 12.8.
std::vector<int> ParseVersion(absl::string_view text, char separator) {
  std::vector<int> version;
  for (absl::string_view part : absl::StrSplit(text, separator)) {
    int number = 0;
    if (!absl::SimpleAtoi(part, &number)) break;
    version.push_back(number);
  }
  return version;
}

// Directories under `parent` named `prefix` + a version, newest first.
std::vector<fs::path> VersionedDirs(const fs::path& parent, absl::string_view prefix) {
  std::vector<std::pair<std::vector<int>, fs::path>> found;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(parent, error)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || !absl::StartsWith(name, prefix)) continue;
    found.emplace_back(ParseVersion(absl::string_view(name).substr(prefix.size()), '.'), entry.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<fs::path> paths;
  for (auto& [version, path] : found) paths.push_back(path);
  return paths;
}

}  // namespace

absl::StatusOr<CudaToolkit> FindCudaOnWindows(const WindowsEnvironment& environment,
                                              const std::vector<fs::path>& triton_dirs) {
  std::vector<fs::path> candidates;
  if (const std::string path = Variable(environment, "CUDA_PATH"); !path.empty()) {
    candidates.emplace_back(path);
  }
  // CUDA_PATH_V12_8 and the like, newest version first.
  std::vector<std::pair<std::vector<int>, std::string>> versioned;
  constexpr absl::string_view kVersioned = "CUDA_PATH_V";
  for (const auto& [name, value] : environment) {
    if (absl::StartsWith(name, kVersioned)) {
      versioned.emplace_back(ParseVersion(absl::string_view(name).substr(kVersioned.size()), '_'),
                             value);
    }
  }
  std::sort(versioned.begin(), versioned.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [version, value] : versioned) candidates.emplace_back(value);
  // Then where triton-windows itself looks, in its order: the CUDA files it
  // bundles, pip's toolkit beside it, the installed toolkits.
  for (const fs::path& triton_dir : triton_dirs) {
    candidates.push_back(triton_dir / "backends" / "nvidia");
    candidates.push_back(triton_dir.parent_path() / "nvidia" / "cuda_nvcc");
  }
  std::vector<std::string> looked;
  for (const fs::path& candidate : candidates) looked.push_back(candidate.string());
  if (const std::string program_files = Variable(environment, "PROGRAMFILES"); !program_files.empty()) {
    const fs::path toolkits = fs::path(program_files) / "NVIDIA GPU Computing Toolkit" / "CUDA";
    looked.push_back((toolkits / "v*").string());
    for (const fs::path& dir : VersionedDirs(toolkits, "v")) candidates.push_back(dir);
  }
  for (const fs::path& candidate : candidates) {
    if (IsCuda(candidate)) return ToolkitAt(candidate);
    // pip splits the toolkit: headers and cuda.lib come with cuda_runtime.
    const fs::path runtime = candidate.parent_path() / "cuda_runtime";
    if (candidate.filename() == "cuda_nvcc" && IsCuda(runtime)) {
      CudaToolkit toolkit = ToolkitAt(runtime);
      toolkit.ptxas = candidate / "bin" / "ptxas.exe";
      return toolkit;
    }
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "no CUDA toolkit with include\\cuda.h and lib\\x64\\cuda.lib found (looked in: %s); install "
      "the CUDA toolkit or `pip install nvidia-cuda-nvcc-cu12 nvidia-cuda-runtime-cu12`, or set "
      "CUDA_PATH",
      looked.empty() ? "nowhere: CUDA_PATH and ProgramFiles are unset and no Triton is registered"
                     : absl::StrJoin(looked, "; ")));
}

absl::StatusOr<PythonBuildFiles> FindPythonBuildFiles(const fs::path& prefix,
                                                      absl::string_view version,
                                                      const std::vector<fs::path>& kiln_python_dirs,
                                                      const FoundCompiler& compiler) {
  const std::string library = absl::StrCat("python", absl::StrReplaceAll(version, {{".", ""}}));
  std::vector<fs::path> roots = {prefix};
  for (const fs::path& dir : kiln_python_dirs) roots.push_back(dir / std::string(version));
  PythonBuildFiles found{{}, {}, library};
  for (const fs::path& root : roots) {
    if (found.include_dir.empty() && fs::exists(root / "include" / "Python.h")) {
      found.include_dir = root / "include";
    }
    if (found.library_dir.empty() && fs::exists(root / "libs" / (library + ".lib"))) {
      found.library_dir = root / "libs";
    }
  }
  // tcc.exe looks in its own lib\ for -lpython313 and takes a .def there.
  const fs::path tcc_library = compiler.path.parent_path() / "lib" / (library + ".def");
  const bool tiny = compiler.kind == WindowsCompiler::kTinyCC;
  if (found.library_dir.empty() && tiny && fs::exists(tcc_library)) {
    found.library_dir = tcc_library.parent_path();
  }
  if (!found.include_dir.empty() && !found.library_dir.empty()) return found;

  std::vector<std::string> missing;
  if (found.include_dir.empty()) missing.push_back("include\\Python.h");
  if (found.library_dir.empty()) {
    missing.push_back(tiny ? absl::StrCat("libs\\", library, ".lib (or ", tcc_library.string(), ")")
                           : absl::StrCat("libs\\", library, ".lib"));
  }
  std::set<std::string> carried;
  for (const fs::path& dir : kiln_python_dirs) {
    for (const fs::path& versioned : VersionedDirs(dir, "3.")) {
      if (fs::exists(versioned / "include" / "Python.h")) carried.insert(versioned.filename().string());
    }
  }
  std::vector<std::string> looked;
  for (const fs::path& root : roots) looked.push_back(root.string());
  return absl::FailedPreconditionError(absl::StrFormat(
      "no %s for Python %s (looked in %s). An embedded Python ships without them, and Kiln "
      "carries %s. Copy include\\ and libs\\ from python.org's installer of Python %s into %s, "
      "or run Kiln's installer (install-kiln.ps1) for this Python, which provides them",
      absl::StrJoin(missing, " and "), version, absl::StrJoin(looked, "; "),
      carried.empty() ? std::string("no Python headers here")
                      : absl::StrCat("headers for Python ", absl::StrJoin(carried, ", "), " only"),
      version, prefix.string()));
}

absl::StatusOr<FoundCompiler> FindCompilerOnWindows(const WindowsEnvironment& environment,
                                                    const fs::path& vs_install_dir,
                                                    const fs::path& triton_dir) {
  std::vector<fs::path> msvc_roots;
  if (const std::string tools = Variable(environment, "VCTOOLSINSTALLDIR"); !tools.empty()) {
    msvc_roots.emplace_back(tools);
  }
  if (!vs_install_dir.empty()) {
    for (const fs::path& dir : VersionedDirs(vs_install_dir / "VC" / "Tools" / "MSVC", "")) {
      msvc_roots.push_back(dir);
    }
  }
  for (const fs::path& root : msvc_roots) {
    const fs::path cl = root / "bin" / "Hostx64" / "x64" / "cl.exe";
    if (fs::exists(cl)) return FoundCompiler{WindowsCompiler::kMsvc, cl};
  }
  for (absl::string_view dir : absl::StrSplit(Variable(environment, "PATH"), ';')) {
    if (dir.empty()) continue;
    const fs::path clang = fs::path(std::string(dir)) / "clang.exe";
    if (fs::exists(clang)) return FoundCompiler{WindowsCompiler::kClang, clang};
  }
  const fs::path tcc = triton_dir / "runtime" / "tcc" / "tcc.exe";
  if (fs::exists(tcc)) return FoundCompiler{WindowsCompiler::kTinyCC, tcc};
  return absl::FailedPreconditionError(
      "no C compiler for launcher modules: install Visual Studio Build Tools (C++), or clang, or "
      "a Triton for Windows that bundles TinyCC");
}

std::vector<std::string> WindowsLauncherCommand(WindowsCompiler kind, const fs::path& compiler,
                                                const fs::path& source, const fs::path& output,
                                                const std::vector<std::string>& include_dirs,
                                                const std::vector<std::string>& library_dirs,
                                                const std::vector<std::string>& libraries) {
  std::vector<std::string> command = {compiler.string()};
  if (kind == WindowsCompiler::kMsvc) {
    command.insert(command.end(), {"/nologo", "/O2", "/LD", source.string(),
                                   absl::StrCat("/Fe:", output.string())});
    for (const std::string& dir : include_dirs) command.push_back("/I" + dir);
    command.push_back("/link");
    for (const std::string& dir : library_dirs) command.push_back("/LIBPATH:" + dir);
    for (const std::string& library : libraries) command.push_back(library + ".lib");
    return command;
  }
  command.push_back(source.string());
  if (kind == WindowsCompiler::kClang) command.push_back("-O3");
  command.insert(command.end(), {"-shared", "-o", output.string()});
  // As triton-windows builds with TinyCC: Python 3.13's headers use MSVC's
  // atomics unless told TinyCC has GCC's builtins.
  if (kind == WindowsCompiler::kTinyCC) command.push_back("-D_Py_USE_GCC_BUILTIN_ATOMICS");
  for (const std::string& dir : include_dirs) command.push_back("-I" + dir);
  for (const std::string& dir : library_dirs) command.push_back("-L" + dir);
  for (const std::string& library : libraries) command.push_back("-l" + library);
  return command;
}

}  // namespace kiln::compiler
