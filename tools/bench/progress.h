// A tqdm-style progress line on stderr ("desc: 40%|####      | 26/64 [00:03<00:04, 8.10it/s]"),
// redrawn at most ten times a second; safe to advance from many threads.
#pragma once
#include <chrono>
#include <mutex>
#include <string>

namespace ms::bench {

class ProgressBar {
 public:
  ProgressBar(std::string desc, int total, bool enabled);
  ~ProgressBar();  // draws the final state and ends the line
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  void advance(int n = 1);

  // The line for `done` of `total` after `elapsed_s` seconds.
  static std::string render(const std::string& desc, int done, int total, double elapsed_s);

 private:
  void draw();
  std::string desc_;
  int total_, done_ = 0;
  bool enabled_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace ms::bench
