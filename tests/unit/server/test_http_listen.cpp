// The listening socket of `moeserve serve`: a burst of connections is queued by the kernel rather
// than dropped (each dropped SYN costs the client a one-second retransmit), and a second server
// cannot bind a port that one already serves.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/engine.h"
#include "server/http_server.h"
#include "test_support.h"

namespace ms {
namespace {

class HttpListenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = load_model(test::fixture_dir("qwen3-moe-tiny")).release(); }
  static void TearDownTestSuite() { delete model_; }

  HttpListenTest() {
    EngineOptions eo;
    eo.max_total_tokens = 256;
    engine_ = std::make_unique<Engine>(*model_, eo);
    ctx_.reset(new server::ServerContext{*engine_, model_->config, nullptr, "fixture", "fixture", eo});
  }
  server::ServerOptions options(int port) const {
    server::ServerOptions o;
    o.port = port;
    return o;
  }

  static CausalLM* model_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<server::ServerContext> ctx_;
};
CausalLM* HttpListenTest::model_ = nullptr;

// Starts a non-blocking connect to 127.0.0.1:port.
int start_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  return fd;
}

TEST_F(HttpListenTest, ABurstOfConnectionsWaitsInTheBacklog) {
  server::HttpServer http(*ctx_, options(0));
  const int port = http.bind();  // bound and listening, but nothing accepts yet
  constexpr int kClients = 64;
  std::vector<pollfd> fds;
  for (int i = 0; i < kClients; ++i) fds.push_back({start_connect(port), POLLOUT, 0});
  // A connection the kernel queued completes its handshake at once; one beyond the backlog has
  // its SYN dropped and stays pending (for a second, until the client retransmits).
  int connected = 0;
  for (int round = 0; round < 20 && connected < kClients; ++round) {
    poll(fds.data(), fds.size(), 25);
    connected = 0;
    for (auto& p : fds) {
      int err = -1;
      socklen_t len = sizeof err;
      if (p.revents & POLLOUT && getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) ++connected;
    }
  }
  EXPECT_EQ(connected, kClients);
  for (auto& p : fds) close(p.fd);
}

TEST_F(HttpListenTest, ASecondServerCannotTakeTheSamePort) {
  server::HttpServer first(*ctx_, options(0));
  const int port = first.bind();
  server::HttpServer second(*ctx_, options(port));
  try {
    second.bind();
    FAIL() << "a second server bound port " << port;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ms
