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

bool IsValidModuleName(const std::string& name) {
  return !name.empty() && name.size() <= 128 &&
         std::all_of(name.begin(), name.end(),
                     [](char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_'; });
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

absl::StatusOr<std::variant<std::string, CompileFailure>> LauncherBuilder::Build(
    const LauncherRequest& request) const {
  if (!IsValidModuleName(request.module_name)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "module name '%s' is not a Python identifier of letters, digits and _",
        request.module_name));
  }
  // Windows compilers find Python's build files themselves (embedded Pythons
  // ship none; Kiln provides them).
  const bool windows = environment_.compilers.front().windows.has_value();
  if (!windows && (request.abi.include_dir.empty() ||
                   !fs::exists(fs::path(request.abi.include_dir) / "Python.h"))) {
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
    ASSIGN_OR_RETURN(std::vector<std::string> command,
                     LauncherCompileCommand(compiler, environment_, request, scratch.path()));
    ASSIGN_OR_RETURN(result, RunCommand(command, timeout_));
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
