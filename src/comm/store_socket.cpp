#include "comm/store_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fsdpp/error.h>

#include "common/loopback.h"

namespace fsdpp::detail {
namespace {

// The port a listening socket is bound to, or -1 if `fd` is not one.
int listening_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  int listening = 0;
  socklen_t size = sizeof listening;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) != 0 || !listening)
    return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return -1;
}

std::optional<int> launcher_socket(int port) {
  const char* text = std::getenv("FSDPP_STORE_LISTEN_FD");
  if (text == nullptr) return std::nullopt;
  char* end = nullptr;
  const long fd = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || fd < 0 || fd > 1 << 20 || listening_port(static_cast<int>(fd)) != port)
    throw Error("FSDPP_STORE_LISTEN_FD=" + std::string(text) + " is not a socket listening on port " +
                std::to_string(port) + " (MASTER_PORT): it is fsdpp-run's to set");
  fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);  // not for the rank's own children
  unsetenv("FSDPP_STORE_LISTEN_FD");  // the store takes the socket over; a second init must not reuse it
  return static_cast<int>(fd);
}

}  // namespace

std::optional<int> store_listen_socket(const std::string& host, int port, bool from_launcher) {
  if (!is_loopback(host)) return std::nullopt;
  if (from_launcher)
    if (auto fd = launcher_socket(port)) return fd;
  const bool v6 = host == "::1";
  const std::string where = (v6 ? "[::1]" : host) + ":" + std::to_string(port);
  const int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  auto fail = [&](const char* what) -> std::optional<int> {
    const int error = errno;
    if (fd >= 0) close(fd);
    throw Error("rank 0 cannot " + std::string(what) + " " + where + " for the rendezvous store: " +
                std::strerror(error) +
                (error == EADDRINUSE ? " (another job on this machine holds the port: give another MASTER_PORT, or "
                                       "leave --master-port out and fsdpp-run picks a free one)"
                                     : ""));
  };
  if (fd < 0) return fail("open a socket for");
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);  // as c10d: a dead job's TIME_WAIT is no owner
  int bound;
  if (v6) {
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_loopback;
    addr.sin6_port = htons(static_cast<uint16_t>(port));
    bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (host == "localhost" || inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  }
  if (bound != 0) return fail("listen on");
  if (listen(fd, SOMAXCONN) != 0) return fail("listen on");
  return fd;
}

}  // namespace fsdpp::detail
