// Blocking TCP helpers for the multi-node rendezvous: whole-buffer reads and writes, and
// listen/connect on "host:port" with the errors naming the address.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace ms::net {

struct Address {
  std::string host;
  int port = 0;
  static Address parse(const std::string& text);  // "host:port"; throws naming --dist-init-addr
};

int listen_on(const Address& a);                    // a listening socket (SO_REUSEADDR); port 0: any free port
int local_port(int fd);                             // the port a socket is bound to
int accept_one(int listener);                       // -1 once the listener is closed
int connect_to(const Address& a, double timeout_s);  // retries until the peer listens or time runs out
void write_all(int fd, const void* data, size_t bytes);  // throws when the peer is gone
bool read_all(int fd, void* data, size_t bytes);         // false on a clean close before any byte
void close_fd(int fd);

}  // namespace ms::net
