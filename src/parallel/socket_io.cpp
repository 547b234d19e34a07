#include "parallel/socket_io.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/check.h"

namespace ms::net {

Address Address::parse(const std::string& text) {
  size_t colon = text.rfind(':');
  MS_CHECK(colon != std::string::npos && colon > 0, "--dist-init-addr \"", text, "\" is not host:port");
  Address a{text.substr(0, colon), 0};
  try {
    a.port = std::stoi(text.substr(colon + 1));
  } catch (const std::exception&) {
    fail("--dist-init-addr \"", text, "\" has no numeric port");
  }
  MS_CHECK(a.port > 0 && a.port < 65536, "--dist-init-addr port ", a.port, " is out of range");  // 0 only in tests
  return a;
}

static sockaddr_in resolve(const Address& a) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  int rc = ::getaddrinfo(a.host.c_str(), nullptr, &hints, &res);
  MS_CHECK(rc == 0 && res, "cannot resolve ", a.host, ": ", gai_strerror(rc));
  sockaddr_in sa = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  sa.sin_port = htons(uint16_t(a.port));
  return sa;
}

static void no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int listen_on(const Address& a) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  MS_CHECK(fd >= 0, "socket: ", std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa = resolve(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, 256) != 0) {
    int err = errno;
    ::close(fd);
    fail("cannot listen on ", a.host, ":", a.port, " (--dist-init-addr): ", std::strerror(err));
  }
  return fd;
}

int local_port(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  MS_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0, "getsockname: ", std::strerror(errno));
  return ntohs(sa.sin_port);
}

int accept_one(int listener) {
  int fd = ::accept(listener, nullptr, nullptr);
  if (fd >= 0) no_delay(fd);
  return fd;
}

int connect_to(const Address& a, double timeout_s) {
  sockaddr_in sa = resolve(a);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    MS_CHECK(fd >= 0, "socket: ", std::strerror(errno));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
      no_delay(fd);
      return fd;
    }
    int err = errno;
    ::close(fd);
    MS_CHECK(std::chrono::steady_clock::now() < deadline, "cannot reach node 0 at ", a.host, ":", a.port,
             " (--dist-init-addr): ", std::strerror(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void write_all(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    MS_CHECK(n > 0, "lost the connection to a peer node: ", std::strerror(errno));
    p += n, bytes -= size_t(n);
  }
}

bool read_all(int fd, void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::recv(fd, p + got, bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 && got == 0) return false;
    MS_CHECK(n > 0, "lost the connection to a peer node", n < 0 ? std::string(": ") + std::strerror(errno) : "");
    got += size_t(n);
  }
  return true;
}

void close_fd(int fd) {
  if (fd >= 0) {
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
  }
}

}  // namespace ms::net
