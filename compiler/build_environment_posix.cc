#include <cstdlib>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/subprocess.h"
#include "compiler/build_environment.h"

namespace kiln::compiler {
namespace {

namespace fs = std::filesystem;

constexpr absl::Duration kVersionTimeout = absl::Seconds(20);

}  // namespace

// Triton for Linux bundles no C compiler, so `triton_dirs` adds nothing here.
absl::StatusOr<BuildEnvironment> DiscoverBuildEnvironment(const std::string& configured_compiler,
                                                          const std::vector<fs::path>& kiln_python_dirs,
                                                          const std::vector<fs::path>&) {
  std::vector<std::string> candidates;
  if (const char* cc = std::getenv("CC"); cc != nullptr && cc[0] != '\0') candidates.push_back(cc);
  if (!configured_compiler.empty()) candidates.push_back(configured_compiler);
  candidates.insert(candidates.end(), {"tcc", "gcc", "clang", "cc"});
  BuildEnvironment environment;
  environment.kiln_python_dirs = kiln_python_dirs;
  for (const std::string& candidate : candidates) {
    const fs::path path = FindOnPath(candidate);
    if (path.empty() || environment.compilers.size() == 2) continue;
    CCompiler compiler;
    compiler.path = path;
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
  std::vector<fs::path> cuda_roots;
  for (const char* variable : {"CUDA_PATH", "CUDA_HOME"}) {
    if (const char* root = std::getenv(variable); root != nullptr && root[0] != '\0') {
      cuda_roots.emplace_back(root);
    }
  }
  cuda_roots.emplace_back("/usr/local/cuda");
  for (const fs::path& root : cuda_roots) {
    environment.cuda_include_dirs.push_back(root / "include");
    environment.cuda_stub_dirs.push_back(root / "lib64" / "stubs");
    environment.cuda_stub_dirs.push_back(root / "targets" / "x86_64-linux" / "lib" / "stubs");
  }
  return environment;
}

}  // namespace kiln::compiler
