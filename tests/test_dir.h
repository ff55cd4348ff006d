#ifndef KILN_TESTS_TEST_DIR_H_
#define KILN_TESTS_TEST_DIR_H_

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
    std::random_device random;
    path_ = std::filesystem::path(base != nullptr ? base : "/tmp") /
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
