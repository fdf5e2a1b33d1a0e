#pragma once
// "HOST:PORT" as torchrun and init_method's tcp:// spell an address ("[::1]:PORT" for IPv6, as
// a URL does), and a TCP port alone: the one reading of both. Pure: fsdpp-run (which does not
// link fsdpp) uses it too.
#include <optional>
#include <string>

namespace fsdpp {

// A TCP port in [1, 65535] spelled by the whole of `text` in decimal digits; nothing otherwise.
inline std::optional<int> parse_tcp_port(const std::string& text) {
  if (text.empty() || text.size() > 5 || text.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  const int port = std::stoi(text);
  if (port < 1 || port > 65535) return std::nullopt;
  return port;
}

struct HostPort {
  std::string host;  // without an IPv6 address's brackets
  int port = 0;
};

// The host before the last colon (brackets dropped) and the port after it; nothing when there is
// no colon, no host, or no valid port.
inline std::optional<HostPort> split_host_port(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) return std::nullopt;
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::optional<int> port = parse_tcp_port(text.substr(colon + 1));
  if (host.empty() || !port) return std::nullopt;
  return HostPort{host, *port};
}

}  // namespace fsdpp
