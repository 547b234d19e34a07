// The op trace (op_trace.h): a pair of timing events an op call, kept in call order, read back
// once at the report.
#include "kernels/cuda/op_trace.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "kernels/cuda/cuda_common.h"

namespace ms::cuda {
namespace {

using Clock = std::chrono::steady_clock;

struct Call {
  std::string name;  // the op's name: the call's text up to its '('
  cudaEvent_t begin = nullptr, end = nullptr;
  Clock::time_point host_begin, host_end;
};

struct Trace {
  std::mutex mu;
  std::atomic<bool> on{false};  // read without the lock: an op that is not traced takes no lock
  int depth = 0;  // ops called from inside an op are part of the outer one
  cudaEvent_t start = nullptr;
  std::vector<Call> calls;
  std::vector<cudaEvent_t> spare;  // events of earlier traces, reused

  cudaEvent_t event() {
    cudaEvent_t e = nullptr;
    if (!spare.empty()) e = spare.back(), spare.pop_back();
    else MS_CUDA(cudaEventCreate(&e));
    return e;
  }
};

Trace& trace() {
  static Trace* t = new Trace;  // never freed: events may outlive static destruction
  return *t;
}

std::string op_name(const char* call) {
  const std::string s(call);
  return s.substr(0, s.find('('));
}

double ms_between(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0.f;
  MS_CUDA(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

}  // namespace

OpScope::OpScope(const char* call) {
  Trace& t = trace();
  if (!t.on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(t.mu);
  if (!t.on) return;
  counted_ = true;
  if (t.depth++ > 0 || capturing()) return;
  Call c;
  c.name = op_name(call);
  c.begin = t.event(), c.end = t.event();
  c.host_begin = Clock::now();
  MS_CUDA(cudaEventRecord(c.begin, stream()));
  index_ = int(t.calls.size());
  t.calls.push_back(std::move(c));
}

OpScope::~OpScope() {
  if (!counted_) return;
  Trace& t = trace();
  std::lock_guard<std::mutex> lock(t.mu);
  --t.depth;
  if (index_ < 0 || !t.on) return;
  Call& c = t.calls[size_t(index_)];
  (void)cudaEventRecord(c.end, stream());  // a destructor does not throw; the report checks the events
  c.host_end = Clock::now();
}

void op_trace_start() {
  Trace& t = trace();
  std::lock_guard<std::mutex> lock(t.mu);
  MS_CHECK(!t.on, "op trace: already tracing");
  if (!t.start) MS_CUDA(cudaEventCreate(&t.start));
  MS_CUDA(cudaEventRecord(t.start, stream()));
  t.on = true, t.depth = 0;
}

std::string op_trace_report() {
  Trace& t = trace();
  std::lock_guard<std::mutex> lock(t.mu);
  MS_CHECK(t.on, "op trace: not tracing");
  t.on = false;
  MS_CUDA(cudaStreamSynchronize(stream()));
  struct Sum {
    int calls = 0;
    double gpu = 0, idle = 0, host = 0;
  };
  std::map<std::string, Sum> by_name;
  struct Gap {
    double ms;
    size_t index;
  };
  std::vector<Gap> gaps;
  cudaEvent_t prev_end = t.start;
  double gpu = 0, idle = 0;
  for (size_t i = 0; i < t.calls.size(); ++i) {
    const Call& c = t.calls[i];
    Sum& s = by_name[c.name];
    const double busy = ms_between(c.begin, c.end), wait = std::max(0.0, ms_between(prev_end, c.begin));
    ++s.calls, s.gpu += busy, s.idle += wait;
    s.host += std::chrono::duration<double, std::milli>(c.host_end - c.host_begin).count();
    gpu += busy, idle += wait;
    gaps.push_back({wait, i});
    prev_end = c.end;
  }
  const double span = t.calls.empty() ? 0.0 : ms_between(t.start, t.calls.back().end);
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "op trace: %zu calls, %.3f ms from start to the last op's end: %.3f ms in ops, %.3f ms idle between them\n",
                t.calls.size(), span, gpu, idle);
  out += line;
  std::snprintf(line, sizeof line, "  %-28s %6s %10s %10s %10s\n", "op", "calls", "gpu ms", "idle ms", "host ms");
  out += line;
  std::vector<std::pair<std::string, Sum>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.gpu + a.second.idle > b.second.gpu + b.second.idle; });
  for (const auto& [name, s] : rows) {
    std::snprintf(line, sizeof line, "  %-28s %6d %10.3f %10.3f %10.3f\n", name.c_str(), s.calls, s.gpu, s.idle, s.host);
    out += line;
  }
  std::sort(gaps.begin(), gaps.end(), [](const Gap& a, const Gap& b) { return a.ms > b.ms; });
  out += "  largest idle gaps (call number, op after the gap, the op before it):\n";
  for (size_t g = 0; g < std::min<size_t>(8, gaps.size()) && gaps[g].ms > 0.005; ++g) {
    const size_t i = gaps[g].index;
    std::snprintf(line, sizeof line, "    %.3f ms before #%zu %s (after %s)\n", gaps[g].ms, i, t.calls[i].name.c_str(),
                  i > 0 ? t.calls[i - 1].name.c_str() : "the start");
    out += line;
  }
  for (Call& c : t.calls) t.spare.push_back(c.begin), t.spare.push_back(c.end);
  t.calls.clear();
  return out;
}

}  // namespace ms::cuda
