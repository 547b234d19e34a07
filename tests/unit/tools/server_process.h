// `moeserve serve` as a child process for end-to-end tests: started on a free loopback port
// (--port 0; the URL is read from its "ready http://..." line), stopped with SIGTERM.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/check.h"
#include "test_support.h"

namespace ms::test {

class ServerProcess {
 public:
  explicit ServerProcess(const std::vector<std::string>& args) {
    int out[2];
    MS_CHECK(pipe(out) == 0, "pipe failed");
    pid_ = fork();
    MS_CHECK(pid_ >= 0, "fork failed");
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      const int devnull = open("/dev/null", O_WRONLY);
      dup2(devnull, STDERR_FILENO);  // the loading and ready lines; the test reads stdout only
      close(out[0]);
      std::vector<std::string> argv_s = {moeserve_bin(), "serve", "--host", "127.0.0.1", "--port", "0"};
      argv_s.insert(argv_s.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : argv_s) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    FILE* f = fdopen(out[0], "r");
    char line[512];
    while (f && std::fgets(line, sizeof line, f)) {
      const std::string s = line;
      if (s.rfind("ready ", 0) == 0) {
        url_ = s.substr(6, s.find_last_not_of("\r\n") - 5);
        break;
      }
    }
    stdout_ = f;
    MS_CHECK(!url_.empty(), "moeserve serve exited before printing its ready line");
  }
  ~ServerProcess() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    if (stdout_) std::fclose(stdout_);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  const std::string& url() const { return url_; }

 private:
  pid_t pid_ = -1;
  FILE* stdout_ = nullptr;
  std::string url_;
};

}  // namespace ms::test
