// The Windows platform layer against the real Win32 API (under Wine in CI):
// paths, private directories, file replacement, locks, libraries and child
// processes. The executable is also the child: `--child=MODE` runs one of the
// small programs below instead of the tests.

#include "common/windows_api.h"

#include <fcntl.h>
#include <io.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include "common/platform.h"
#include "common/subprocess.h"
#include "common/windows_accounts.h"
#include "gtest/gtest.h"
#include "tests/test_dir.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

fs::path Self() {
  wchar_t buffer[MAX_PATH];
  GetModuleFileNameW(nullptr, buffer, MAX_PATH);
  return fs::path(buffer);
}

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteText(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Sets an environment variable for the test's duration.
class ScopedEnv {
 public:
  ScopedEnv(const wchar_t* name, const fs::path& value) : name_(name) {
    wchar_t old[32768];
    const DWORD length = GetEnvironmentVariableW(name, old, 32768);
    had_ = length > 0;
    if (had_) old_.assign(old, length);
    SetEnvironmentVariableW(name, value.empty() ? nullptr : value.c_str());
  }
  ~ScopedEnv() { SetEnvironmentVariableW(name_, had_ ? old_.c_str() : nullptr); }

 private:
  const wchar_t* name_;
  bool had_ = false;
  std::wstring old_;
};

TEST(WindowsPathsTest, UserDirectoriesFollowLocalAppDataAndMachineOnesTheKnownFolder) {
  testing::TestDir dir;
  ScopedEnv local(L"LOCALAPPDATA", dir.path() / "Local");
  // A service's environment is not its installer's, so %ProgramData% is not asked.
  ScopedEnv program_data(L"ProgramData", dir.path() / "ProgramData");
  using platform::Scope;
  EXPECT_EQ(platform::DefaultDataDir(Scope::kUser), dir.path() / "Local" / "kiln");
  EXPECT_EQ(platform::DefaultConfigPath(Scope::kUser),
            dir.path() / "Local" / "kiln" / "kilnd.conf");
  EXPECT_EQ(platform::DefaultEndpointFile(Scope::kUser),
            dir.path() / "Local" / "kiln" / "run" / "kilnd.endpoint");
  PWSTR known = nullptr;
  ASSERT_TRUE(SUCCEEDED(SHGetKnownFolderPath(FOLDERID_ProgramData, 0, nullptr, &known)));
  const fs::path program_data_folder(known);
  CoTaskMemFree(known);
  EXPECT_EQ(platform::DefaultDataDir(Scope::kMachine), program_data_folder / "kiln");
  EXPECT_EQ(platform::KilnPythonDir(Scope::kMachine), program_data_folder / "kiln" / "python");
  // No Unix socket on Windows: clients read the endpoint file.
  EXPECT_TRUE(platform::DefaultSocketPath().empty());
  EXPECT_EQ(platform::DefaultLocalEndpoint(), "");
}

TEST(WindowsPathsTest, FallsBackToTheKnownFolderWhenTheVariableIsUnset) {
  ScopedEnv local(L"LOCALAPPDATA", fs::path());
  const fs::path data_dir = platform::DefaultDataDir(platform::Scope::kUser);
  EXPECT_TRUE(data_dir.is_absolute()) << data_dir;
  EXPECT_EQ(data_dir.filename(), "kiln");
}

// The allow entries of `dir`'s DACL, as SIDs, and whether it is protected
// from inheritance.
struct Dacl {
  bool is_protected = false;
  std::vector<std::vector<unsigned char>> allowed;
};

Dacl ReadDacl(const fs::path& dir) {
  Dacl result;
  PACL acl = nullptr;
  PSECURITY_DESCRIPTOR descriptor = nullptr;
  EXPECT_EQ(GetNamedSecurityInfoW(dir.c_str(), SE_FILE_OBJECT, DACL_SECURITY_INFORMATION, nullptr,
                                  nullptr, &acl, nullptr, &descriptor),
            static_cast<DWORD>(ERROR_SUCCESS));
  SECURITY_DESCRIPTOR_CONTROL control = 0;
  DWORD revision = 0;
  GetSecurityDescriptorControl(descriptor, &control, &revision);
  result.is_protected = (control & SE_DACL_PROTECTED) != 0;
  for (DWORD i = 0; acl != nullptr && i < acl->AceCount; ++i) {
    void* ace = nullptr;
    if (!GetAce(acl, i, &ace)) continue;
    auto* header = static_cast<ACE_HEADER*>(ace);
    if (header->AceType != ACCESS_ALLOWED_ACE_TYPE) continue;
    PSID sid = &static_cast<ACCESS_ALLOWED_ACE*>(ace)->SidStart;
    const auto* bytes = static_cast<unsigned char*>(sid);
    result.allowed.emplace_back(bytes, bytes + GetLengthSid(sid));
  }
  LocalFree(descriptor);
  return result;
}

std::vector<unsigned char> CurrentSid() {
  HANDLE token = nullptr;
  OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &token);
  DWORD size = 0;
  GetTokenInformation(token, TokenUser, nullptr, 0, &size);
  std::vector<unsigned char> buffer(size);
  GetTokenInformation(token, TokenUser, buffer.data(), size, &size);
  CloseHandle(token);
  PSID sid = reinterpret_cast<TOKEN_USER*>(buffer.data())->User.Sid;
  const auto* bytes = static_cast<unsigned char*>(sid);
  return {bytes, bytes + GetLengthSid(sid)};
}

TEST(WindowsPrivateDirectoryTest, OnlyTheOwnerAndNamedReadersAreAllowed) {
  testing::TestDir dir;
  const fs::path run = dir.path() / "kiln" / "run";
  ASSERT_TRUE(platform::EnsurePrivateDirectory(run).ok());
  // Wine maps a file's DACL to Unix mode bits and back, so the entries set
  // cannot be read back there; on Windows they are checked.
  if (!testing::UnderWine()) {
    Dacl dacl = ReadDacl(run);
    EXPECT_TRUE(dacl.is_protected) << "inherited entries would let other users in";
    ASSERT_EQ(dacl.allowed.size(), 1u);
    EXPECT_EQ(dacl.allowed[0], CurrentSid());
  }
  // A machine service also lets its allowed users read the endpoint file.
  ASSERT_TRUE(platform::EnsurePrivateDirectory(run, {"NT AUTHORITY\\LocalService"}).ok());
  if (!testing::UnderWine()) {
    EXPECT_EQ(ReadDacl(run).allowed.size(), 2u);
  }

  absl::Status unknown = platform::EnsurePrivateDirectory(run, {"NOSUCHDOMAIN\\nobody"});
  EXPECT_TRUE(absl::IsInvalidArgument(unknown)) << unknown;
  EXPECT_NE(unknown.message().find("NOSUCHDOMAIN\\nobody"), absl::string_view::npos);

  WriteText(dir.path() / "file", "x");
  EXPECT_TRUE(absl::IsFailedPrecondition(platform::EnsurePrivateDirectory(dir.path() / "file")));
}

TEST(WindowsAccountsTest, BuiltInServiceAccountsResolveWhateverTheSystemLanguage) {
  auto text = [](const std::vector<unsigned char>& sid) {
    LPWSTR string = nullptr;
    ConvertSidToStringSidW(const_cast<unsigned char*>(sid.data()), &string);
    std::wstring result(string);
    LocalFree(string);
    return result;
  };
  EXPECT_EQ(text(*AccountSid("NT AUTHORITY\\LocalService")), L"S-1-5-19");
  EXPECT_EQ(text(*AccountSid("nt authority\\local service")), L"S-1-5-19");
  EXPECT_EQ(text(*AccountSid("NT AUTHORITY\\NetworkService")), L"S-1-5-20");
  EXPECT_EQ(text(*AccountSid("LocalSystem")), L"S-1-5-18");
  EXPECT_EQ(text(*AccountSid("S-1-5-32-545")), L"S-1-5-32-545");
  EXPECT_TRUE(absl::IsInvalidArgument(AccountSid("S-1-not-a-sid").status()));
  absl::Status unknown = AccountSid("NOSUCHDOMAIN\\nobody").status();
  EXPECT_TRUE(absl::IsInvalidArgument(unknown)) << unknown;
  EXPECT_NE(unknown.message().find("NOSUCHDOMAIN\\nobody"), absl::string_view::npos);
}

TEST(WindowsThreadsTest, LoweringAThreadsPriorityLeavesTheOthersAlone) {
  int lowered = THREAD_PRIORITY_ERROR_RETURN;
  std::thread worker([&] {
    platform::LowerCurrentThreadPriority();
    lowered = GetThreadPriority(GetCurrentThread());
  });
  worker.join();
  EXPECT_EQ(lowered, THREAD_PRIORITY_BELOW_NORMAL);
  EXPECT_EQ(GetThreadPriority(GetCurrentThread()), THREAD_PRIORITY_NORMAL);
}

TEST(WindowsFilesTest, StampsChangeWithTheContentEvenWhenTheWriteTimeIsPutBack) {
  testing::TestDir dir;
  const fs::path file = dir.path() / "blob";
  WriteText(file, "version 1");
  absl::StatusOr<platform::FileStamp> first = platform::StampOf(file);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*platform::StampOf(file), *first);
  EXPECT_LT(absl::AbsDuration(platform::ChangeTime(*first) - absl::Now()), absl::Minutes(5));
  // File times tick coarsely; the change must fall in a later tick to show.
  Sleep(50);
  const auto written = fs::last_write_time(file);
  WriteText(file, "version 2");  // the same size
  fs::last_write_time(file, written);
  absl::StatusOr<platform::FileStamp> second = platform::StampOf(file);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(*second, *first);
  EXPECT_TRUE(absl::IsNotFound(platform::StampOf(dir.path() / "missing").status()));
}

TEST(WindowsFilesTest, ReplacingAFileHeldOpenIsReportedAndTheExistingCopyKept) {
  testing::TestDir dir;
  const fs::path target = dir.path() / "ab" / "0123456789abcdef.so";
  fs::create_directories(target.parent_path());
  WriteText(target, "content");
  WriteText(dir.path() / "temp1", "content");
  // Not open: replaced.
  ASSERT_EQ(*platform::MoveFileOver(dir.path() / "temp1", target), platform::Replaced::kYes);
  EXPECT_FALSE(fs::exists(dir.path() / "temp1"));

  // Held open without FILE_SHARE_DELETE, as a loaded launcher module or a
  // reader in another process holds it: the move fails, which the client's
  // materialization (and the cache's blob publishing) treat as "already there".
  HANDLE holder = CreateFileW(target.c_str(), GENERIC_READ, FILE_SHARE_READ, nullptr,
                              OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, nullptr);
  ASSERT_NE(holder, INVALID_HANDLE_VALUE);
  WriteText(dir.path() / "temp2", "content");
  absl::StatusOr<platform::Replaced> replaced = platform::MoveFileOver(dir.path() / "temp2", target);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ(*replaced, platform::Replaced::kTargetInUse);
  EXPECT_TRUE(fs::exists(dir.path() / "temp2"));
  ASSERT_TRUE(platform::PublishContentAddressedFile(dir.path() / "temp2", target).ok());
  EXPECT_FALSE(fs::exists(dir.path() / "temp2")) << "the unpublished copy is cleaned up";
  EXPECT_EQ(ReadText(target), "content");
  CloseHandle(holder);

  // Closed again: replacing works.
  WriteText(dir.path() / "temp3", "content");
  EXPECT_EQ(*platform::MoveFileOver(dir.path() / "temp3", target), platform::Replaced::kYes);

  // A missing source is an error naming both paths, not "in use".
  absl::StatusOr<platform::Replaced> missing =
      platform::MoveFileOver(dir.path() / "no-such-temp", target);
  EXPECT_TRUE(absl::IsInternal(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("no-such-temp"), absl::string_view::npos);
}

TEST(WindowsFilesTest, DurableWritesRefuseToOverwriteAndLocksAreExclusive) {
  testing::TestDir dir;
  ASSERT_TRUE(platform::WriteFileDurably(dir.path() / "blob", "data").ok());
  EXPECT_EQ(ReadText(dir.path() / "blob"), "data");
  EXPECT_FALSE(platform::WriteFileDurably(dir.path() / "blob", "other").ok());

  auto first = platform::TryLockFile(dir.path() / "kilnd.lock");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = platform::TryLockFile(dir.path() / "kilnd.lock");
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  // A waiter gives up at its deadline while the lock is held, and takes it once free.
  auto waited = platform::WaitForFileLock(dir.path() / "kilnd.lock", absl::Now() + absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(waited.status())) << waited.status();
  first->reset();
  auto taken = platform::WaitForFileLock(dir.path() / "kilnd.lock", absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(taken.ok()) << taken.status();
  EXPECT_FALSE(platform::TryLockFile(dir.path() / "kilnd.lock").ok());
}

// A local_socket configured on Windows is AF_UNIX: a live one must not be
// mistaken for a stale file and deleted.
TEST(WindowsSocketTest, OnlyALiveUnixSocketAcceptsConnections) {
  testing::TestDir dir;
  const fs::path path = dir.path() / "kilnd.sock";
  EXPECT_FALSE(platform::LocalSocketAcceptsConnections(path));
  WSADATA wsa{};
  ASSERT_EQ(WSAStartup(MAKEWORD(2, 2), &wsa), 0);
  SOCKET listener = socket(AF_UNIX, SOCK_STREAM, 0);
  if (listener == INVALID_SOCKET) {
    WSACleanup();
    GTEST_SKIP() << "no AF_UNIX sockets here (Windows before 10 1803, or Wine 8)";
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string text = path.string();
  std::memcpy(address.sun_path, text.c_str(), text.size() + 1);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  EXPECT_TRUE(platform::LocalSocketAcceptsConnections(path));
  closesocket(listener);
  WSACleanup();
}

TEST(WindowsLibraryTest, LoadsSystemLibrariesAndNamesMissingOnes) {
  auto kernel32 = platform::LoadDynamicLibrary({"kiln-no-such.dll", "kernel32.dll"});
  ASSERT_TRUE(kernel32.ok()) << kernel32.status();
  EXPECT_NE((*kernel32)->Symbol("GetTickCount"), nullptr);
  EXPECT_EQ((*kernel32)->Symbol("KilnNoSuchFunction"), nullptr);
  // What a machine without the NVIDIA driver gets for nvcuda.dll.
  auto missing = platform::LoadDynamicLibrary({"kiln-no-such-nvcuda.dll"});
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_NE(missing.status().message().find("kiln-no-such-nvcuda.dll"), absl::string_view::npos);
}

TEST(WindowsShutdownTest, AServiceStopRequestEndsTheWait) {
  platform::ShutdownSignals signals;
  std::thread stopper([&] { signals.Request("service stop"); });
  EXPECT_EQ(signals.Wait(), "service stop");
  stopper.join();
  signals.Request("later");  // the first reason wins
  EXPECT_EQ(signals.Wait(), "service stop");
}

TEST(WindowsSubprocessTest, PipesCarryDataBothWaysAndTheExitCodeIsReported) {
  auto child = Subprocess::Spawn({Self().string(), "--child=echo"});
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE((*child)->Write("ping\n").ok());
  (*child)->CloseStdin();
  auto echoed = (*child)->ReadExactly(5, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(echoed.ok()) << echoed.status();
  EXPECT_EQ(*echoed, "ping\n");
  EXPECT_EQ((*child)->Wait(), "exit code 7");
  EXPECT_FALSE((*child)->Succeeded());
  EXPECT_NE((*child)->StderrTail().find("bye from the child"), std::string::npos);
}

TEST(WindowsSubprocessTest, ArgumentsAndEnvironmentArriveIntact) {
  const std::vector<std::string> arguments = {"a b", "quote\"inside", "trailing\\", "",
                                              "C:\\Program Files\\x"};
  std::vector<std::string> argv = {Self().string(), "--child=args"};
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  SpawnOptions options;
  options.env["KILN_TEST_VALUE"] = "value with spaces";
  options.working_dir = fs::temp_directory_path();
  auto result = RunCommand(argv, absl::Seconds(60), options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->succeeded) << result->exit_description << result->errors;
  std::string expected;
  for (const std::string& argument : arguments) expected += "[" + argument + "]\n";
  expected += "env=value with spaces\n";
  EXPECT_EQ(result->output, expected);
}

TEST(WindowsSubprocessTest, TimeoutKillsTheChildAndEverythingItStarted) {
  auto child = Subprocess::Spawn({Self().string(), "--child=spawn-sleeper"});
  ASSERT_TRUE(child.ok()) << child.status();
  // The child starts a grandchild and reports its pid, then hangs.
  std::string line;
  while (line.find('\n') == std::string::npos) {
    auto chunk = (*child)->ReadSome(64, absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    ASSERT_FALSE(chunk->empty()) << "child exited: " << (*child)->StderrTail();
    line += *chunk;
  }
  const DWORD grandchild_pid = static_cast<DWORD>(std::stoul(line));
  HANDLE grandchild = OpenProcess(SYNCHRONIZE, FALSE, grandchild_pid);
  ASSERT_NE(grandchild, nullptr);

  auto silent = (*child)->ReadSome(64, absl::Now() + absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(silent.status())) << silent.status();
  (*child)->Kill();
  EXPECT_EQ((*child)->Wait(), "killed");
  EXPECT_EQ(WaitForSingleObject(grandchild, 10'000), WAIT_OBJECT_0)
      << "the grandchild outlived the kill";
  CloseHandle(grandchild);

  auto timed_out = RunCommand({Self().string(), "--child=sleep"}, absl::Milliseconds(500));
  ASSERT_TRUE(timed_out.ok());
  EXPECT_FALSE(timed_out->succeeded);
  EXPECT_EQ(timed_out->exit_description, "timed out after 500ms");
}

TEST(WindowsSubprocessTest, MissingProgramsAreNamedAndPathSearchUsesPathext) {
  auto missing = Subprocess::Spawn({"kiln-no-such-program.exe"});
  EXPECT_TRUE(absl::IsFailedPrecondition(missing.status()));
  EXPECT_NE(missing.status().message().find("kiln-no-such-program.exe"), absl::string_view::npos);

  const fs::path self = Self();
  ScopedEnv path(L"PATH", self.parent_path());
  const fs::path found = FindOnPath(self.stem().string());  // no ".exe": found through PATHEXT
  ASSERT_FALSE(found.empty());
  EXPECT_TRUE(fs::equivalent(found, self));
  EXPECT_TRUE(FindOnPath("kiln-no-such-program").empty());
  EXPECT_EQ(ExecutableDir(), self.parent_path());
}

// The child programs.
int RunChild(const std::string& mode, int argc, char** argv) {
  // Bytes as written, as kilnd's workers (Python's binary stdio) do.
  _setmode(_fileno(stdin), _O_BINARY);
  _setmode(_fileno(stdout), _O_BINARY);
  if (mode == "echo") {
    std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    std::cout << input << std::flush;
    std::cerr << "bye from the child\n";
    return 7;
  }
  if (mode == "args") {
    for (int i = 2; i < argc; ++i) std::cout << "[" << argv[i] << "]\n";
    const char* value = std::getenv("KILN_TEST_VALUE");
    std::cout << "env=" << (value ? value : "(unset)") << "\n";
    return 0;
  }
  if (mode == "spawn-sleeper") {
    auto sleeper = Subprocess::Spawn({Self().string(), "--child=sleep"});
    if (!sleeper.ok()) return 2;
    std::cout << (*sleeper)->pid() << "\n" << std::flush;
    Sleep(INFINITE);
  }
  if (mode == "sleep") Sleep(INFINITE);
  return 3;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]).rfind("--child=", 0) == 0) {
    return kiln::RunChild(std::string(argv[1]).substr(8), argc, argv);
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
