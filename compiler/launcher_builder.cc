#include "compiler/launcher_builder.h"

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace kiln::compiler {
namespace {

namespace fs = std::filesystem;

constexpr absl::Duration kVersionTimeout = absl::Seconds(20);

bool IsValidModuleName(const std::string& name) {
  return !name.empty() && name.size() <= 128 &&
         std::all_of(name.begin(), name.end(),
                     [](char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

// "-l:libcuda.so.1" for a file name, "-lcuda" for a library name, as Triton does.
std::string LibraryFlag(const std::string& library) {
  const bool is_file = absl::StrContains(library, ".so") || absl::EndsWith(library, ".a");
  return is_file ? absl::StrCat("-l:", library) : absl::StrCat("-l", library);
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

// A private scratch directory removed on scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::random_device random;
    path_ = fs::temp_directory_path() / absl::StrFormat("kiln-cc-%08x%08x", random(), random());
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

}  // namespace

absl::StatusOr<BuildEnvironment> DiscoverBuildEnvironment(const std::string& configured_compiler) {
  std::vector<std::string> candidates;
  if (const char* cc = std::getenv("CC"); cc != nullptr && cc[0] != '\0') candidates.push_back(cc);
  if (!configured_compiler.empty()) candidates.push_back(configured_compiler);
  candidates.insert(candidates.end(), {"tcc", "gcc", "clang", "cc"});
  BuildEnvironment environment;
  for (const std::string& candidate : candidates) {
    const fs::path path = FindOnPath(candidate);
    if (path.empty() || environment.compilers.size() == 2) continue;
    CCompiler compiler{path, "", CCompiler::Flavor::kGccLike};
    if (path.filename() == "tcc") compiler.flavor = CCompiler::Flavor::kTinyCC;
    const bool tiny = compiler.flavor == CCompiler::Flavor::kTinyCC;
    absl::StatusOr<CommandResult> version =
        RunCommand({path.string(), tiny ? "-v" : "--version"}, kVersionTimeout);
    if (!version.ok()) continue;
    const std::string text = version->output.empty() ? version->errors : version->output;
    compiler.version = text.substr(0, text.find('\n'));
    environment.compilers.push_back(std::move(compiler));
  }
  if (environment.compilers.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no C compiler found (tried %s) for launcher builds; install gcc or set CC",
        absl::StrJoin(candidates, ", ")));
  }
  for (const char* variable : {"CUDA_PATH", "CUDA_HOME"}) {
    if (const char* root = std::getenv(variable); root != nullptr && root[0] != '\0') {
      environment.cuda_include_dirs.push_back(fs::path(root) / "include");
    }
  }
  environment.cuda_include_dirs.push_back("/usr/local/cuda/include");
  return environment;
}

std::string LauncherBuilder::CudaHeaderVersion(const LauncherRequest& request) const {
  std::vector<fs::path> dirs(request.include_dirs.begin(), request.include_dirs.end());
  dirs.insert(dirs.end(), environment_.cuda_include_dirs.begin(),
              environment_.cuda_include_dirs.end());
  for (const fs::path& dir : dirs) {
    std::ifstream header(dir / "cuda.h");
    std::string line;
    while (header && std::getline(header, line)) {
      if (absl::StartsWith(line, "#define CUDA_VERSION ")) {
        return std::string(absl::StripAsciiWhitespace(line.substr(21)));
      }
    }
  }
  return "none";
}

std::string LauncherBuilder::CacheKey(const LauncherRequest& request) const {
  const std::string material = absl::StrJoin(
      {request.module_name, request.c_source, request.abi.version, request.abi.abiflags,
       request.abi.ext_suffix, request.abi.platform, environment_.compilers.front().path.string(),
       environment_.compilers.front().version, CudaHeaderVersion(request),
       absl::StrJoin(request.include_dirs, ":"), absl::StrJoin(request.library_dirs, ":"),
       absl::StrJoin(request.libraries, ":")},
      std::string(1, '\0'));
  return DigestHex(DigestBytes(Sha256(material)));
}

absl::StatusOr<CommandResult> LauncherBuilder::RunCompiler(const CCompiler& compiler,
                                                           const LauncherRequest& request,
                                                           const fs::path& scratch) const {
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
  return RunCommand(command, timeout_);
}

absl::StatusOr<std::variant<std::string, CompileFailure>> LauncherBuilder::Build(
    const LauncherRequest& request) const {
  if (!IsValidModuleName(request.module_name)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "module name '%s' is not a Python identifier of letters, digits and _",
        request.module_name));
  }
  if (request.abi.include_dir.empty() ||
      !fs::exists(fs::path(request.abi.include_dir) / "Python.h")) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "no Python.h in '%s'; the client must send its Python include directory (embedded "
        "Pythons lack one: install the python3.x development headers)",
        request.abi.include_dir));
  }
  if (request.abi.ext_suffix.empty()) {
    return absl::InvalidArgumentError("the request lacks the Python extension suffix");
  }
  ScratchDir scratch;
  const fs::path source = scratch.path() / (request.module_name + ".c");
  const fs::path module = scratch.path() / (request.module_name + request.abi.ext_suffix);
  std::ofstream(source, std::ios::binary) << request.c_source;
  CommandResult result;
  for (const CCompiler& compiler : environment_.compilers) {
    ASSIGN_OR_RETURN(result, RunCompiler(compiler, request, scratch.path()));
    if (result.succeeded) break;
  }
  if (!result.succeeded) {
    return CompileFailure{CompileFailure::Kind::kCompilationError,
                          absl::StrFormat("%s failed building %s (%s)",
                                          environment_.compilers.back().path.string(),
                                          request.module_name, result.exit_description),
                          result.errors};
  }
  return ReadFile(module);
}

}  // namespace kiln::compiler
