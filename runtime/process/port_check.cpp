// Whether a TCP port can be bound here (runtime/process/port_check.hpp).
#include "runtime/process/port_check.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>

namespace longwave::runtime {

int bind_error(std::string host, int port) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return 0;
  int err = 0;
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    err = errno;
  } else {
    const int one = 1;  // a closed connection's TIME_WAIT does not hold the port for the listener either
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, found->ai_addr, found->ai_addrlen) != 0) err = errno;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return err;
}

std::string bindable_endpoint(const std::string& endpoint) {
  constexpr std::string_view scheme = "tcp://";
  if (endpoint.compare(0, scheme.size(), scheme) != 0) return endpoint;
  const auto colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon < scheme.size()) return endpoint;
  const std::string host = endpoint.substr(scheme.size(), colon - scheme.size());
  in_addr numeric{};
  if (host.empty() || host == "*" || host.front() == '[' || ::inet_pton(AF_INET, host.c_str(), &numeric) == 1)
    return endpoint;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return endpoint;
  char text[INET_ADDRSTRLEN] = {};
  const bool ok = ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr, text,
                              sizeof text) != nullptr;
  ::freeaddrinfo(found);
  return ok ? std::string(scheme) + text + endpoint.substr(colon) : endpoint;
}

}  // namespace longwave::runtime
