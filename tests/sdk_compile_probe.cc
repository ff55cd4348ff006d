// Drives the C++ SDK for tests/python/test_cli.py: compiles one IR file for
// several targets concurrently with Client::CompileFuture and writes each
// target's cubin to OUTDIR/<arch>.cubin.
//
// usage: sdk_compile_probe ENDPOINT FILE.ttir OUTDIR OPTIONS_JSON TARGET...

#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <iterator>
#include <vector>

#include "kiln/client.h"

int main(int argc, char** argv) {
  if (argc < 6) {
    std::cerr << "usage: sdk_compile_probe ENDPOINT FILE.ttir OUTDIR OPTIONS_JSON TARGET...\n";
    return 2;
  }
  kiln::ClientOptions options;
  options.endpoint = argv[1];
  kiln::Client client(options);
  std::ifstream in(argv[2], std::ios::binary);
  kiln::CompileInput input;
  input.ir.assign(std::istreambuf_iterator<char>(in), {});
  input.options_json = argv[4];
  std::vector<std::pair<std::string, std::future<absl::StatusOr<kiln::CompiledKernel>>>> pending;
  for (int i = 5; i < argc; ++i) {
    absl::StatusOr<kiln::v1::Target> target = kiln::ParseTarget(argv[i]);
    if (!target.ok()) {
      std::cerr << target.status() << "\n";
      return 2;
    }
    input.target = *target;
    pending.emplace_back(target->arch(), client.CompileFuture(input));
  }
  std::filesystem::create_directories(argv[3]);
  for (auto& [arch, future] : pending) {
    absl::StatusOr<kiln::CompiledKernel> kernel = future.get();
    if (!kernel.ok()) {
      std::cerr << kernel.status() << "\n";
      return 1;
    }
    std::ofstream(std::filesystem::path(argv[3]) / (arch + ".cubin"), std::ios::binary)
        << kernel->cubin();
    std::cout << kernel->name << " sm" << arch << " " << kernel->cubin().size() << "\n";
  }
  return 0;
}
