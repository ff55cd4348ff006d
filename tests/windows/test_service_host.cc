// The service windows_service_test installs: the real service side
// (RunWindowsService: ServiceMain, control handler, status reports, Event
// Log) around a small body that records what happened in a marker file,
// standing in for kilnd's server, which needs gRPC (not built with mingw-w64).
//
// usage: kiln_test_service --windows-service NAME MARKER [--fail | --linger-ms=N]
//
// --linger-ms keeps the process alive N ms after it reported SERVICE_STOPPED,
// as kilnd's own teardown (joining threads, closing the store) does.

#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "common/platform.h"
#include "service/windows_service.h"

int main(int argc, char** argv) {
  if (argc < 4 || std::string(argv[1]) != "--windows-service") {
    std::cerr << "usage: kiln_test_service --windows-service NAME MARKER [--fail | --linger-ms=N]\n";
    return 2;
  }
  const std::string name = argv[2];
  const std::string marker = argv[3];
  const std::string option = argc > 4 ? argv[4] : "";
  const bool fail = option == "--fail";
  const std::string linger_flag = "--linger-ms=";
  const int linger_ms =
      option.rfind(linger_flag, 0) == 0 ? std::stoi(option.substr(linger_flag.size())) : 0;
  auto record = [&marker](const std::string& text) {
    std::ofstream(marker, std::ios::trunc) << text;
  };
  kiln::platform::ShutdownSignals stop;
  const absl::Status result = kiln::service::RunWindowsService(
      name, stop, [&](const std::function<void()>& report_running) -> absl::Status {
        if (fail) return absl::InternalError("asked to fail before serving");
        report_running();
        record("running");
        const std::string reason = stop.Wait();
        record("stopped: " + reason);
        return absl::OkStatus();
      });
  if (!result.ok()) {
    std::cerr << "kiln_test_service: " << result.message() << "\n";
    return 1;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(linger_ms));
  return 0;
}
