// Windows toolchain discovery and command lines, against a fake tree of
// Program Files, Visual Studio, CUDA and an embedded Python built here.

#include "compiler/windows_build.h"

#include <algorithm>
#include <fstream>

#include "compiler/build_environment.h"
#include "gtest/gtest.h"
#include "tests/test_dir.h"

namespace kiln::compiler {
namespace {

namespace fs = std::filesystem;

void Touch(const fs::path& path) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << "";
}

void MakeCuda(const fs::path& root) {
  Touch(root / "include" / "cuda.h");
  Touch(root / "lib" / "x64" / "cuda.lib");
  Touch(root / "bin" / "ptxas.exe");
}

TEST(WindowsCudaTest, PrefersCudaPathThenTheNewestVersionedInstall) {
  testing::TestDir dir;
  const fs::path program_files = dir.path() / "Program Files";
  const fs::path toolkits = program_files / "NVIDIA GPU Computing Toolkit" / "CUDA";
  MakeCuda(toolkits / "v12.8");
  MakeCuda(toolkits / "v12.10");
  MakeCuda(toolkits / "v11.8");
  WindowsEnvironment environment = {{"PROGRAMFILES", program_files.string()}};
  absl::StatusOr<CudaToolkit> found = FindCudaOnWindows(environment, {});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->root, toolkits / "v12.10");  // 12.10 is newer than 12.8
  EXPECT_EQ(found->lib_dir, toolkits / "v12.10" / "lib" / "x64");

  environment["CUDA_PATH_V12_8"] = (toolkits / "v12.8").string();
  environment["CUDA_PATH_V11_8"] = (toolkits / "v11.8").string();
  EXPECT_EQ(FindCudaOnWindows(environment, {})->root, toolkits / "v12.8");
  environment["CUDA_PATH"] = (toolkits / "v11.8").string();
  EXPECT_EQ(FindCudaOnWindows(environment, {})->root, toolkits / "v11.8");
}

TEST(WindowsCudaTest, FindsPipsSplitToolkitAndExplainsWhenThereIsNone) {
  testing::TestDir dir;
  const fs::path site = dir.path() / "python_embeded" / "Lib" / "site-packages";
  Touch(site / "nvidia" / "cuda_nvcc" / "bin" / "ptxas.exe");
  MakeCuda(site / "nvidia" / "cuda_runtime");
  absl::StatusOr<CudaToolkit> found = FindCudaOnWindows({}, {site / "triton"});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->include_dir, site / "nvidia" / "cuda_runtime" / "include");
  EXPECT_EQ(found->ptxas, site / "nvidia" / "cuda_nvcc" / "bin" / "ptxas.exe");

  absl::StatusOr<CudaToolkit> none = FindCudaOnWindows({}, {});
  EXPECT_TRUE(absl::IsFailedPrecondition(none.status()));
  EXPECT_NE(none.status().message().find("CUDA_PATH"), absl::string_view::npos);
  // ProgramFiles set, with no toolkit in it: the message names where it looked.
  const WindowsEnvironment program_files = {{"PROGRAMFILES", (dir.path() / "Program Files").string()}};
  absl::StatusOr<CudaToolkit> missing = FindCudaOnWindows(program_files, {});
  EXPECT_NE(missing.status().message().find("NVIDIA GPU Computing Toolkit"), absl::string_view::npos)
      << missing.status();
}

// triton-windows carries cuda.h, cuda.lib and ptxas.exe in its backends\nvidia
// and uses them before an installed toolkit: so do its launcher builds.
TEST(WindowsCudaTest, UsesTheCudaFilesTritonWindowsBundlesBeforeProgramFiles) {
  testing::TestDir dir;
  const fs::path triton = dir.path() / "python_embeded" / "Lib" / "site-packages" / "triton";
  MakeCuda(triton / "backends" / "nvidia");
  const fs::path program_files = dir.path() / "Program Files";
  MakeCuda(program_files / "NVIDIA GPU Computing Toolkit" / "CUDA" / "v12.8");
  absl::StatusOr<CudaToolkit> found =
      FindCudaOnWindows({{"PROGRAMFILES", program_files.string()}}, {triton});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->lib_dir, triton / "backends" / "nvidia" / "lib" / "x64");
  EXPECT_EQ(found->ptxas, triton / "backends" / "nvidia" / "bin" / "ptxas.exe");
}

TEST(WindowsPythonTest, EmbeddedPythonUsesKilnsOwnHeadersAndImportLibrary) {
  testing::TestDir dir;
  const FoundCompiler cl{WindowsCompiler::kMsvc, dir.path() / "VC" / "cl.exe"};
  const std::vector<fs::path> kiln = {dir.path() / "kiln"};
  const fs::path installed = dir.path() / "Python312";
  Touch(installed / "include" / "Python.h");
  Touch(installed / "libs" / "python312.lib");
  absl::StatusOr<PythonBuildFiles> files = FindPythonBuildFiles(installed, "3.12", kiln, cl);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->include_dir, installed / "include");
  EXPECT_EQ(files->library, "python312");

  const fs::path embedded = dir.path() / "ComfyUI" / "python_embeded";
  Touch(embedded / "python.exe");
  absl::StatusOr<PythonBuildFiles> missing = FindPythonBuildFiles(embedded, "3.12", kiln, cl);
  EXPECT_TRUE(absl::IsFailedPrecondition(missing.status()));
  EXPECT_NE(missing.status().message().find("python312.lib"), absl::string_view::npos);
  EXPECT_NE(missing.status().message().find("install-kiln.ps1"), absl::string_view::npos);

  Touch(dir.path() / "kiln" / "3.12" / "include" / "Python.h");
  Touch(dir.path() / "kiln" / "3.12" / "libs" / "python312.lib");
  files = FindPythonBuildFiles(embedded, "3.12", kiln, cl);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->library_dir, dir.path() / "kiln" / "3.12" / "libs");
}

// ComfyUI's python_embeded with nothing but Kiln installed: headers from the
// release beside kilnd.exe, the import library from triton-windows' TinyCC.
TEST(WindowsPythonTest, TinyCCNeedsOnlyHeadersBesideTheDefTritonShips) {
  testing::TestDir dir;
  const fs::path embedded = dir.path() / "python_embeded";
  Touch(embedded / "python.exe");
  const fs::path tcc_dir = embedded / "Lib" / "site-packages" / "triton" / "runtime" / "tcc";
  const FoundCompiler tcc{WindowsCompiler::kTinyCC, tcc_dir / "tcc.exe"};
  const FoundCompiler cl{WindowsCompiler::kMsvc, dir.path() / "VC" / "cl.exe"};
  const std::vector<fs::path> kiln = {dir.path() / "ProgramData" / "kiln" / "python",
                                      dir.path() / "Kiln" / "python"};
  Touch(tcc_dir / "lib" / "python313.def");
  Touch(kiln[1] / "3.13" / "include" / "Python.h");
  Touch(kiln[1] / "3.14" / "include" / "Python.h");

  absl::StatusOr<PythonBuildFiles> files = FindPythonBuildFiles(embedded, "3.13", kiln, tcc);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->include_dir, kiln[1] / "3.13" / "include");
  EXPECT_EQ(files->library_dir, tcc_dir / "lib");
  EXPECT_EQ(files->library, "python313");

  // MSVC cannot link a .def: it still needs python313.lib, and says so.
  absl::StatusOr<PythonBuildFiles> msvc = FindPythonBuildFiles(embedded, "3.13", kiln, cl);
  EXPECT_TRUE(absl::IsFailedPrecondition(msvc.status()));
  EXPECT_NE(msvc.status().message().find("libs\\python313.lib"), absl::string_view::npos);

  // A version Kiln carries no headers for: what is missing, what Kiln has, the fix.
  Touch(tcc_dir / "lib" / "python312.def");
  absl::StatusOr<PythonBuildFiles> older = FindPythonBuildFiles(embedded, "3.12", kiln, tcc);
  ASSERT_TRUE(absl::IsFailedPrecondition(older.status()));
  const std::string message(older.status().message());
  EXPECT_NE(message.find("no include\\Python.h for Python 3.12"), std::string::npos) << message;
  EXPECT_NE(message.find("headers for Python 3.13, 3.14 only"), std::string::npos) << message;
  EXPECT_NE(message.find("installer of Python 3.12 into " + embedded.string()), std::string::npos) << message;
  EXPECT_EQ(message.find(".def"), std::string::npos) << "the .def was found: " << message;
}

TEST(WindowsCompilerTest, PrefersMsvcThenClangThenTritonsTinyCC) {
  testing::TestDir dir;
  const fs::path vs = dir.path() / "Microsoft Visual Studio" / "2022" / "BuildTools";
  const fs::path cl = vs / "VC" / "Tools" / "MSVC" / "14.40.33807" / "bin" / "Hostx64" / "x64" / "cl.exe";
  const fs::path clang = dir.path() / "LLVM" / "bin" / "clang.exe";
  const fs::path tcc = dir.path() / "triton" / "runtime" / "tcc" / "tcc.exe";
  Touch(tcc);
  WindowsEnvironment environment = {{"PATH", (dir.path() / "LLVM" / "bin").string()}};
  EXPECT_EQ(FindCompilerOnWindows(environment, vs, dir.path() / "triton")->kind,
            WindowsCompiler::kTinyCC);
  Touch(clang);
  EXPECT_EQ(FindCompilerOnWindows(environment, vs, dir.path() / "triton")->path, clang);
  Touch(cl);
  absl::StatusOr<FoundCompiler> msvc = FindCompilerOnWindows(environment, vs, dir.path() / "triton");
  EXPECT_EQ(msvc->kind, WindowsCompiler::kMsvc);
  EXPECT_EQ(msvc->path, cl);
  EXPECT_TRUE(absl::IsFailedPrecondition(FindCompilerOnWindows({}, {}, {}).status()));
}

TEST(WindowsCommandTest, MsvcClangAndTinyCCCommandLines) {
  const std::vector<std::string> includes = {"C:\\cuda\\include", "C:\\py\\include"};
  const std::vector<std::string> library_dirs = {"C:\\cuda\\lib\\x64", "C:\\py\\libs"};
  const std::vector<std::string> libraries = {"cuda", "python312"};
  EXPECT_EQ(WindowsLauncherCommand(WindowsCompiler::kMsvc, "cl.exe", "launcher.c",
                                   "__triton_launcher.cp312-win_amd64.pyd", includes, library_dirs,
                                   libraries),
            (std::vector<std::string>{"cl.exe", "/nologo", "/O2", "/LD", "launcher.c",
                                      "/Fe:__triton_launcher.cp312-win_amd64.pyd",
                                      "/IC:\\cuda\\include", "/IC:\\py\\include", "/link",
                                      "/LIBPATH:C:\\cuda\\lib\\x64", "/LIBPATH:C:\\py\\libs",
                                      "cuda.lib", "python312.lib"}));
  const std::vector<std::string> clang = WindowsLauncherCommand(
      WindowsCompiler::kClang, "clang.exe", "launcher.c", "m.pyd", includes, library_dirs, libraries);
  EXPECT_EQ(clang, (std::vector<std::string>{"clang.exe", "launcher.c", "-O3", "-shared", "-o",
                                             "m.pyd", "-IC:\\cuda\\include", "-IC:\\py\\include",
                                             "-LC:\\cuda\\lib\\x64", "-LC:\\py\\libs", "-lcuda",
                                             "-lpython312"}));
  const std::vector<std::string> tcc = WindowsLauncherCommand(
      WindowsCompiler::kTinyCC, "tcc.exe", "launcher.c", "m.pyd", includes, library_dirs, libraries);
  EXPECT_EQ(tcc[1], "launcher.c");
  EXPECT_EQ(std::count(tcc.begin(), tcc.end(), "-O3"), 0);
  EXPECT_EQ(std::count(tcc.begin(), tcc.end(), "-D_Py_USE_GCC_BUILTIN_ATOMICS"), 1);
  for (const auto* command : {&clang, &tcc}) {
    EXPECT_EQ(std::count(command->begin(), command->end(), "-fPIC"), 0);
  }
}

// What kilnd runs to build a launcher for ComfyUI's embedded Python: the
// Python import library comes from Kiln's copy, cuda.lib from the toolkit.
TEST(WindowsCommandTest, LauncherBuildForAnEmbeddedPythonLinksKilnsCopyOfItsLibrary) {
  testing::TestDir dir;
  const fs::path embedded = dir.path() / "ComfyUI" / "python_embeded";
  Touch(embedded / "python.exe");
  const fs::path kiln_python = dir.path() / "kiln" / "python";
  BuildEnvironment environment;
  environment.kiln_python_dirs = {kiln_python};
  environment.cuda_include_dirs = {dir.path() / "CUDA" / "include"};
  environment.cuda_library_dirs = {dir.path() / "CUDA" / "lib" / "x64"};
  CCompiler cl;
  cl.path = dir.path() / "VC" / "cl.exe";
  cl.windows = WindowsCompiler::kMsvc;
  LauncherRequest request;
  request.module_name = "__triton_launcher";
  request.abi.version = "3.12";
  request.abi.ext_suffix = ".cp312-win_amd64.pyd";
  request.abi.include_dir = (embedded / "Include").string();  // what sysconfig says; absent
  request.libraries = {"cuda"};
  const fs::path scratch = dir.path() / "scratch";

  absl::StatusOr<std::vector<std::string>> missing =
      LauncherCompileCommand(cl, environment, request, scratch);
  EXPECT_TRUE(absl::IsFailedPrecondition(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("install-kiln.ps1"), absl::string_view::npos);

  Touch(kiln_python / "3.12" / "include" / "Python.h");
  Touch(kiln_python / "3.12" / "libs" / "python312.lib");
  absl::StatusOr<std::vector<std::string>> command =
      LauncherCompileCommand(cl, environment, request, scratch);
  ASSERT_TRUE(command.ok()) << command.status();
  auto has = [&](const std::string& argument) {
    return std::find(command->begin(), command->end(), argument) != command->end();
  };
  EXPECT_EQ(command->front(), cl.path.string());
  EXPECT_TRUE(has("/LD"));
  EXPECT_TRUE(has((scratch / "__triton_launcher.c").string()));
  EXPECT_TRUE(has("/Fe:" + (scratch / "__triton_launcher.cp312-win_amd64.pyd").string()));
  EXPECT_TRUE(has("/I" + (kiln_python / "3.12" / "include").string()));
  EXPECT_TRUE(has("/I" + (dir.path() / "CUDA" / "include").string()));
  EXPECT_TRUE(has("/LIBPATH:" + (kiln_python / "3.12" / "libs").string()));
  EXPECT_TRUE(has("/LIBPATH:" + (dir.path() / "CUDA" / "lib" / "x64").string()));
  EXPECT_TRUE(has("cuda.lib"));
  EXPECT_TRUE(has("python312.lib"));
  EXPECT_FALSE(has("-fPIC"));

  // The same request with gcc on Linux keeps Triton's own command line.
  CCompiler gcc;
  gcc.path = "/usr/bin/gcc";
  request.abi.include_dir = "/usr/include/python3.12";
  absl::StatusOr<std::vector<std::string>> linux_command =
      LauncherCompileCommand(gcc, environment, request, scratch);
  ASSERT_TRUE(linux_command.ok());
  EXPECT_NE(std::find(linux_command->begin(), linux_command->end(), "-fPIC"), linux_command->end());
  EXPECT_NE(std::find(linux_command->begin(), linux_command->end(), "-lcuda"), linux_command->end());
}

TEST(LauncherLinkTest, WithoutAGpuDriverTheCudaToolkitsStubIsLinked) {
  kiln::testing::TestDir dir;
  LauncherRequest request;
  request.libraries = {"libcuda.so.1"};
  request.library_dirs = {(dir.path() / "triton" / "lib").string()};
  BuildEnvironment environment;
  environment.cuda_stub_dirs = {dir.path() / "cuda" / "lib64" / "stubs"};

  // Neither a driver nor a toolkit: what to install is named.
  absl::Status none = LinkStubWithoutDriver(environment, request);
  EXPECT_TRUE(absl::IsFailedPrecondition(none)) << none;
  EXPECT_NE(none.message().find("CUDA toolkit"), absl::string_view::npos);

  // The toolkit's stub (SONAME libcuda.so.1) stands in for the driver's library.
  Touch(dir.path() / "cuda" / "lib64" / "stubs" / "libcuda.so");
  LauncherRequest with_stub = request;
  ASSERT_TRUE(LinkStubWithoutDriver(environment, with_stub).ok());
  EXPECT_EQ(with_stub.libraries, std::vector<std::string>{"cuda"});
  EXPECT_EQ(with_stub.library_dirs.back(), (dir.path() / "cuda" / "lib64" / "stubs").string());

  // A driver's libcuda.so.1 among the library dirs is linked as Triton links it.
  Touch(dir.path() / "triton" / "lib" / "libcuda.so.1");
  LauncherRequest with_driver = request;
  ASSERT_TRUE(LinkStubWithoutDriver(environment, with_driver).ok());
  EXPECT_EQ(with_driver.libraries, request.libraries);
  EXPECT_EQ(with_driver.library_dirs, request.library_dirs);
}

}  // namespace
}  // namespace kiln::compiler
