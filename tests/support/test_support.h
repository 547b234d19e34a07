// Shared helpers for the tests: fixture paths, reference tensors, error comparisons.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ms::test {

std::string fixture_dir(const std::string& name);  // tests/fixtures/<name>
std::string moeserve_bin();
// ||a - b|| / ||b|| over all elements (both converted to f32).
double rel_error(const Tensor& a, const Tensor& b);
std::vector<int32_t> to_ids(const Tensor& t);  // I64/I32 tensor -> ids
// Runs a shell command, returns its exit status and captures stdout+stderr into `output`.
int run_command(const std::string& cmd, std::string& output);
std::string temp_dir();  // a fresh directory under the test's temporary root

}  // namespace ms::test
