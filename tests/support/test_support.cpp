#include "test_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "core/check.h"

namespace ms::test {

std::string fixture_dir(const std::string& name) { return std::string(MOESERVE_FIXTURES) + "/" + name; }
std::string moeserve_bin() { return MOESERVE_BIN; }

const std::vector<std::string>& all_fixtures() {
  static const std::vector<std::string> names = {"deepseek-v3-tiny", "deepseek-v3-fp8-tiny", "deepseek-v2-lite-tiny",
                                                 "qwen3-moe-tiny", "qwen2-moe-tiny"};
  return names;
}

double rel_error(const Tensor& a, const Tensor& b) {
  MS_CHECK(a.numel() == b.numel(), "rel_error: ", a.describe(), " vs ", b.describe());
  auto x = a.to_vector(), y = b.to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += double(x[i] - y[i]) * double(x[i] - y[i]);
    den += double(y[i]) * double(y[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

std::vector<int32_t> to_ids(const Tensor& t) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < t.numel(); ++i)
    out.push_back(t.dtype() == DType::I64 ? int32_t(t.data<int64_t>()[i]) : t.data<int32_t>()[i]);
  return out;
}

std::vector<bool> same_routing(const std::vector<Tensor>& a, const std::vector<Tensor>& b, int64_t T) {
  std::vector<bool> same(static_cast<size_t>(T), true);
  EXPECT_EQ(a.size(), b.size()) << "the two runs went through different numbers of MoE layers";
  for (size_t l = 0; l < std::min(a.size(), b.size()); ++l) {
    const int64_t k = a[l].size(1);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> x(a[l].data<int32_t>() + t * k, a[l].data<int32_t>() + (t + 1) * k);
      std::vector<int32_t> y(b[l].data<int32_t>() + t * k, b[l].data<int32_t>() + (t + 1) * k);
      std::sort(x.begin(), x.end()), std::sort(y.begin(), y.end());
      if (x != y) same[t] = false;
    }
  }
  return same;
}

Tensor select_rows(const Tensor& t, const std::vector<int64_t>& keep) {
  const int64_t V = t.size(1);
  Tensor out = Tensor::empty(DType::F32, {int64_t(keep.size()), V});
  for (size_t r = 0; r < keep.size(); ++r) std::copy_n(t.data<float>() + keep[r] * V, V, out.data<float>() + r * V);
  return out;
}

int run_command(const std::string& cmd, std::string& output) {
  output.clear();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  MS_CHECK(p, "cannot run ", cmd);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) output.append(buf, n);
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// mkdtemp, not pid + counter: ctest runs each test in its own process, and a recycled pid
// would hand a test the directory (and the old output files) of an earlier one.
std::string temp_dir() {
  static struct Made {
    std::mutex mu;
    std::vector<std::filesystem::path> dirs;
    ~Made() {
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  } made;
  std::string pattern = (std::filesystem::temp_directory_path() / "moeserve-test-XXXXXX").string();
  MS_CHECK(::mkdtemp(pattern.data()) != nullptr, "mkdtemp ", pattern, " failed");
  std::lock_guard lk(made.mu);
  made.dirs.emplace_back(pattern);
  return pattern;
}

std::vector<GenerateRequest> greedy_requests(const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens) {
  std::vector<GenerateRequest> out;
  for (const auto& p : prompts) {
    GenerateRequest g;
    g.input_ids = p;
    g.sampling.temperature = 0.0f;
    g.sampling.max_new_tokens = max_new_tokens;
    g.sampling.ignore_eos = true;
    out.push_back(g);
  }
  return out;
}

ParallelConfig config_of(const ParallelMode& m) {
  ParallelConfig p;
  p.tp_size = m.tp, p.dp_size = m.dp, p.enable_dp_attention = m.dp > 1, p.ep_size = m.ep;
  p.moe_dense_tp_size = m.dense_tp_1 ? 1 : 0;
  p.moe_a2a_backend = m.a2a ? "all2all" : "none";
  p.disable_shared_experts_fusion = m.no_fusion;
  return p;
}

}  // namespace ms::test
