// `moeserve bench-one-batch`: SGLang's bench_one_batch for a static batch — one prefill of
// B prompts of I tokens, then O decode steps — reporting latency and throughput of each, and
// the bytes of weights a decode step must read (the roofline of a weight-bound step). On the GPU
// one untimed prefill warms up first, and decode steps replay CUDA graphs unless
// --disable-cuda-graph.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "commands.h"
#include "core/check.h"
#include "models/causal_lm.h"
#include "runtime/cuda_graph_runner.h"

namespace ms::cli {
namespace {

struct BenchArgs {
  std::string model_path, device = "cpu", result_file;
  int batch_size = 1, input_len = 256, output_len = 16;
  uint64_t seed = 0;
  int cuda_graph_max_bs = 160;
  bool disable_cuda_graph = false;
};

// B sequences; sequence b owns slots [b * cap, (b + 1) * cap). `lens[b]` tokens are cached.
ForwardBatch make_batch(const std::vector<std::vector<int32_t>>& step_ids, const std::vector<int>& cached, int cap) {
  ForwardBatch fb;
  fb.attn.q_start = {0};
  fb.attn.kv_start = {0};
  for (size_t b = 0; b < step_ids.size(); ++b) {
    const int start = cached[b], n = int(step_ids[b].size());
    for (int i = 0; i < n; ++i) {
      fb.input_ids.push_back(step_ids[b][i]);
      fb.positions.push_back(start + i);
      fb.out_cache_loc.push_back(int(b) * cap + start + i);
    }
    for (int p = 0; p < start + n; ++p) fb.attn.kv_slots.push_back(int(b) * cap + p);
    fb.attn.q_start.push_back(fb.attn.q_start.back() + n);
    fb.attn.kv_start.push_back(int(fb.attn.kv_slots.size()));
  }
  return fb;
}

// Bytes of weights one decode step of `batch` tokens reads: every dense tensor, one
// embedding row per token, and the experts the batch is expected to touch under uniform
// routing (E * (1 - (1 - k/E)^B) per MoE layer). The MTP layer is not run, so not counted.
double decode_weight_bytes(const CausalLM& m, int batch) {
  const ModelConfig& c = m.config;
  const std::string mtp = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
  double dense = 0, experts = 0;
  for (const auto& name : m.weights->names()) {
    if (name.rfind(mtp, 0) == 0) continue;
    double bytes = double(m.weights->get(name).nbytes());
    if (name == "model.embed_tokens.weight") dense += bytes / c.vocab_size * batch;
    else if (name.find(".experts.") != std::string::npos) experts += bytes;
    else dense += bytes;
  }
  if (c.n_routed_experts > 0) {
    const double E = c.n_routed_experts, k = c.num_experts_per_tok;
    experts *= (1.0 - std::pow(1.0 - k / E, batch));  // fraction of all experts touched
  }
  return dense + experts;
}

void bench(const BenchArgs& a) {
  LoadOptions o;
  o.device = a.device == "cuda" ? Device::CUDA : Device::CPU;
  o.act_dtype = a.device == "cuda" ? DType::BF16 : DType::F32;
  o.load_mtp = false;
  auto model = load_model(a.model_path, o);
  const int B = a.batch_size, cap = a.input_len + a.output_len;
  MS_CHECK(cap <= model->config.max_position_embeddings, "input + output length exceeds max_position_embeddings");
  // One slot beyond the sequences' own: padded CUDA-graph batches write their dummies there.
  KvCache kv = model->make_kv_cache(int64_t(B) * cap + 1);
  std::unique_ptr<CudaGraphRunner> graphs;
  if (o.device == Device::CUDA && !a.disable_cuda_graph && a.cuda_graph_max_bs > 0)
    graphs = std::make_unique<CudaGraphRunner>(
        *model, kv, CudaGraphOptions{a.cuda_graph_max_bs, int32_t(int64_t(B) * cap), cap, false});
  std::mt19937 rng(uint32_t(a.seed));
  std::uniform_int_distribution<int32_t> tok(0, model->config.vocab_size - 1);
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(B), std::vector<int32_t>(static_cast<size_t>(a.input_len)));
  for (auto& seq : ids)
    for (auto& t : seq) t = tok(rng);
  std::vector<int> cached(static_cast<size_t>(B), 0);
  using clock = std::chrono::steady_clock;
  auto step = [&](const std::vector<std::vector<int32_t>>& step_ids) {
    ForwardBatch fb = make_batch(step_ids, cached, cap);
    std::optional<Tensor> replayed = graphs ? graphs->decode(fb) : std::nullopt;
    ForwardContext ctx{fb, kv};
    ctx.device = model->device, ctx.act_dtype = model->act_dtype;
    // The copy to the host waits for the device.
    Tensor logits = (replayed ? *replayed : model->forward(ctx)).to_f32();
    for (int b = 0; b < B; ++b) cached[b] += int(step_ids[b].size());
    return ops::argmax_rows(logits);
  };
  if (o.device == Device::CUDA) {  // as SGLang's warm-up: plans and allocations stay out of the timing
    step(ids);
    std::fill(cached.begin(), cached.end(), 0);
  }
  auto t0 = clock::now();
  auto next = step(ids);
  double prefill = std::chrono::duration<double>(clock::now() - t0).count();
  std::printf("Prefill. latency: %.5f s, throughput: %9.2f token/s\n", prefill, double(B) * a.input_len / prefill);
  std::vector<double> decode;
  for (int s = 1; s < a.output_len; ++s) {
    std::vector<std::vector<int32_t>> one(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b) one[b] = {next[b]};
    auto t = clock::now();
    next = step(one);
    decode.push_back(std::chrono::duration<double>(clock::now() - t).count());
    if (s <= 3) std::printf("Decode %d. Batch size: %d, latency: %.5f s, throughput: %9.2f token/s\n", s - 1, B,
                            decode.back(), B / decode.back());
  }
  double median = 0, total = prefill + std::accumulate(decode.begin(), decode.end(), 0.0);
  if (!decode.empty()) {
    std::vector<double> d = decode;
    std::nth_element(d.begin(), d.begin() + d.size() / 2, d.end());
    median = d[d.size() / 2];
    std::printf("Decode.  median latency: %.5f s, median throughput: %9.2f token/s\n", median, B / median);
  }
  double bytes = decode_weight_bytes(*model, B);
  std::printf("Total. latency: %.3f s, throughput: %9.2f token/s\n", total, double(B) * (a.input_len + a.output_len) / total);
  std::printf("Decode step reads %.3f GB of weights (expected experts under uniform routing)\n", bytes / 1e9);
  if (!a.result_file.empty()) {
    nlohmann::json r = {{"model_path", a.model_path}, {"device", a.device},   {"batch_size", B},
                        {"input_len", a.input_len},   {"output_len", a.output_len},
                        {"prefill_latency", prefill}, {"prefill_throughput", double(B) * a.input_len / prefill},
                        {"median_decode_latency", median}, {"median_decode_throughput", median > 0 ? B / median : 0.0},
                        {"decode_weight_bytes", bytes}, {"cuda_graph", graphs != nullptr}};
    std::ofstream(a.result_file, std::ios::app) << r.dump() << "\n";
  }
}

}  // namespace

void add_bench_one_batch(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench-one-batch", "prefill and decode latency of one static batch");
  auto a = std::make_shared<BenchArgs>();
  cmd->add_option("--model-path", a->model_path, "checkpoint directory")->required();
  cmd->add_option("--device", a->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--batch-size", a->batch_size, "sequences in the batch")->check(CLI::PositiveNumber);
  cmd->add_option("--input-len", a->input_len, "prompt tokens per sequence")->check(CLI::PositiveNumber);
  cmd->add_option("--output-len", a->output_len, "tokens generated per sequence")->check(CLI::PositiveNumber);
  cmd->add_option("--seed", a->seed, "seed of the random prompts");
  cmd->add_option("--cuda-graph-max-bs", a->cuda_graph_max_bs, "largest decode batch replayed from a CUDA graph");
  cmd->add_flag("--disable-cuda-graph", a->disable_cuda_graph, "run decode steps op by op");
  cmd->add_option("--result-file", a->result_file, "append a JSON line with the results");
  cmd->callback([a] { bench(*a); });
}

}  // namespace ms::cli
