#ifndef KILN_COMPILER_TOOLCHAIN_MEMO_H_
#define KILN_COMPILER_TOOLCHAIN_MEMO_H_

// What probing a toolchain found (its ToolchainInfo), remembered across
// kilnd's starts in a file of its data directory. Probing runs the
// interpreter until it has imported triton and hashed its install: a second
// under Wine, paid again at every start of a per-user kilnd (which exits when
// idle). A remembered probe holds while the interpreter's identity does: the
// size and modification time of the interpreter, of triton's __init__.py and
// of each file of triton/_C (its compiled library), which any install,
// upgrade or rebuild of either rewrites.

#include <filesystem>
#include <mutex>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "compiler/toolchain_info.h"

namespace kiln::compiler {

class ToolchainMemo {
 public:
  // Remembers nothing when `file` is empty.
  explicit ToolchainMemo(std::filesystem::path file);

  // The remembered probe of `python_executable`, while its identity is the
  // one it had when probed.
  std::optional<ToolchainInfo> Recall(const std::filesystem::path& python_executable);
  // Remembers a probe that just succeeded. Best effort: a memo that cannot
  // be written costs the next start a probe, nothing more.
  void Remember(const ToolchainInfo& info);

 private:
  struct Remembered {
    std::string identity;
    ToolchainInfo info;
  };
  void LoadLocked();

  const std::filesystem::path file_;
  std::mutex mutex_;
  bool loaded_ = false;                                      // guarded by mutex_
  absl::flat_hash_map<std::string, Remembered> by_python_;  // guarded by mutex_
};

// The identity of an interpreter and its triton (see above); empty when a
// file of it cannot be read.
std::string ToolchainIdentity(const std::filesystem::path& python_executable,
                              const std::filesystem::path& triton_dir);

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_TOOLCHAIN_MEMO_H_
