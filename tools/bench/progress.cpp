#include "progress.h"

#include <cmath>
#include <cstdio>

namespace ms::bench {
namespace {
std::string clock_text(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = long(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%02ld:%02ld", t / 60, t % 60);
  return buf;
}
}  // namespace

ProgressBar::ProgressBar(std::string desc, int total, bool enabled)
    : desc_(std::move(desc)), total_(total), enabled_(enabled && total > 0), start_(std::chrono::steady_clock::now()) {
  if (enabled_) draw();
}

ProgressBar::~ProgressBar() {
  if (!enabled_) return;
  if (done_ < total_) draw();  // the last advance drew the finished bar already
  std::fputc('\n', stderr);
}

void ProgressBar::advance(int n) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  done_ += n;
  const auto now = std::chrono::steady_clock::now();
  if (done_ < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  draw();
}

void ProgressBar::draw() {
  last_draw_ = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(last_draw_ - start_).count();
  std::fprintf(stderr, "\r%s", render(desc_, done_, total_, elapsed).c_str());
  std::fflush(stderr);
}

std::string ProgressBar::render(const std::string& desc, int done, int total, double elapsed_s) {
  constexpr int kWidth = 30;
  const double frac = total > 0 ? std::min(1.0, double(done) / total) : 0.0;
  const int filled = int(frac * kWidth);
  const double rate = elapsed_s > 0 ? done / elapsed_s : 0.0;
  const double left = rate > 0 ? (total - done) / rate : NAN;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s%s%3d%%|%s%s| %d/%d [%s<%s, %.2fit/s]", desc.c_str(), desc.empty() ? "" : ": ",
                int(frac * 100), std::string(size_t(filled), '#').c_str(), std::string(size_t(kWidth - filled), ' ').c_str(),
                done, total, clock_text(elapsed_s).c_str(), clock_text(left).c_str(), rate);
  return buf;
}

}  // namespace ms::bench
