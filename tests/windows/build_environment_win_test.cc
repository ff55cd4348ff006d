// kilnd's launcher-build discovery on Windows, in a real Windows process
// (under Wine in CI): the process environment of a Visual Studio developer
// prompt and a CUDA toolkit, both in a fake tree built here. The compiler is
// this executable copied to cl.exe (or tcc.exe): run under that name it prints
// that compiler's banner.

#include "common/windows_api.h"

#include <cstdio>
#include <fstream>

#include "common/platform.h"
#include "common/subprocess.h"
#include "compiler/build_environment.h"
#include "gtest/gtest.h"
#include "tests/test_dir.h"

namespace kiln::compiler {
namespace {

namespace fs = std::filesystem;

constexpr char kBanner[] = "Microsoft (R) C/C++ Optimizing Compiler Version 19.40.33811 for x64";

fs::path Self() {
  wchar_t buffer[MAX_PATH];
  GetModuleFileNameW(nullptr, buffer, MAX_PATH);
  return fs::path(buffer);
}

void Touch(const fs::path& path) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << "";
}

TEST(WindowsBuildEnvironmentTest, FindsMsvcFromTheDeveloperPromptAndTheCudaToolkit) {
  testing::TestDir dir;
  const fs::path tools = dir.path() / "VS" / "VC" / "Tools" / "MSVC" / "14.40.33807";
  const fs::path cl = tools / "bin" / "Hostx64" / "x64" / "cl.exe";
  fs::create_directories(cl.parent_path());
  fs::copy_file(Self(), cl);
  const fs::path cuda = dir.path() / "NVIDIA GPU Computing Toolkit" / "CUDA" / "v12.8";
  Touch(cuda / "include" / "cuda.h");
  Touch(cuda / "lib" / "x64" / "cuda.lib");
  SetEnvironmentVariableW(L"VCToolsInstallDir", tools.c_str());
  SetEnvironmentVariableW(L"CUDA_PATH", cuda.c_str());

  const fs::path kiln_python = platform::KilnPythonDir(platform::Scope::kMachine);
  absl::StatusOr<BuildEnvironment> environment = DiscoverBuildEnvironment("", {kiln_python});
  ASSERT_TRUE(environment.ok()) << environment.status();
  ASSERT_EQ(environment->compilers.size(), 1u);
  const CCompiler& compiler = environment->compilers.front();
  EXPECT_EQ(compiler.windows, WindowsCompiler::kMsvc);
  EXPECT_TRUE(fs::equivalent(compiler.path, cl));
  EXPECT_EQ(compiler.version, kBanner) << "the version is part of the launcher's cache key";
  EXPECT_EQ(environment->cuda_include_dirs, std::vector<fs::path>{cuda / "include"});
  EXPECT_EQ(environment->cuda_library_dirs, std::vector<fs::path>{cuda / "lib" / "x64"});
  EXPECT_EQ(environment->kiln_python_dirs, std::vector<fs::path>{kiln_python});

  // Without CUDA there is nothing to link the launcher against: say where we looked.
  SetEnvironmentVariableW(L"CUDA_PATH", nullptr);
  SetEnvironmentVariableW(L"ProgramFiles", (dir.path() / "empty").c_str());
  absl::StatusOr<BuildEnvironment> no_cuda = DiscoverBuildEnvironment("", {kiln_python});
  EXPECT_TRUE(absl::IsFailedPrecondition(no_cuda.status())) << no_cuda.status();
  EXPECT_NE(no_cuda.status().message().find("CUDA_PATH"), absl::string_view::npos);
}

// No Visual Studio, no clang: the TinyCC that triton-windows ships in its
// package, found through the registered toolchain's triton directory.
TEST(WindowsBuildEnvironmentTest, FallsBackToTheTinyCCInsideTriton) {
  testing::TestDir dir;
  const fs::path triton = dir.path() / "python_embeded" / "Lib" / "site-packages" / "triton";
  const fs::path tcc = triton / "runtime" / "tcc" / "tcc.exe";
  fs::create_directories(tcc.parent_path());
  fs::copy_file(Self(), tcc);
  const fs::path cuda = dir.path() / "CUDA";
  Touch(cuda / "include" / "cuda.h");
  Touch(cuda / "lib" / "x64" / "cuda.lib");
  SetEnvironmentVariableW(L"VCToolsInstallDir", nullptr);
  SetEnvironmentVariableW(L"CUDA_PATH", cuda.c_str());

  absl::StatusOr<BuildEnvironment> without_triton = DiscoverBuildEnvironment("", {});
  EXPECT_TRUE(absl::IsFailedPrecondition(without_triton.status())) << without_triton.status();
  EXPECT_NE(without_triton.status().message().find("Visual Studio Build Tools"),
            absl::string_view::npos);

  absl::StatusOr<BuildEnvironment> environment =
      DiscoverBuildEnvironment("", {}, {fs::path("C:\\no-triton-here"), triton});
  ASSERT_TRUE(environment.ok()) << environment.status();
  const CCompiler& compiler = environment->compilers.front();
  EXPECT_EQ(compiler.windows, WindowsCompiler::kTinyCC);
  EXPECT_EQ(compiler.flavor, CCompiler::Flavor::kTinyCC);
  EXPECT_TRUE(fs::equivalent(compiler.path, tcc));
  EXPECT_EQ(compiler.version, "tcc version 0.9.27 (x86_64 Windows)");
  SetEnvironmentVariableW(L"CUDA_PATH", nullptr);
}

TEST(WindowsBuildEnvironmentTest, AConfiguredCompilerThatDoesNotRunIsNamed) {
  absl::StatusOr<BuildEnvironment> environment =
      DiscoverBuildEnvironment("C:\\no\\such\\clang.exe", {});
  EXPECT_TRUE(absl::IsFailedPrecondition(environment.status())) << environment.status();
  EXPECT_NE(environment.status().message().find("clang.exe"), absl::string_view::npos);
}

}  // namespace
}  // namespace kiln::compiler

int main(int argc, char** argv) {
  if (kiln::compiler::Self().filename() == "cl.exe") {
    // cl without arguments: banner on stderr, usage on stdout.
    std::fprintf(stderr, "%s\nCopyright (C) Microsoft Corporation.  All rights reserved.\n",
                 kiln::compiler::kBanner);
    std::printf("usage: cl [ option... ] filename... [ /link linkoption... ]\n");
    return 0;
  }
  if (kiln::compiler::Self().filename() == "tcc.exe") {
    std::printf("tcc version 0.9.27 (x86_64 Windows)\n");
    return 0;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
