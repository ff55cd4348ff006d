// The parts of the platform layer that are the same on every OS, built on the
// per-OS primitives.

#include <algorithm>
#include <fstream>
#include <system_error>

// getaddrinfo is the same call on both; only its headers (and Winsock's
// start-up) differ.
#ifdef _WIN32
#include "common/windows_api.h"
#include <ws2tcpip.h>
#else
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#endif

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/platform.h"
#include "common/platform_internal.h"

namespace kiln::platform {

absl::StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::string content(static_cast<size_t>(in.tellg()), '\0');
  in.seekg(0);
  in.read(content.data(), static_cast<std::streamsize>(content.size()));
  if (!in) return absl::DataLossError(absl::StrCat("cannot read ", path.string()));
  return content;
}

absl::Status PublishContentAddressedFile(const std::filesystem::path& temp,
                                         const std::filesystem::path& target) {
  absl::StatusOr<Replaced> replaced = MoveFileOver(temp, target);
  if (!replaced.ok()) return replaced.status();
  if (*replaced == Replaced::kTargetInUse) {
    std::error_code error;
    std::filesystem::remove(temp, error);
  }
  return absl::OkStatus();
}

std::optional<HostPort> SplitHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return std::nullopt;
  }
  absl::string_view host = address.substr(0, colon);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) host = host.substr(1, host.size() - 2);
  return HostPort{std::string(host), static_cast<uint16_t>(port)};
}

absl::StatusOr<TcpAddresses> ResolveTcpAddresses(const std::string& host, uint16_t port) {
#ifdef _WIN32
  WSADATA wsa{};
  if (WSAStartup(MAKEWORD(2, 2), &wsa) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": Winsock did not start"));
  }
  struct WinsockSession {
    ~WinsockSession() { WSACleanup(); }
  } session;
#endif
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(host.c_str(), nullptr, &hints, &found); error != 0) {
    return absl::UnavailableError(
        absl::StrFormat("%s does not resolve (%s)", host, gai_strerror(error)));
  }
  TcpAddresses addresses;
  for (const addrinfo* each = found; each != nullptr; each = each->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    std::vector<std::string>* list = nullptr;
    std::string address;
    if (each->ai_family == AF_INET) {
      const auto* ipv4 = reinterpret_cast<const sockaddr_in*>(each->ai_addr);
      if (inet_ntop(AF_INET, &ipv4->sin_addr, text, sizeof(text)) == nullptr) continue;
      list = &addresses.ipv4;
      address = absl::StrCat(text, ":", port);
    } else if (each->ai_family == AF_INET6) {
      const auto* ipv6 = reinterpret_cast<const sockaddr_in6*>(each->ai_addr);
      if (inet_ntop(AF_INET6, &ipv6->sin6_addr, text, sizeof(text)) == nullptr) continue;
      list = &addresses.ipv6;
      address = absl::StrCat("[", text, "]:", port);
    } else {
      continue;
    }
    if (std::find(list->begin(), list->end(), address) == list->end()) list->push_back(address);
  }
  freeaddrinfo(found);
  if (addresses.ipv4.empty() && addresses.ipv6.empty()) {
    return absl::UnavailableError(absl::StrCat(host, " has no TCP address"));
  }
  return addresses;
}

void ShutdownSignals::Request(const std::string& reason) {
  {
    std::lock_guard lock(state_->mutex);
    if (!state_->reason.empty()) return;
    state_->reason = reason.empty() ? "stop requested" : reason;
  }
  state_->requested.notify_all();
}

std::string ShutdownSignals::Wait() {
  std::unique_lock lock(state_->mutex);
  state_->requested.wait(lock, [this] { return !state_->reason.empty(); });
  return state_->reason;
}

}  // namespace kiln::platform
