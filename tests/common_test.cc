#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <filesystem>
#include <functional>
#include <future>
#include <fstream>
#include <thread>

#include "common/byte_size.h"
#include "common/ed25519.h"
#include "common/json_syntax.h"
#include "common/latency_histogram.h"
#include "common/platform.h"
#include "common/sha256.h"
#include "common/subprocess.h"
#include "common/thread_pool.h"
#include "common/gpu_targets.h"
#include "gtest/gtest.h"
#include "tests/test_dir.h"

namespace kiln {
namespace {

TEST(ByteSizeTest, ParsesUnitsAndRefusesJunk) {
  EXPECT_EQ(*ParseByteSize("512"), 512u);
  EXPECT_EQ(*ParseByteSize("64MiB"), 64ull << 20);
  EXPECT_EQ(*ParseByteSize("10 GiB"), 10ull << 30);
  EXPECT_EQ(*ParseByteSize("4k"), 4096u);
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("-1").ok());
  EXPECT_FALSE(ParseByteSize("3 parsecs").ok());
  EXPECT_FALSE(ParseByteSize("99999999999999999999").ok());
  EXPECT_FALSE(ParseByteSize("17179869184 TiB").ok());
  EXPECT_EQ(FormatByteSize(10ull << 30), "10.0 GiB");
}

TEST(Sha256Test, MatchesTheKnownDigestOfAbc) {
  EXPECT_EQ(DigestHex(DigestBytes(Sha256("abc"))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// Keys as a publisher makes them, with the openssl command the docs name.
class Ed25519Test : public ::testing::Test {
 protected:
  std::string MakeKey(const std::vector<std::string>& genpkey_args, const std::string& name) {
    const std::filesystem::path path = dir_.path() / name;
    std::vector<std::string> argv = {"openssl", "genpkey"};
    argv.insert(argv.end(), genpkey_args.begin(), genpkey_args.end());
    argv.insert(argv.end(), {"-out", path.string()});
    absl::StatusOr<CommandResult> made = RunCommand(argv, absl::Seconds(60));
    EXPECT_TRUE(made.ok() && made->succeeded) << (made.ok() ? made->errors : made.status().ToString());
    return ReadFile(path);
  }
  std::string PublicHalf(const std::string& private_pem) {
    const std::filesystem::path in = dir_.path() / "in.pem";
    const std::filesystem::path out = dir_.path() / "out.pub.pem";
    std::ofstream(in) << private_pem;
    absl::StatusOr<CommandResult> made = RunCommand(
        {"openssl", "pkey", "-in", in.string(), "-pubout", "-out", out.string()}, absl::Seconds(60));
    EXPECT_TRUE(made.ok() && made->succeeded);
    return ReadFile(out);
  }
  static std::string ReadFile(const std::filesystem::path& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  testing::TestDir dir_;
};

TEST_F(Ed25519Test, ASignatureVerifiesUnderItsKeyAloneAndForItsMessageAlone) {
  const std::string pem = MakeKey({"-algorithm", "ed25519"}, "a.pem");
  absl::StatusOr<Ed25519PrivateKey> signer = Ed25519PrivateKey::FromPem(pem, "a.pem");
  ASSERT_TRUE(signer.ok()) << signer.status();
  absl::StatusOr<Ed25519PublicKey> verifier = Ed25519PublicKey::FromPem(PublicHalf(pem), "a.pub.pem");
  ASSERT_TRUE(verifier.ok()) << verifier.status();
  EXPECT_EQ(signer->id(), verifier->id());
  EXPECT_EQ(signer->id().size(), 64u);

  absl::StatusOr<std::string> signature = signer->Sign("bundle digest");
  ASSERT_TRUE(signature.ok()) << signature.status();
  EXPECT_EQ(signature->size(), kEd25519SignatureSize);
  EXPECT_TRUE(verifier->Verifies("bundle digest", *signature));
  EXPECT_FALSE(verifier->Verifies("bundle digesT", *signature));
  std::string flipped = *signature;
  flipped[10] ^= 1;
  EXPECT_FALSE(verifier->Verifies("bundle digest", flipped));
  EXPECT_FALSE(verifier->Verifies("bundle digest", signature->substr(1)));

  // Another key: another id, and it verifies none of a's signatures.
  absl::StatusOr<Ed25519PublicKey> other =
      Ed25519PublicKey::FromPem(MakeKey({"-algorithm", "ed25519"}, "b.pem"), "b.pem");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(other->id(), signer->id());
  EXPECT_FALSE(other->Verifies("bundle digest", *signature));
}

TEST_F(Ed25519Test, WhatIsNotAnEd25519KeyIsRefusedNamingItsSourceAndHowToMakeOne) {
  const std::string rsa = MakeKey({"-algorithm", "rsa", "-pkeyopt", "rsa_keygen_bits:2048"}, "rsa.pem");
  const std::string encrypted =
      MakeKey({"-algorithm", "ed25519", "-aes-128-cbc", "-pass", "pass:secret"}, "enc.pem");
  for (const auto& [pem, source] : std::vector<std::pair<std::string, std::string>>{
           {rsa, "rsa.pem"}, {encrypted, "enc.pem"}, {"not a key", "junk.pem"}, {"", "empty.pem"}}) {
    absl::StatusOr<Ed25519PrivateKey> private_key = Ed25519PrivateKey::FromPem(pem, source);
    ASSERT_FALSE(private_key.ok()) << source;
    EXPECT_EQ(private_key.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(private_key.status().message().find(source), std::string::npos);
    EXPECT_NE(private_key.status().message().find("openssl genpkey -algorithm ed25519"), std::string::npos);
    EXPECT_FALSE(Ed25519PublicKey::FromPem(pem == encrypted ? "" : pem, source).ok()) << source;
  }
}

TEST(Sha256Test, AStreamGivenPiecesDigestsTheirConcatenationAndStartsAgain) {
  Sha256Stream stream;
  stream.Update("a");
  stream.Update("");
  stream.Update("bc");
  EXPECT_EQ(stream.Finish(), Sha256("abc"));
  stream.Update("xyz");
  Sha256Stream moved = std::move(stream);
  EXPECT_EQ(moved.Finish(), Sha256("xyz"));
}

TEST(JsonSyntaxTest, AcceptsObjectsAsTritonWritesThem) {
  // Triton's metadata, as json.dumps writes it (abridged).
  EXPECT_TRUE(IsJsonObject(
      R"({"hash": "9f2c", "target": {"backend": "cuda", "arch": 90, "warp_size": 32}, )"
      R"("num_warps": 4, "cluster_dims": [1, 1, 1], "debug": false, "sanitize_overflow": true, )"
      R"("extern_libs": [["libdevice", "/x/libdevice.10.bc"]], "shared": 0, "tmem_size": null, )"
      R"("name": "add_kernel", "allowed_dot_input_precisions": ["tf32", "tf32x3", "ieee"]})"));
  EXPECT_TRUE(IsJsonObject("{}"));
  EXPECT_TRUE(IsJsonObject(" \n\t{ } \r\n"));
  EXPECT_TRUE(IsJsonObject(R"({"a": -0.5e-3, "b": 10E+2, "c": 0, "d": -12.25})"));
  EXPECT_TRUE(
      IsJsonObject(R"({"escapes \" \\ \/ \b \f \n \r \t \u00e9 \uD83D": "\u0041", "": [[], {}]})"));
  EXPECT_TRUE(IsJsonObject("{\"utf-8\": \"\xc3\xa9\"}"));
}

TEST(JsonSyntaxTest, RefusesWhatIsNotOneJsonObject) {
  for (const char* text : {
           "", "   ", "[1, 2]", "\"text\"", "42", "null",          // not an object
           "{", "{\"a\": 1", "{\"a\": [1, 2}", "{\"a\" 1}",      // unterminated, unbalanced
           "{\"a\": 1,}", "{,}", "{\"a\": [1,]}", "{\"a\": 1 \"b\": 2}",
           "{a: 1}", "{'a': 1}", "{\"a\": 'b'}", "{1: 2}",        // keys and quotes
           "{\"a\": 01}", "{\"a\": 1.}", "{\"a\": .5}", "{\"a\": 1e}", "{\"a\": +1}",
           "{\"a\": -}", "{\"a\": NaN}", "{\"a\": Infinity}", "{\"a\": 0x10}",
           "{\"a\": tru}", "{\"a\": True}", "{\"a\": nul}",
           "{\"a\": \"\\x41\"}", "{\"a\": \"\\u12G4\"}", "{\"a\": \"\\u12\"}",
           "{\"a\": \"tab\there\"}",
           "{\"a\": \"unterminated}", "{\"a\": \"ends in a backslash\\",
           "{} {}", "{}x", "{\"a\": 1}]"}) {
    EXPECT_FALSE(IsJsonObject(text)) << text;
  }
  EXPECT_FALSE(IsJsonObject(absl::string_view("{\"a\": 1}\0", 9))) << "a NUL after the object";
}

TEST(JsonSyntaxTest, NestingIsLimitedSoNoInputExhaustsTheStack) {
  auto nested = [](int depth) {
    std::string text;
    for (int i = 0; i < depth; ++i) text += i == 0 ? "{\"a\": " : "[";
    text += "0";
    for (int i = depth - 1; i >= 0; --i) text += i == 0 ? "}" : "]";
    return text;
  };
  EXPECT_TRUE(IsJsonObject(nested(kMaxJsonDepth)));
  EXPECT_FALSE(IsJsonObject(nested(kMaxJsonDepth + 1)));
  EXPECT_FALSE(IsJsonObject(nested(1000000)));
}

// Sets the flag it is given when its thread exits.
struct ThreadExitWatch {
  std::atomic<bool>* exited = nullptr;
  ~ThreadExitWatch() {
    if (exited != nullptr) *exited = true;
  }
};
thread_local ThreadExitWatch thread_exit_watch;

// Runs `count` tasks on `pool`, each waiting until all have started, and says
// whether they all started; `first` runs in each task, given its index.
bool StartsABatchAtOnce(ThreadPool& pool, int count, const std::function<void(int)>& first) {
  std::mutex mutex;
  std::condition_variable all_started;
  int started = 0;
  std::vector<std::promise<bool>> results(count);
  for (int i = 0; i < count; ++i) {
    pool.Schedule([&, i] {
      first(i);
      std::unique_lock lock(mutex);
      ++started;
      all_started.notify_all();
      // Bounded, so a pool that does not grow fails the test rather than hanging it.
      const bool all_at_once =
          all_started.wait_for(lock, std::chrono::seconds(10), [&] { return started == count; });
      // Unlocked first: once the last result is set, this function returns and the mutex is gone.
      lock.unlock();
      results[i].set_value(all_at_once);
    });
  }
  bool all = true;
  for (std::promise<bool>& result : results) all = result.get_future().get() && all;
  return all;
}

TEST(ThreadPoolTest, GrowingPoolStartsEveryTaskAtOnceAndKeepsItsThreadsUntilDestroyed) {
  std::array<std::atomic<bool>, 6> exited{};
  {
    ThreadPool pool{ThreadPool::GrowWithDemand{}};
    EXPECT_TRUE(StartsABatchAtOnce(pool, 6, [&](int i) { thread_exit_watch.exited = &exited[i]; }));
    EXPECT_TRUE(StartsABatchAtOnce(pool, 6, [](int) {}));
    for (const std::atomic<bool>& flag : exited) {
      EXPECT_FALSE(flag) << "a thread exited when its task ended";
    }
  }
  for (const std::atomic<bool>& flag : exited) EXPECT_TRUE(flag) << "the pool's threads end with it";
}

#ifdef __linux__
int NiceOfThisThread() { return getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid))); }

int NiceOfAPoolThread(ThreadPool::CpuPriority cpu) {
  ThreadPool pool(1, cpu);
  std::promise<int> nice;
  pool.Schedule([&] { nice.set_value(NiceOfThisThread()); });
  return nice.get_future().get();
}

TEST(ThreadPoolTest, LoweredCpuThreadsRunTenNiceStepsBelowTheirCreator) {
  const int creator = NiceOfThisThread();
  EXPECT_EQ(NiceOfAPoolThread(ThreadPool::kNormalCpu), creator);
  EXPECT_EQ(NiceOfAPoolThread(ThreadPool::kLoweredCpu), std::min(creator + 10, 19));
  EXPECT_EQ(NiceOfThisThread(), creator) << "only the pool's own threads are lowered";
}
#endif

TEST(LatencyHistogramTest, PercentilesAreWithinOneBucket) {
  LatencyHistogram histogram;
  for (int i = 1; i <= 1000; ++i) histogram.Record(absl::Microseconds(i));
  const LatencyHistogram::Summary summary = histogram.Summarize();
  EXPECT_EQ(summary.count, 1000u);
  EXPECT_NEAR(absl::ToDoubleMicroseconds(summary.p50), 500, 500 * 0.1);
  EXPECT_NEAR(absl::ToDoubleMicroseconds(summary.p99), 990, 990 * 0.1);
  EXPECT_EQ(summary.max, absl::Microseconds(1000));
  EXPECT_LE(summary.p99, summary.max);
}

TEST(LatencyHistogramTest, CountsEveryRecordFromManyThreads) {
  LatencyHistogram histogram;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) histogram.Record(absl::Nanoseconds(i));
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(histogram.Summarize().count, 40000u);
}

TEST(PlatformTest, PrivateDirectoryIsCreatedOwnerOnlyAndTightened) {
  testing::TestDir dir;
  const auto created = dir.path() / "a" / "sock";
  ASSERT_TRUE(platform::EnsurePrivateDirectory(created).ok());
  struct stat info {};
  ASSERT_EQ(stat(created.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700u);
  chmod(created.c_str(), 0777);
  ASSERT_TRUE(platform::EnsurePrivateDirectory(created).ok());
  ASSERT_EQ(stat(created.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700u);
}

TEST(PlatformTest, SymlinkedSocketDirectoryIsRefused) {
  testing::TestDir dir;
  std::filesystem::create_directory(dir.path() / "elsewhere");
  std::filesystem::create_directory_symlink(dir.path() / "elsewhere", dir.path() / "link");
  absl::Status status = platform::EnsurePrivateDirectory(dir.path() / "link");
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
}

TEST(PlatformTest, SecondLockOnAFileFails) {
  testing::TestDir dir;
  auto first = platform::TryLockFile(dir.path() / "lock");
  ASSERT_TRUE(first.ok());
  auto second = platform::TryLockFile(dir.path() / "lock");
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status()));
  first->reset();
  EXPECT_TRUE(platform::TryLockFile(dir.path() / "lock").ok());
}

TEST(PlatformTest, WaitingForALockEndsWhenItsHolderLetsGoOrAtTheDeadline) {
  testing::TestDir dir;
  const std::filesystem::path path = dir.path() / "autostart.lock";
  auto held = platform::TryLockFile(path);
  ASSERT_TRUE(held.ok());
  auto timed_out = platform::WaitForFileLock(path, absl::Now() + absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(timed_out.status())) << timed_out.status();
  EXPECT_NE(timed_out.status().message().find(path.string()), std::string::npos);

  std::thread holder([lock = std::move(*held)]() mutable {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    lock.reset();
  });
  auto taken = platform::WaitForFileLock(path, absl::Now() + absl::Seconds(30));
  holder.join();
  EXPECT_TRUE(taken.ok()) << taken.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(platform::TryLockFile(path).status()));
}

// A detached process outlives its parent's session and takes none of the
// variables it was told to drop.
TEST(SubprocessTest, ADetachedProcessHasASessionOfItsOwnAndLessTheDroppedVariables) {
  testing::TestDir dir;
  const std::filesystem::path report = dir.path() / "report";
  setenv("KILN_TEST_DROPPED", "client setting", 1);
  setenv("KILN_TEST_KEPT_ELSEWHERE", "kept", 1);
  const absl::Status spawned = SpawnDetached(
      {"/bin/sh", "-c",
       "echo \"${KILN_TEST_DROPPED-unset} ${KILN_TEST_KEPT_ELSEWHERE-unset} $(cut -d' ' -f6 "
       "/proc/$$/stat) $$\" >\"$0.part\" && mv \"$0.part\" \"$0\"",
       report.string()},
      {"KILN_TEST_DROPPED"});
  unsetenv("KILN_TEST_DROPPED");
  unsetenv("KILN_TEST_KEPT_ELSEWHERE");
  ASSERT_TRUE(spawned.ok()) << spawned;
  // Nothing waits for a detached process: its report is polled for.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (!std::filesystem::exists(report) && absl::Now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string dropped, kept;
  pid_t session = 0, pid = 0;
  std::ifstream(report) >> dropped >> kept >> session >> pid;
  EXPECT_EQ(dropped, "unset");
  EXPECT_EQ(kept, "kept");
  EXPECT_EQ(session, pid) << "not the leader of a session of its own";
  EXPECT_NE(session, getsid(0));

  EXPECT_TRUE(absl::IsFailedPrecondition(SpawnDetached({"/nonexistent/kilnd"}, {})));
}

TEST(FileStampTest, ChangesWithTheContentEvenWhenTheModificationTimeIsPutBack) {
  testing::TestDir dir;
  const std::filesystem::path file = dir.path() / "blob";
  std::ofstream(file) << "version 1";
  absl::StatusOr<platform::FileStamp> first = platform::StampOf(file);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*platform::StampOf(file), *first);
  EXPECT_LT(absl::AbsDuration(platform::ChangeTime(*first) - absl::Now()), absl::Minutes(5));
  // File times tick coarsely; the change must fall in a later tick to show.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto modified = std::filesystem::last_write_time(file);
  std::ofstream(file) << "version 2";  // the same size
  std::filesystem::last_write_time(file, modified);
  absl::StatusOr<platform::FileStamp> second = platform::StampOf(file);
  ASSERT_TRUE(second.ok());
  EXPECT_NE(*second, *first);
  EXPECT_TRUE(absl::IsNotFound(platform::StampOf(dir.path() / "missing").status()));
}

TEST(GpuTargetsTest, ComputeCapabilitiesAsNvidiaSmiPrintsThemAreTargets) {
  EXPECT_EQ(ParseComputeCapabilities("8.9\n9.0\n8.9\n"), (std::vector<std::string>{"cuda:89", "cuda:90"}));
  EXPECT_EQ(ParseComputeCapabilities(" 12.0 \r\n"), (std::vector<std::string>{"cuda:120"}));
  EXPECT_TRUE(ParseComputeCapabilities("[N/A]\nNo devices were found\n9\n9.x\n").empty());
}

}  // namespace
}  // namespace kiln
