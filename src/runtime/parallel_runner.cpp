#include "runtime/parallel_runner.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/check.h"
#include "kernels/ops.h"
#include "runtime/generator.h"

namespace ms {

ParallelRunner::ParallelRunner(const std::string& model_dir, const ParallelConfig& config, const LoadOptions& base)
    : config_(config), device_(base.device), groups_(LocalGroups::create(config, base.device)),
      models_(size_t(groups_->size())) {
  on_all_ranks([&](int r) {
    groups_->connect(r);
    LoadOptions o = base;
    o.parallel = config_;
    o.groups = &groups_->rank(r);
    models_[r] = load_model(model_dir, o);
  });
}

void ParallelRunner::on_all_ranks(const std::function<void(int)>& fn) {
  const int n = groups_->size();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    try {
      threads.emplace_back([&, r] {
        try {
          if (device_ != Device::CPU) ops::init_backend(device_, config_.gpu_of(r));
          fn(r);
        } catch (...) {
          errors[r] = std::current_exception();
          groups_->abort();  // peers waiting in a collective for this rank give up instead of hanging
        }
      });
    } catch (...) {  // no thread for this rank (a resource limit): the started ranks must not wait for it
      errors[r] = std::current_exception();
      groups_->abort();
      break;
    }
  }
  for (auto& t : threads) t.join();
  // The first failure that is not a peer giving up is the cause.
  for (auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const PeerAborted&) {
    }
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Inputs are checked before any rank starts: a rank failing alone would leave the others
// waiting in a collective.
void ParallelRunner::check_prompts(const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens) const {
  MS_CHECK(int(prompts.size()) == dp_size(), prompts.size(), " prompts for ", dp_size(), " DP groups");
  const ModelConfig& c = models_[0]->config;
  for (auto& p : prompts) {
    for (int32_t id : p)
      MS_CHECK(id >= 0 && id < c.vocab_size, "token id ", id, " is out of range (vocab_size ", c.vocab_size, ")");
    MS_CHECK(int(p.size()) + max_new_tokens <= c.max_position_embeddings, "prompt + new tokens exceed max_position_embeddings");
  }
}

std::vector<Tensor> ParallelRunner::prompt_logits(const std::vector<std::vector<int32_t>>& prompts,
                                                  std::vector<Tensor>* routing) {
  check_prompts(prompts, 0);
  std::vector<Tensor> out(prompts.size());
  on_all_ranks([&](int r) {
    const CausalLM& m = *models_[r];
    const int g = groups_->rank(r).layout.attn_dp_rank % dp_size();
    KvCache kv = m.make_kv_cache(std::max<int64_t>(1, int64_t(prompts[g].size())));
    Generator gen(m);
    ForwardBatch b = Generator::single_sequence_batch(prompts[g], 0, true);
    const bool traced = routing && groups_->rank(r).layout.rank == 0;
    Tensor logits = m.forward(gen.context(b, kv, traced ? routing : nullptr)).to_f32().to(Device::CPU);
    if (groups_->rank(r).layout.attn_tp_rank == 0) out[g] = logits;
  });
  return out;
}

std::vector<std::vector<int32_t>> ParallelRunner::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                           int max_new_tokens, bool ignore_eos) {
  check_prompts(prompts, max_new_tokens);
  std::vector<std::vector<int32_t>> out(prompts.size());
  on_all_ranks([&](int r) {
    const CausalLM& m = *models_[r];
    const ParallelGroups& pg = groups_->rank(r);
    const int g = pg.layout.attn_dp_rank % dp_size();
    KvCache kv = m.make_kv_cache(std::max<int64_t>(1, int64_t(prompts[g].size()) + max_new_tokens));
    Generator gen(m);
    const auto& eos = m.config.eos_token_ids;
    std::vector<int32_t> produced, step = prompts[g];
    int pos = 0;
    bool active = !step.empty();
    for (int s = 0; s < max_new_tokens; ++s) {
      // Every rank steps until no DP group has work left.
      auto busy = pg.world->all_gather_values(active ? 1 : 0);
      if (std::none_of(busy.begin(), busy.end(), [](int64_t v) { return v != 0; })) break;
      ForwardBatch b = Generator::single_sequence_batch(active ? step : std::vector<int32_t>{}, pos, false);
      Tensor logits = m.forward(gen.context(b, kv));
      if (!active) continue;
      pos += int(step.size());
      int32_t next = ops::argmax_rows(logits)[0];
      produced.push_back(next);
      step = {next};
      if (!ignore_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) active = false;
    }
    if (pg.layout.attn_tp_rank == 0) out[g] = produced;
  });
  return out;
}

StaticBatchTimes ParallelRunner::static_batch(const std::vector<std::vector<int32_t>>& prompts, int output_len) {
  MS_CHECK(!prompts.empty() && output_len >= 1, "static batch: no prompts or no output");
  const int input_len = int(prompts[0].size()), cap = input_len + output_len;
  for (const auto& p : prompts) MS_CHECK(int(p.size()) == input_len, "static batch: prompts differ in length");
  for (const auto& p : prompts) check_prompts(std::vector<std::vector<int32_t>>(size_t(dp_size()), p), output_len);
  StaticBatchTimes times;
  on_all_ranks([&](int r) {
    const CausalLM& m = *models_[r];
    const ParallelGroups& pg = groups_->rank(r);
    const int g = pg.layout.attn_dp_rank % dp_size();
    std::vector<std::vector<int32_t>> mine;
    for (size_t i = size_t(g); i < prompts.size(); i += size_t(dp_size())) mine.push_back(prompts[i]);
    KvCache kv = m.make_kv_cache(std::max<int64_t>(1, int64_t(mine.size()) * cap));
    Generator gen(m);
    std::vector<int> cached(mine.size(), 0);
    DeviceComm* comms[] = {pg.world, pg.attn_tp, pg.dp};
    // One step of every rank together; returns its wall time and this rank's time in collectives.
    auto step = [&](const std::vector<std::vector<int32_t>>& ids, std::vector<int32_t>* next) {
      pg.world->barrier();
      for (DeviceComm* c : comms) c->time_collectives(true);
      const auto t0 = std::chrono::steady_clock::now();
      ForwardBatch b = Generator::static_batch(ids, cached, cap);
      // As the single-GPU bench: the argmax runs where the logits are and only ids reach the host
      // (copying B x vocab logits to the host would dominate a large batch's step).
      std::vector<int32_t> picked = ops::argmax_rows(m.forward(gen.context(b, kv)));
      double comm = 0;
      for (DeviceComm* c : comms) comm += c->collective_seconds(), c->time_collectives(false);
      pg.world->barrier();
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (size_t i = 0; i < ids.size(); ++i) cached[i] += int(ids[i].size());
      if (next) *next = std::move(picked);
      return std::pair{wall, comm};
    };
    if (m.device == Device::CUDA) {  // plans and allocations stay out of the timing
      step(mine, nullptr);
      std::fill(cached.begin(), cached.end(), 0);
    }
    std::vector<int32_t> next;
    auto [prefill, prefill_comm] = step(mine, &next);
    std::vector<double> decode, decode_comm;
    for (int s = 1; s < output_len; ++s) {
      std::vector<std::vector<int32_t>> one(mine.size());
      for (size_t i = 0; i < mine.size(); ++i) one[i] = {next[i]};
      auto [wall, comm] = step(one, &next);
      decode.push_back(wall), decode_comm.push_back(comm);
    }
    if (pg.layout.rank == 0) times = {prefill, prefill_comm, decode, decode_comm};
  });
  return times;
}

}  // namespace ms
