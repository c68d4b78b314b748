// See tcp_listen.h.
#include "common/tcp_listen.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gradswitch {

int tcp_listen(const std::string& host, uint16_t port, int backlog, uint16_t* bound_port,
               std::string* error) {
  const std::string where = "cannot listen on TCP " + host + ":" + std::to_string(port) + ": ";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    *error = where + "'" + host + "' is not an IPv4 address";
    return -1;
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = where + "socket(): " + std::strerror(errno);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, backlog) != 0) {
    *error = where + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  if (bound_port) {
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    *bound_port = ntohs(a.sin_port);
  }
  return fd;
}

}  // namespace gradswitch
