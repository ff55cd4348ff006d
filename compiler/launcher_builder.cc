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
#include "common/subprocess.h"

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
  candidates.insert(candidates.end(), {"gcc", "clang", "cc", "tcc"});
  BuildEnvironment environment;
  for (const std::string& candidate : candidates) {
    environment.compiler = FindOnPath(candidate);
    if (!environment.compiler.empty()) break;
  }
  if (environment.compiler.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no C compiler found (tried %s) for launcher builds; install gcc or set CC",
        absl::StrJoin(candidates, ", ")));
  }
  absl::StatusOr<CommandResult> version =
      RunCommand({environment.compiler.string(), "--version"}, kVersionTimeout);
  if (version.ok()) {
    // tcc prints its version with -v only; either way the first line names it.
    std::string text = version->output.empty() ? version->errors : version->output;
    environment.compiler_version = text.substr(0, text.find('\n'));
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
       request.abi.ext_suffix, request.abi.platform, environment_.compiler.string(),
       environment_.compiler_version, CudaHeaderVersion(request),
       absl::StrJoin(request.include_dirs, ":"), absl::StrJoin(request.library_dirs, ":"),
       absl::StrJoin(request.libraries, ":")},
      std::string(1, '\0'));
  return DigestHex(DigestBytes(Sha256(material)));
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
  // The same command line as triton.runtime.build._build.
  std::vector<std::string> command = {environment_.compiler.string(), source.string(), "-O3",
                                      "-shared", "-fPIC", "-Wno-psabi", "-o", module.string()};
  for (const std::string& library : request.libraries) command.push_back(LibraryFlag(library));
  for (const std::string& dir : request.library_dirs) command.push_back("-L" + dir);
  for (const std::string& dir : request.include_dirs) command.push_back("-I" + dir);
  command.push_back("-I" + scratch.path().string());
  command.push_back("-I" + request.abi.include_dir);
  ASSIGN_OR_RETURN(CommandResult result, RunCommand(command, timeout_));
  if (!result.succeeded) {
    return CompileFailure{CompileFailure::Kind::kCompilationError,
                          absl::StrFormat("%s failed building %s (%s)", environment_.compiler.string(),
                                          request.module_name, result.exit_description),
                          result.errors};
  }
  return ReadFile(module);
}

}  // namespace kiln::compiler
