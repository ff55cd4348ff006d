#ifndef KILN_COMPILER_TOOLCHAIN_INFO_H_
#define KILN_COMPILER_TOOLCHAIN_INFO_H_

#include <string>
#include <vector>

namespace kiln::compiler {

// What a toolchain's probe found: its interpreter and triton.
struct ToolchainInfo {
  std::string triton_key;  // triton.runtime.cache.triton_key()
  std::string triton_version;
  std::string python_executable;
  std::string python_version;
  std::vector<std::string> backends;
  std::string triton_dir;  // where the triton package is (triton-windows bundles TinyCC there)
  // This run took it from an earlier start's probe (ToolchainMemo), not
  // from a probe of its own.
  bool remembered = false;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_TOOLCHAIN_INFO_H_
