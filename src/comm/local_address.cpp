#include "comm/local_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

namespace fsdpp::detail {

std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0) return "";
  std::string address;
  // IPv4 first: a name may also resolve to an IPv6 address the job does not use.
  std::vector<addrinfo*> candidates;
  for (addrinfo* a = found; a; a = a->ai_next)
    if (a->ai_family == AF_INET) candidates.push_back(a);
  for (addrinfo* a = found; a; a = a->ai_next)
    if (a->ai_family != AF_INET) candidates.push_back(a);
  for (addrinfo* a : candidates) {
    if (!address.empty()) break;
    const int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    char text[INET6_ADDRSTRLEN] = {};
    // connect() on a UDP socket only picks the route and the source address.
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      const void* raw = local.ss_family == AF_INET6
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
      if (inet_ntop(local.ss_family, raw, text, sizeof text)) address = text;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return address;
}

}  // namespace fsdpp::detail
