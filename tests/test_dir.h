#ifndef KILN_TESTS_TEST_DIR_H_
#define KILN_TESTS_TEST_DIR_H_

#ifdef _WIN32
#include "common/windows_api.h"
#endif

#include <filesystem>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace kiln::testing {

// A fresh directory per test under $TEST_TMPDIR (or the system temp dir),
// short enough for a Unix socket path. Removed when the test passes, kept for
// inspection when it fails.
class TestDir {
 public:
  TestDir() {
    const char* base = std::getenv("TEST_TMPDIR");
#ifdef _WIN32
    const std::filesystem::path fallback = std::filesystem::temp_directory_path();
#else
    const std::filesystem::path fallback = "/tmp";  // TMPDIR may be too long for a socket path
#endif
    std::random_device random;
    path_ = (base != nullptr ? std::filesystem::path(base) : fallback) /
            ("kiln-t" + std::to_string(random() % 1000000000));
    std::filesystem::create_directories(path_);
  }
  ~TestDir() {
    if (::testing::Test::HasFailure()) {
      std::cerr << "test files kept in " << path_ << "\n";
      return;
    }
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

#ifdef _WIN32
// True when the Windows tests run under Wine (CI), which implements some
// Win32 calls without their effect (file DACLs, service recovery actions).
inline bool UnderWine() {
  const HMODULE ntdll = GetModuleHandleW(L"ntdll.dll");
  return ntdll != nullptr && GetProcAddress(ntdll, "wine_get_version") != nullptr;
}
#endif

// Deterministic bytes of a given size for a seed; compressible when asked.
inline std::string TestBytes(size_t size, uint32_t seed, bool compressible = false) {
  std::mt19937 generator(seed);
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    data[i] = compressible ? static_cast<char>('a' + (i / 64 + seed) % 4)
                           : static_cast<char>(generator());
  }
  return data;
}

}  // namespace kiln::testing

#endif  // KILN_TESTS_TEST_DIR_H_
