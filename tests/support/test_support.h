// Shared helpers for the tests: fixture paths, reference tensors, error comparisons.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/parallel_config.h"
#include "runtime/engine.h"

namespace ms::test {

std::string fixture_dir(const std::string& name);  // tests/fixtures/<name>
const std::vector<std::string>& all_fixtures();    // the five reference checkpoints
// Test names from fixture names ("deepseek-v3-tiny" -> "deepseek_v3_tiny").
struct FixtureName {
  template <class Param>
  std::string operator()(const ::testing::TestParamInfo<Param>& info) const {
    std::string n = info.param;
    for (auto& ch : n)
      if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return n;
  }
};
std::string moeserve_bin();
// ||a - b|| / ||b|| over all elements (both converted to f32).
double rel_error(const Tensor& a, const Tensor& b);
std::vector<int32_t> to_ids(const Tensor& t);  // I64/I32 tensor -> ids
// Tokens whose experts are the same in every MoE layer of two routing traces ([T, k] ids per
// layer): rounding that flips a near-tie legitimately moves a token far.
std::vector<bool> same_routing(const std::vector<Tensor>& a, const std::vector<Tensor>& b, int64_t T);
// The rows `keep` of a 2-D F32 host tensor.
Tensor select_rows(const Tensor& t, const std::vector<int64_t>& keep);
// Runs a shell command, returns its exit status and captures stdout+stderr into `output`.
int run_command(const std::string& cmd, std::string& output);
std::string temp_dir();  // a fresh directory under the test's temporary root
// One parallel configuration of the test matrices, named for test output.
struct ParallelMode {
  const char* name;
  int tp, dp, ep;  // dp > 1 turns DP attention on
  bool dense_tp_1 = false, a2a = false, no_fusion = false;
};
ParallelConfig config_of(const ParallelMode& m);
// Greedy requests (temperature 0, EOS ignored) of max_new_tokens each, one per prompt.
std::vector<GenerateRequest> greedy_requests(const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens);

}  // namespace ms::test
