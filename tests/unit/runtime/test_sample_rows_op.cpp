// ops::sample_rows_into (the op the engine draws tokens with on the device) is the host sampler:
// on the CPU every row equals sample_token for the same logits, parameters, seed and step; and
// the rule it documents (ranks by decreasing logit, ties to the lower id; top_k, top_p, min_p;
// the first rank whose cumulative weight exceeds u of the kept weight) is what sample_token
// does, checked against a plain full-sort implementation of it. Flat rows (every token within a
// hair of the others, as a random-weight model gives), peaked rows and rows full of ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/ops.h"
#include "runtime/sampler.h"

namespace ms {
namespace {

enum class RowKind { Flat, Peaked, Ties };

std::vector<float> make_row(RowKind shape, int64_t V, std::mt19937& rng) {
  std::vector<float> x(static_cast<size_t>(V));
  if (shape == RowKind::Flat) {
    std::uniform_real_distribution<float> d(3.0f, 3.05f);
    for (float& v : x) v = d(rng);
  } else if (shape == RowKind::Peaked) {
    std::normal_distribution<float> d(0.f, 3.f);
    for (float& v : x) v = d(rng);
    for (int i = 0; i < 3; ++i) x[size_t(rng() % uint32_t(V))] = 14.0f + float(i);
  } else {  // a few distinct values: long runs of equal logits
    std::uniform_int_distribution<int> d(0, 12);
    for (float& v : x) v = 0.25f * float(d(rng));
  }
  return x;
}

// The rule written plainly: a full sort and sums in rank order.
int32_t naive_sample(std::span<const float> x, const ops::RowSampling& p) {
  const size_t V = x.size();
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return x[size_t(a)] > x[size_t(b)]; });
  if (p.greedy()) return ids[0];
  const size_t k = p.top_k > 0 ? std::min<size_t>(size_t(p.top_k), V) : V;
  const double top = double(x[size_t(ids[0])]), inv_t = 1.0 / double(p.temperature);
  std::vector<double> w(k), cum(k);
  for (size_t i = 0; i < k; ++i) {
    w[i] = std::exp((double(x[size_t(ids[i])]) - top) * inv_t);
    cum[i] = (i ? cum[i - 1] : 0.0) + w[i];
  }
  size_t count = k;
  if (p.top_p < 1.0f)
    count = size_t(std::lower_bound(cum.begin(), cum.end(), double(p.top_p) * cum[k - 1]) - cum.begin()) + 1;
  count = std::min(count, k);
  if (p.min_p > 0.0f) {
    size_t n = 0;
    while (n < count && w[n] >= double(p.min_p)) ++n;
    count = std::max<size_t>(n, 1);
  }
  const double bound = ops::uniform_draw(p.seed, p.step) * cum[count - 1];
  const size_t rank = size_t(std::upper_bound(cum.begin(), cum.end(), bound) - cum.begin());
  return ids[std::min(rank, count - 1)];
}

std::vector<ops::RowSampling> param_grid() {
  std::vector<ops::RowSampling> out;
  for (float t : {0.5f, 1.0f, 1.5f})
    for (int k : {1, 20, 0})
      for (float top_p : {0.9f, 1.0f})
        for (float min_p : {0.0f, 0.1f}) out.push_back({t, k, top_p, min_p, 0, 0});
  out.push_back({0.0f, -1, 1.0f, 0.0f, 0, 0});  // greedy by temperature
  return out;
}

TEST(SampleRowsOp, CpuOpIsTheHostSampler) {
  const int64_t V = 3000;
  std::mt19937 rng(5);
  const std::vector<ops::RowSampling> grid = param_grid();
  for (RowKind shape : {RowKind::Flat, RowKind::Peaked, RowKind::Ties}) {
    const int64_t rows = int64_t(grid.size()) * 4;
    Tensor logits = Tensor::empty(DType::F32, {rows, V});
    std::vector<ops::RowSampling> params;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> x = make_row(shape, V, rng);
      std::copy(x.begin(), x.end(), logits.data<float>() + r * V);
      ops::RowSampling p = grid[size_t(r) % grid.size()];
      p.seed = rng(), p.step = uint64_t(r * 7 + 3);
      params.push_back(p);
    }
    Tensor ids = Tensor::empty(DType::I32, {rows});
    ops::sample_rows_into(logits, params, ids);
    for (int64_t r = 0; r < rows; ++r) {
      const ops::RowSampling& p = params[size_t(r)];
      SamplingParams sp;
      sp.temperature = p.temperature, sp.top_k = p.top_k, sp.top_p = p.top_p, sp.min_p = p.min_p;
      ASSERT_TRUE(sp.device_sampleable());
      const std::span<const float> row(logits.data<float>() + r * V, size_t(V));
      const int32_t want = sample_token({row, &sp, {}, {}, p.seed, p.step}).token;
      EXPECT_EQ(ids.data<int32_t>()[r], want) << "shape " << int(shape) << " row " << r;
      EXPECT_EQ(naive_sample(row, p), want) << "shape " << int(shape) << " row " << r << " t " << p.temperature
                                            << " k " << p.top_k << " p " << p.top_p << " min_p " << p.min_p;
    }
  }
}

// Many draws of one flat row: each seed and step picks its own token, and they spread.
TEST(SampleRowsOp, FlatRowSpreadsOverManyTokens) {
  const int64_t V = 20000;
  std::mt19937 rng(9);
  const std::vector<float> x = make_row(RowKind::Flat, V, rng);
  const int64_t rows = 200;
  Tensor logits = Tensor::empty(DType::F32, {rows, V});
  std::vector<ops::RowSampling> params;
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(x.begin(), x.end(), logits.data<float>() + r * V);
    params.push_back({1.0f, -1, 1.0f, 0.0f, 77, uint64_t(r)});
  }
  Tensor ids = Tensor::empty(DType::I32, {rows});
  ops::sample_rows_into(logits, params, ids);
  std::vector<int32_t> got(ids.data<int32_t>(), ids.data<int32_t>() + rows);
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(got[size_t(r)], naive_sample(x, params[size_t(r)])) << r;
  std::sort(got.begin(), got.end());
  EXPECT_GT(std::unique(got.begin(), got.end()) - got.begin(), 190);
}

TEST(SampleRowsOp, DeviceSampleableExcludesPenaltiesAndLogprobs) {
  SamplingParams p;
  EXPECT_TRUE(p.device_sampleable());
  p.temperature = 0.0f;
  EXPECT_TRUE(p.device_sampleable());
  for (int i = 0; i < 5; ++i) {
    SamplingParams q;
    if (i == 0) q.repetition_penalty = 1.1f;
    if (i == 1) q.frequency_penalty = 0.2f;
    if (i == 2) q.presence_penalty = 0.2f;
    if (i == 3) q.return_logprob = true;
    if (i == 4) q.top_logprobs_num = 2;
    EXPECT_FALSE(q.device_sampleable()) << i;
  }
}

}  // namespace
}  // namespace ms
