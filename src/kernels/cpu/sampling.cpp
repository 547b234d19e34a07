// The sampling rule on host rows (the CPU backend of ops::sample_rows_into, and the host
// sampler's rule after its penalties): temperature, top_k, top_p and min_p, then the token where
// the cumulative weight in rank order passes u = uniform_draw(seed, step) of the kept mass.
// kernels/cuda/sampling.cu computes the same on the GPU.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_ops.h"

namespace ms {
namespace ops {
namespace {

using ops::RowSampling;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The candidates of a draw (the top_k best tokens, or all) in rank order — decreasing logit,
// ties to the lower id — with their weights exp((x - top) / temperature) (the best weighs 1).
// Sorting 150k tokens cost ~30 ms a row, and a draw or a top_p cut reads only the ranks up to
// where the cumulative weight crosses a bound. So the candidates are bucketed by logit (buckets
// are contiguous stretches of the ranking) with each bucket's total weight; walking buckets
// finds the one where a bound is crossed, and only that bucket is sorted.
class RankedWeights {
 public:
  RankedWeights(std::span<const float> x, const RowSampling& p) : x_(x) {
    const size_t V = x.size(), k = p.top_k > 0 ? std::min<size_t>(size_t(p.top_k), V) : V;
    std::vector<int32_t> ids(V);
    std::iota(ids.begin(), ids.end(), 0);
    const float* xs = x.data();  // a plain pointer: the comparator runs V log k times
    const auto higher = [xs](int32_t a, int32_t b) { return xs[a] > xs[b] || (xs[a] == xs[b] && a < b); };
    // A small top_k: one heap pass, most tokens rejected by a single comparison.
    if (k < V && k <= 4096) std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(), higher);
    else if (k < V) std::nth_element(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(), higher);
    ids.resize(k);
    float hi = -INFINITY, lo = INFINITY;
    for (int32_t t : ids) {
      const float v = x[size_t(t)];
      hi = std::max(hi, v);
      if (std::isfinite(v)) lo = std::min(lo, v);
    }
    top_ = hi, inv_t_ = 1.0 / double(p.temperature);
    scale_ = hi > lo ? double(kBuckets - 1) / (double(hi) - double(lo)) : 0.0;
    // Counting sort into buckets; each bucket's tokens are sorted when a walk first enters it.
    std::vector<uint16_t> bucket_of(k);
    std::vector<int32_t> count(kBuckets + 1, 0);
    for (size_t i = 0; i < k; ++i) ++count[size_t(bucket_of[i] = uint16_t(bucket(ids[i]))) + 1];
    for (int b = 0; b < kBuckets; ++b) count[size_t(b) + 1] += count[size_t(b)];
    start_ = count;
    tokens_.resize(k);
    mass_.assign(kBuckets, 0.0);
    for (size_t i = 0; i < k; ++i) {
      const int32_t t = ids[i];
      tokens_[size_t(count[bucket_of[i]]++)] = t;
      mass_[bucket_of[i]] += weight(t);
    }
    sorted_.assign(kBuckets, false);
  }
  size_t size() const { return tokens_.size(); }
  std::span<const int32_t> candidates() const { return tokens_; }  // bucket order
  double weight(int32_t t) const { return std::exp((double(x_[size_t(t)]) - top_) * inv_t_); }
  double total() const { return std::accumulate(mass_.begin(), mass_.end(), 0.0); }
  // The i-th ranked token.
  int32_t at(size_t i) {
    const int b = int(std::upper_bound(start_.begin(), start_.end(), int32_t(i)) - start_.begin()) - 1;
    sort_bucket(b);
    return tokens_[i];
  }
  // The first rank whose cumulative weight (through it) exceeds `bound` (reaches it, when
  // `reach`), and the cumulative weight through it; size() and the total when none does.
  std::pair<size_t, double> crossing(double bound, bool reach) {
    double cum = 0;
    for (int b = 0; b < kBuckets; ++b) {
      const double next = cum + mass_[size_t(b)];
      if (!(reach ? next >= bound : next > bound) || start_[size_t(b)] == start_[size_t(b) + 1]) {
        cum = next;
        continue;
      }
      sort_bucket(b);
      for (int32_t i = start_[size_t(b)]; i < start_[size_t(b) + 1]; ++i) {
        cum += weight(tokens_[size_t(i)]);
        if (reach ? cum >= bound : cum > bound) return {size_t(i), cum};
      }
      // Summed one by one, the bucket can fall a hair short of its total: go on.
    }
    return {size(), cum};
  }
  // The total weight of the first n ranks.
  double prefix_mass(size_t n) {
    if (n >= size()) return total();
    const int last = int(std::upper_bound(start_.begin(), start_.end(), int32_t(n)) - start_.begin()) - 1;
    double cum = 0;
    for (int b = 0; b < last; ++b) cum += mass_[size_t(b)];
    sort_bucket(last);
    for (int32_t i = start_[size_t(last)]; i < int32_t(n); ++i) cum += weight(tokens_[size_t(i)]);
    return cum;
  }

 private:
  static constexpr int kBuckets = 2048;
  bool higher(int32_t a, int32_t b) const {
    return x_[size_t(a)] > x_[size_t(b)] || (x_[size_t(a)] == x_[size_t(b)] && a < b);
  }
  int bucket(int32_t t) const {  // monotone in the logit: bucket 0 holds the best
    const double d = (top_ - double(x_[size_t(t)])) * scale_;
    return d < double(kBuckets - 1) ? int(d) : kBuckets - 1;  // also -inf and NaN
  }
  void sort_bucket(int b) {
    if (sorted_[size_t(b)]) return;
    std::sort(tokens_.begin() + start_[size_t(b)], tokens_.begin() + start_[size_t(b) + 1],
              [this](int32_t a, int32_t c) { return higher(a, c); });
    sorted_[size_t(b)] = true;
  }

  std::span<const float> x_;
  double top_ = 0, inv_t_ = 1, scale_ = 0;
  std::vector<int32_t> tokens_, start_;  // tokens by bucket; bucket b is [start_[b], start_[b + 1])
  std::vector<double> mass_;
  std::vector<bool> sorted_;
};

// What top_k, top_p and min_p keep: the first `count` ranks, of total weight `mass`.
struct Kept {
  RankedWeights ranked;
  size_t count = 0;
  double mass = 0;
};

Kept filter(std::span<const float> x, const RowSampling& p) {
  Kept c{RankedWeights(x, p)};
  const double sum = c.ranked.total();
  c.count = c.ranked.size(), c.mass = sum;
  if (p.top_p < 1.0f) {  // the shortest prefix reaching top_p of the mass
    auto [last, cum] = c.ranked.crossing(double(p.top_p) * sum, true);
    c.count = std::min(c.ranked.size(), last + 1), c.mass = cum;
  }
  if (p.min_p > 0.0f) {  // then the ranks under min_p times the best one's weight (1) go
    size_t n = 0;
    while (n < c.count && c.ranked.weight(c.ranked.at(n)) >= double(p.min_p)) ++n;
    n = std::max<size_t>(n, 1);
    if (n < c.count) c.count = n, c.mass = c.ranked.prefix_mass(n);
  }
  return c;
}

}  // namespace

double uniform_draw(uint64_t seed, uint64_t step) {
  const uint64_t bits = splitmix64(splitmix64(seed) ^ (step * 0xD1B54A32D192ED03ull));
  return double(bits >> 11) * 0x1.0p-53;
}

std::vector<double> sampling_distribution(std::span<const float> logits, const RowSampling& p) {
  std::vector<double> out(logits.size(), 0.0);
  if (p.greedy()) {
    out[size_t(std::max_element(logits.begin(), logits.end()) - logits.begin())] = 1.0;
    return out;
  }
  Kept c = filter(logits, p);
  const bool all = c.count == c.ranked.size();  // then no order is needed
  for (size_t i = 0; i < c.count; ++i) {
    const int32_t t = all ? c.ranked.candidates()[i] : c.ranked.at(i);
    out[size_t(t)] = c.ranked.weight(t) / c.mass;
  }
  return out;
}

int32_t sample_row(std::span<const float> x, const RowSampling& p) {
  MS_ASSERT(!x.empty());
  if (p.greedy()) return int32_t(std::max_element(x.begin(), x.end()) - x.begin());
  // The first token, in rank order, whose cumulative weight passes u of the kept mass.
  Kept c = filter(x, p);
  const size_t rank = c.ranked.crossing(uniform_draw(p.seed, p.step) * c.mass, false).first;
  return c.ranked.at(std::min(rank, c.count - 1));  // rounding can leave the sum a hair under u
}

}  // namespace ops

namespace cpu {

void sample_rows_into(const Tensor& logits, std::span<const ops::RowSampling> rows, Tensor& ids) {
  const Tensor x = logits.dtype() == DType::F32 ? logits : logits.to_f32();
  const int64_t V = x.size(1);
  // Rows are independent (each draw is a function of its row's seed and step).
  ThreadPool::global().parallel_for(int64_t(rows.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      ids.data<int32_t>()[r] =
          ops::sample_row(std::span<const float>(x.data<float>() + r * x.strides()[0], size_t(V)), rows[size_t(r)]);
  });
}

}  // namespace cpu
}  // namespace ms
