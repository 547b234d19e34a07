// All-to-all expert dispatch (--moe-a2a-backend all2all, ep == tp): instead of every rank
// running its experts over the whole gathered batch, each routed (token, expert) pair travels
// to the rank that owns the expert and only its weighted result comes back.
#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "layers/moe.h"
#include "parallel/groups.h"

namespace ms {
namespace {

struct Dispatch {
  std::vector<int32_t> token;   // token row of each routed pair, grouped by destination rank
  std::vector<float> meta;      // per pair: global expert id, weight
  std::vector<int64_t> counts;  // pairs per destination rank
};

// The (token, expert) pairs of the rows this rank owns, ordered by the rank owning the expert.
Dispatch plan(const Tensor& ids, const Tensor& weights, int owner_groups, int owner_index, int ranks,
              int experts_per_rank) {
  const int64_t T = ids.size(0), C = ids.size(1);
  std::vector<std::vector<std::pair<int32_t, int64_t>>> by_rank(static_cast<size_t>(ranks));
  for (int64_t t = owner_index; t < T; t += owner_groups)
    for (int64_t j = 0; j < C; ++j) by_rank[ids.data<int32_t>()[t * C + j] / experts_per_rank].push_back({int32_t(t), t * C + j});
  Dispatch d;
  for (auto& pairs : by_rank) {
    d.counts.push_back(int64_t(pairs.size()));
    for (auto& [t, k] : pairs) {
      d.token.push_back(t);
      d.meta.push_back(float(ids.data<int32_t>()[k]));
      d.meta.push_back(weights.data<float>()[k]);
    }
  }
  return d;
}

}  // namespace

Tensor SparseMoe::forward_all_to_all(const Tensor& x, const ForwardContext& ctx) const {
  MS_CHECK(ctx.parallel != nullptr, "all-to-all MoE dispatch needs parallel groups");
  DeviceComm& ep = *ctx.parallel->world;
  DeviceComm& attn = *ctx.parallel->attn_tp;
  const int64_t T = x.size(0), H = x.size(1);
  MS_CHECK(w_.experts.total() % ep.size() == 0, "all-to-all dispatch: ", w_.experts.total(), " experts over ",
           ep.size(), " ranks");
  Tensor ids = ctx.empty({T, router_.columns()}, DType::I32);
  Tensor weights = ctx.empty({T, router_.columns()}, DType::F32);
  route(x, ids, weights);
  Tensor host_ids = ids.to(Device::CPU), host_w = weights.to(Device::CPU);
  if (ctx.routing_trace) ctx.routing_trace->push_back(host_ids.clone());
  Dispatch d = plan(host_ids, host_w, attn.size(), attn.rank(), ep.size(), w_.experts.total() / ep.size());

  const int64_t n = int64_t(d.token.size());
  Tensor send_x = ctx.empty({n, H});
  ops::gather_rows(x, d.token, send_x);
  Tensor send_meta = Tensor::from_vector(d.meta, {n, 2}).to(ctx.device);
  std::vector<int64_t> recv_counts;
  Tensor recv_x = ep.all_to_all_v(send_x, d.counts, &recv_counts);
  Tensor recv_meta = ep.all_to_all_v(send_meta, d.counts, nullptr).to(Device::CPU);

  const int64_t m = recv_x.size(0);
  Tensor r_ids = Tensor::empty(DType::I32, {m, 1}), r_w = Tensor::empty(DType::F32, {m, 1});
  for (int64_t i = 0; i < m; ++i) {
    r_ids.data<int32_t>()[i] = int32_t(recv_meta.data<float>()[2 * i]);
    r_w.data<float>()[i] = recv_meta.data<float>()[2 * i + 1];
  }
  Tensor y = ctx.empty({m, H});
  ops::moe_experts(recv_x, r_ids.to(ctx.device), r_w.to(ctx.device), w_.experts, y);
  Tensor back = ep.all_to_all_v(y, recv_counts, nullptr);  // results return in the order they were sent

  Tensor out = ctx.zeros({T, H});
  ops::index_add_rows(out, d.token, back);
  ctx.round(out);
  if (w_.shared.defined()) {  // the unfused shared expert runs whole on every rank, for the rows it owns
    std::vector<int32_t> mine;
    for (int64_t t = attn.rank(); t < T; t += attn.size()) mine.push_back(int32_t(t));
    Tensor xs = ctx.empty({int64_t(mine.size()), H}), part = ctx.zeros({int64_t(mine.size()), H});
    ops::gather_rows(x, mine, xs);
    add_shared(xs, ctx, part);
    ops::index_add_rows(out, mine, part);
  }
  return out;
}

}  // namespace ms
