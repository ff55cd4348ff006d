// The compile worker pool's scheduling, with real worker processes: a
// stand-in for kiln_worker.py that speaks its protocol (what the pool decides
// is tested here, not Triton), run by the system's python3.

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <variant>

#include "compiler/toolchains.h"
#include "gtest/gtest.h"
#include "tests/test_dir.h"

namespace kiln::compiler {
namespace {

namespace fs = std::filesystem;

// Answers hello, ping and compile; each hello adds a line to <dir>/hellos, and
// names <dir>/triton as its triton when that exists. A worker started while <dir>/slow exists
// does not answer before <dir>/go does: it stands for one still importing
// triton; one started while <dir>/broken exists exits at once. A compile takes
// 0.3 s and returns the worker's pid, or kills the worker while <dir>/crash exists;
// each writes a line to stderr first.
constexpr char kStandInWorker[] = R"(
import json, os, struct, sys, time
here = os.path.dirname(os.path.abspath(__file__))
if os.path.exists(os.path.join(here, "broken")):
    sys.exit("cannot import triton")
if os.path.exists(os.path.join(here, "slow")):
    while not os.path.exists(os.path.join(here, "go")):
        time.sleep(0.01)
def read_exact(size):
    data = b""
    while len(data) < size:
        chunk = sys.stdin.buffer.read(size - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data
def write(header, parts):
    header = dict(header, parts=list(parts))
    out = [json.dumps(header).encode()] + list(parts.values())
    sys.stdout.buffer.write(b"".join(struct.pack("<I", len(chunk)) + chunk for chunk in out))
    sys.stdout.buffer.flush()
while True:
    header = json.loads(read_exact(struct.unpack("<I", read_exact(4))[0]))
    for _ in header.get("parts", []):
        read_exact(struct.unpack("<I", read_exact(4))[0])
    if header["op"] == "hello":
        with open(os.path.join(here, "hellos"), "a") as hellos:
            hellos.write("hello\n")
        triton = os.path.join(here, "triton")
        write({"ok": True, "triton_key": "stand-in", "triton_version": "0",
               "python_executable": sys.executable, "python_version": "3", "backends": ["nvidia"],
               "triton_dir": triton if os.path.isdir(triton) else here}, {})
    elif header["op"] == "compile":
        if os.path.exists(os.path.join(here, "crash")):
            print("dying words", file=sys.stderr, flush=True)
            os._exit(1)
        print("output of an earlier job", file=sys.stderr, flush=True)
        time.sleep(0.3)
        write({"ok": True}, {"pid": str(os.getpid()).encode()})
    else:
        write({"ok": True}, {})
)";

std::string PidOf(const absl::StatusOr<CompileResult>& result) {
  if (!result.ok()) return "error: " + std::string(result.status().message());
  const auto* output = std::get_if<CompileOutput>(&*result);
  if (output == nullptr || output->artifacts.empty()) return "failed";
  return output->artifacts.front().second;
}

// A pool of at most two stand-in workers, one of them started and ready.
class WorkerPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const fs::path python = "/usr/bin/python3";
    if (!fs::exists(python)) GTEST_SKIP() << "needs /usr/bin/python3";
    std::ofstream(dir.path() / "worker.py") << kStandInWorker;
    PoolOptions options;
    options.worker_script = dir.path() / "worker.py";
    options.max_workers = 2;
    registry = std::make_unique<ToolchainRegistry>(options);
    ASSERT_TRUE(registry->Register(python).ok());
    absl::StatusOr<WorkerPool*> found = registry->Find("stand-in");
    ASSERT_TRUE(found.ok());
    pool = *found;
  }

  void Create(const char* name) { std::ofstream(dir.path() / name) << ""; }

  testing::TestDir dir;
  std::unique_ptr<ToolchainRegistry> registry;
  WorkerPool* pool = nullptr;
};

TEST_F(WorkerPoolTest, AJobTakesABusyWorkerThatFreesUpRatherThanWaitForANewOneToStart) {
  Create("slow");  // workers started from now on hang in their imports
  auto compile = [&] { return pool->Compile(CompileJob{}); };
  std::future<absl::StatusOr<CompileResult>> first = std::async(std::launch::async, compile);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the first has the worker
  std::future<absl::StatusOr<CompileResult>> second = std::async(std::launch::async, compile);

  const bool served = second.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  Create("go");  // lets the new worker finish starting in any case
  ASSERT_TRUE(served) << "the second job waited for the worker still starting";
  const std::string first_pid = PidOf(first.get());
  EXPECT_EQ(PidOf(second.get()), first_pid) << "both ran on the worker that was ready";
}

TEST_F(WorkerPoolTest, AJobGetsTheStartFailureOnceNoWorkerIsLeftToServeIt) {
  Create("crash");
  Create("broken");
  absl::StatusOr<CompileResult> crashed = pool->Compile(CompileJob{});
  ASSERT_TRUE(crashed.ok());
  ASSERT_TRUE(std::holds_alternative<CompileFailure>(*crashed));
  EXPECT_EQ(std::get<CompileFailure>(*crashed).kind, CompileFailure::Kind::kWorkerCrashed);

  // No worker left, and none can start: the job hears why instead of waiting.
  std::future<absl::StatusOr<CompileResult>> next =
      std::async(std::launch::async, [&] { return pool->Compile(CompileJob{}); });
  ASSERT_EQ(next.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  const absl::StatusOr<CompileResult> result = next.get();
  ASSERT_FALSE(result.ok() && std::holds_alternative<CompileOutput>(*result));
  const std::string said = result.ok() ? std::get<CompileFailure>(*result).message
                                       : std::string(result.status().message());
  EXPECT_NE(said.find("cannot import triton"), std::string::npos) << said;
}

TEST_F(WorkerPoolTest, ACrashReportShowsWhatTheCrashedJobWroteAndNoEarlierJobs) {
  ASSERT_NE(PidOf(pool->Compile(CompileJob{})), "failed");
  Create("crash");
  absl::StatusOr<CompileResult> crashed = pool->Compile(CompileJob{});
  ASSERT_TRUE(crashed.ok()) << crashed.status();
  ASSERT_TRUE(std::holds_alternative<CompileFailure>(*crashed));
  const std::string& report = std::get<CompileFailure>(*crashed).message;
  EXPECT_NE(report.find("dying words"), std::string::npos) << report;
  EXPECT_EQ(report.find("output of an earlier job"), std::string::npos) << report;
}

// Probes remembered across kilnd's starts: each registry below stands for
// one start of kilnd, sharing the data dir's memo file.
class ToolchainMemoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(python)) GTEST_SKIP() << "needs /usr/bin/python3";
    std::ofstream(dir.path() / "worker.py") << kStandInWorker;
    fs::create_directories(dir.path() / "triton" / "_C");
    std::ofstream(dir.path() / "triton" / "__init__.py") << "__version__ = '0'\n";
    std::ofstream(dir.path() / "triton" / "_C" / "libtriton.so") << "compiled";
    options.worker_script = dir.path() / "worker.py";
    options.max_workers = 2;
  }

  std::unique_ptr<ToolchainRegistry> Start() {
    return std::make_unique<ToolchainRegistry>(options, dir.path() / "toolchain-probes");
  }

  int Hellos() {
    std::ifstream file(dir.path() / "hellos");
    int count = 0;
    for (std::string line; std::getline(file, line);) ++count;
    return count;
  }

  const fs::path python = "/usr/bin/python3";
  testing::TestDir dir;
  PoolOptions options;
};

TEST_F(ToolchainMemoTest, ANewStartRegistersARememberedToolchainWithoutProbingAndItsPoolCompiles) {
  ASSERT_TRUE(Start()->Register(python).ok());
  ASSERT_EQ(Hellos(), 1);

  std::unique_ptr<ToolchainRegistry> restarted = Start();
  absl::StatusOr<ToolchainInfo> info = restarted->Register(python);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->triton_key, "stand-in");
  EXPECT_EQ(info->triton_dir, (dir.path() / "triton").string());
  EXPECT_TRUE(info->remembered);
  EXPECT_EQ(Hellos(), 1) << "the interpreter was probed again";
  absl::StatusOr<WorkerPool*> pool = restarted->Find("stand-in");
  ASSERT_TRUE(pool.ok());
  EXPECT_NE(PidOf((*pool)->Compile(CompileJob{})), "failed");
}

TEST_F(ToolchainMemoTest, ATritonReinstalledOrAClientsOtherKeyIsProbedAgain) {
  ASSERT_TRUE(Start()->Register(python).ok());
  // A client whose triton hashes to another key: its triton changed since.
  ASSERT_TRUE(Start()->Register(python, "a-newer-triton").ok());
  EXPECT_EQ(Hellos(), 2);
  // A reinstall rewrites the compiled library.
  std::ofstream(dir.path() / "triton" / "_C" / "libtriton.so") << "compiled again, larger";
  ASSERT_TRUE(Start()->Register(python).ok());
  EXPECT_EQ(Hellos(), 3);
  ASSERT_TRUE(Start()->Register(python).ok());
  EXPECT_EQ(Hellos(), 3) << "the new probe was not remembered";
}

TEST_F(ToolchainMemoTest, AMemoThatIsNotOnesOwnIsProbedOverAndReplaced) {
  std::ofstream(dir.path() / "toolchain-probes") << "kiln toolchain probes 1\n/usr/bin/python3\tgarbage\n\0\xff";
  ASSERT_TRUE(Start()->Register(python).ok());
  EXPECT_EQ(Hellos(), 1);
  ASSERT_TRUE(Start()->Register(python).ok());
  EXPECT_EQ(Hellos(), 1);
}

TEST_F(ToolchainMemoTest, AToolchainNeverSeenIsProbedOnceInTheBackgroundAndWhatAsksMeanwhileWaitsOrIsToldSo) {
  std::ofstream(dir.path() / "slow");  // the probe's worker stalls until `go`
  std::unique_ptr<ToolchainRegistry> registry = Start();
  // std::promise, not absl::Notification: the TSan lane's Abseil is Debian's,
  // uninstrumented, so TSan would not see the notification order the outcome.
  std::promise<void> registered;
  std::future<void> registered_future = registered.get_future();
  absl::StatusOr<ToolchainInfo> outcome = absl::UnknownError("never called");
  EXPECT_FALSE(registry->RegisterInBackground(python, "", [&](const absl::StatusOr<ToolchainInfo>& info) {
    outcome = info;
    registered.set_value();
  }));
  // Under way: asking again starts nothing, and nothing is registered yet.
  EXPECT_FALSE(registry->RegisterInBackground(
      python, "", [](const absl::StatusOr<ToolchainInfo>&) { ADD_FAILURE() << "a second probe ended"; }));
  EXPECT_TRUE(registry->AnyProbeUnderWay());
  EXPECT_FALSE(registry->Find("stand-in", /*wait_for_probes=*/false).ok());
  EXPECT_TRUE(registry->List().empty());
  // A Register of the same interpreter waits for that probe, and runs none of its own.
  std::thread waiting([&] { EXPECT_TRUE(registry->Register(python).ok()); });
  EXPECT_EQ(registered_future.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  std::ofstream(dir.path() / "go");
  waiting.join();
  ASSERT_EQ(registered_future.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(Hellos(), 1) << "the interpreter was probed twice";
  EXPECT_FALSE(registry->AnyProbeUnderWay());
  EXPECT_TRUE(registry->Find("stand-in").ok());
  // The next start has it remembered: answered at once, with no probe.
  bool remembered = false;
  EXPECT_TRUE(Start()->RegisterInBackground(python, "", [&](const absl::StatusOr<ToolchainInfo>& info) {
    remembered = info.ok() && info->remembered;
  }));
  EXPECT_TRUE(remembered);
  EXPECT_EQ(Hellos(), 1);
}

TEST_F(ToolchainMemoTest, AStopAbandonsAProbeUnderWayAndItsCallbackIsDoneWhenTheStopReturns) {
  // The probe may be writing its hello to the worker the stop kills: a
  // broken pipe, which kilnd ignores (platform::ShutdownSignals), as here.
  std::signal(SIGPIPE, SIG_IGN);
  std::ofstream(dir.path() / "slow");  // and never `go`: the probe would wait out its hello's limit
  std::unique_ptr<ToolchainRegistry> registry = Start();
  std::atomic<bool> called = false;
  absl::StatusOr<ToolchainInfo> outcome = absl::UnknownError("never called");
  registry->RegisterInBackground(python, "", [&](const absl::StatusOr<ToolchainInfo>& info) {
    outcome = info;
    called = true;
  });
  registry->StopWorkers();
  EXPECT_TRUE(called.load());
  EXPECT_FALSE(outcome.ok());
  EXPECT_FALSE(registry->AnyProbeUnderWay());
}

}  // namespace
}  // namespace kiln::compiler
