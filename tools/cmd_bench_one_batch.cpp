// `moeserve bench-one-batch`: SGLang's bench_one_batch for a static batch — one prefill of
// B prompts of I tokens, then O decode steps — reporting latency and throughput of each, and
// the bytes of weights a decode step must read (the roofline of a weight-bound step). On the GPU
// one untimed prefill warms up first, and decode steps replay CUDA graphs unless
// --disable-cuda-graph. With the parallelism flags (--tp > 1, --nnodes) the batch runs over
// the ranks (ParallelRunner; on CUDA one GPU per rank, op by op), dealt round robin to the DP
// groups, and the time global rank 0 spends in collectives is reported per step. Several batch
// sizes, input or output lengths (`--batch-size 1 16 64`) run every combination on one load.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "commands.h"
#include "core/check.h"
#include "models/causal_lm.h"
#include "parallel_args.h"
#include "runtime/cuda_graph_runner.h"
#include "runtime/generator.h"
#include "runtime/parallel_runner.h"

namespace ms::cli {
namespace {

struct BenchArgs {
  std::string model_path, device = "cpu", result_file;
  std::vector<int> batch_sizes{1}, input_lens{256}, output_lens{16};  // the cases (SGLang's lists)
  int batch_size = 1, input_len = 256, output_len = 16;                // the case being run
  uint64_t seed = 0;
  int cuda_graph_max_bs = 160;
  bool disable_cuda_graph = false;
  bool trace_ops = false;
  ParallelArgs parallel;
};

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

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

std::vector<std::vector<int32_t>> random_prompts(const BenchArgs& a, int vocab) {
  std::mt19937 rng(uint32_t(a.seed));
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  std::vector<std::vector<int32_t>> ids(size_t(a.batch_size), std::vector<int32_t>(size_t(a.input_len)));
  for (auto& seq : ids)
    for (auto& t : seq) t = tok(rng);
  return ids;
}

// One process, one device: the batch on a single model, decode steps from CUDA graphs.
StaticBatchTimes run_single(const BenchArgs& a, const CausalLM& model, const LoadOptions& o, bool* graphed) {
  const int B = a.batch_size, cap = a.input_len + a.output_len;
  // One slot beyond the sequences' own: padded CUDA-graph batches write their dummies there.
  KvCache kv = model.make_kv_cache(int64_t(B) * cap + 1);
  std::unique_ptr<CudaGraphRunner> graphs;
  if (o.device == Device::CUDA && !a.disable_cuda_graph && a.cuda_graph_max_bs > 0)
    graphs = std::make_unique<CudaGraphRunner>(
        model, kv, CudaGraphOptions{a.cuda_graph_max_bs, int32_t(int64_t(B) * cap), cap, false});
  *graphed = graphs != nullptr;
  auto ids = random_prompts(a, model.config.vocab_size);
  std::vector<int> cached(static_cast<size_t>(B), 0);
  // The ids reach the host as the engine's do (ops::HostReadback), then the host waits for them.
  Tensor ids_dev = Tensor::empty(DType::I32, {B}, o.device);
  auto readback = ops::make_host_readback(o.device, B);
  using clock = std::chrono::steady_clock;
  auto step = [&](const std::vector<std::vector<int32_t>>& step_ids) {
    ForwardBatch fb = Generator::static_batch(step_ids, cached, cap);
    std::optional<Tensor> replayed = graphs ? graphs->decode(fb) : std::nullopt;
    ForwardContext ctx{fb, kv};
    ctx.device = model.device, ctx.act_dtype = model.act_dtype;
    Tensor logits = replayed ? *replayed : model.forward(ctx);
    for (int b = 0; b < B; ++b) cached[b] += int(step_ids[b].size());
    ops::argmax_rows_into(logits, ids_dev);
    readback->start(ids_dev);
    const std::span<const int32_t> got = readback->wait();
    return std::vector<int32_t>(got.begin(), got.end());
  };
  if (o.device == Device::CUDA) {  // as SGLang's warm-up: plans and allocations stay out of the timing
    step(ids);
    std::fill(cached.begin(), cached.end(), 0);
  }
  StaticBatchTimes times;
  if (a.trace_ops) ops::op_trace_start(o.device);
  auto t0 = clock::now();
  auto next = step(ids);
  times.prefill = std::chrono::duration<double>(clock::now() - t0).count();
  if (a.trace_ops) std::printf("The timed prefill, %.3f ms on the host's clock:\n%s", times.prefill * 1e3,
                               ops::op_trace_report(o.device).c_str());
  for (int s = 1; s < a.output_len; ++s) {
    std::vector<std::vector<int32_t>> one(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b) one[b] = {next[b]};
    // A replayed graph is one launch: only a decode step run op by op can be traced.
    const bool trace = a.trace_ops && !graphs && s == a.output_len - 1;
    if (trace) ops::op_trace_start(o.device);
    auto t = clock::now();
    next = step(one);
    times.decode.push_back(std::chrono::duration<double>(clock::now() - t).count());
    if (trace) std::printf("The last decode step, %.3f ms on the host's clock:\n%s", times.decode.back() * 1e3,
                           ops::op_trace_report(o.device).c_str());
    times.decode_comm.push_back(0);
  }
  return times;
}

// One case's figures, printed as SGLang's bench_one_batch prints them, and appended to the
// result file as a JSON line.
void report(const BenchArgs& a, const ParallelConfig& p, const StaticBatchTimes& times, double bytes, bool graphed,
            bool ranks) {
  const int B = a.batch_size;
  const double prefill = times.prefill;
  std::printf("Prefill. latency: %.5f s, throughput: %9.2f token/s\n", prefill, double(B) * a.input_len / prefill);
  for (size_t s = 0; s < times.decode.size() && s < 3; ++s)
    std::printf("Decode %zu. Batch size: %d, latency: %.5f s, throughput: %9.2f token/s\n", s, B, times.decode[s],
                B / times.decode[s]);
  const double median = median_of(times.decode), comm = median_of(times.decode_comm);
  const double total = prefill + std::accumulate(times.decode.begin(), times.decode.end(), 0.0);
  if (median > 0) std::printf("Decode.  median latency: %.5f s, median throughput: %9.2f token/s\n", median, B / median);
  if (ranks)
    std::printf("Collectives (rank 0). prefill: %.5f s, decode median: %.5f s per step (%.1f%% of the step)\n",
                times.prefill_comm, comm, median > 0 ? 100 * comm / median : 0.0);
  std::printf("Total. latency: %.3f s, throughput: %9.2f token/s\n", total, double(B) * (a.input_len + a.output_len) / total);
  std::printf("Decode step reads %.3f GB of weights%s (expected experts under uniform routing)\n", bytes / 1e9,
              ranks ? " over all ranks" : "");
  if (a.result_file.empty()) return;
  nlohmann::json r = {{"model_path", a.model_path}, {"device", a.device},   {"batch_size", B},
                      {"input_len", a.input_len},   {"output_len", a.output_len},
                      {"tp_size", p.tp_size}, {"dp_size", p.enable_dp_attention ? p.dp_size : 1}, {"ep_size", p.ep_size},
                      {"moe_a2a_backend", p.moe_a2a_backend},
                      {"prefill_latency", prefill}, {"prefill_throughput", double(B) * a.input_len / prefill},
                      {"median_decode_latency", median}, {"median_decode_throughput", median > 0 ? B / median : 0.0},
                      {"prefill_collective_seconds", times.prefill_comm}, {"median_decode_collective_seconds", comm},
                      {"decode_weight_bytes", bytes}, {"cuda_graph", graphed}};
  std::ofstream(a.result_file, std::ios::app) << r.dump() << "\n";
}

// The model loads once; every batch size x input length x output length then runs in turn (in
// SGLang's order), each with its own cache, graphs and warm-up.
void bench(const BenchArgs& a) {
  LoadOptions o;
  o.device = a.device == "cuda" ? Device::CUDA : Device::CPU;
  o.act_dtype = a.device == "cuda" ? DType::BF16 : DType::F32;
  o.load_mtp = false;
  o.parallel = a.parallel.resolved();
  const bool ranks = a.parallel.multi_rank();
  std::unique_ptr<ParallelRunner> runner;
  std::unique_ptr<CausalLM> single;
  if (ranks) runner = std::make_unique<ParallelRunner>(a.model_path, o.parallel, o);
  else single = load_model(a.model_path, o);
  const CausalLM& m = ranks ? runner->model(0) : *single;
  for (const int I : a.input_lens)  // every combination checked before the first runs
    for (const int O : a.output_lens)
      MS_CHECK(I + O <= m.config.max_position_embeddings, "input + output length (", I, " + ", O,
               ") exceeds max_position_embeddings (", m.config.max_position_embeddings, ")");
  for (const int B : a.batch_sizes)
    for (const int I : a.input_lens)
      for (const int O : a.output_lens) {
        BenchArgs c = a;
        c.batch_size = B, c.input_len = I, c.output_len = O;
        if (o.parallel.node_rank == 0)
          std::printf("Batch size: %d, input len: %d, output len: %d\n", B, I, O);
        bool graphed = false;
        const StaticBatchTimes times =
            ranks ? runner->static_batch(random_prompts(c, m.config.vocab_size), O) : run_single(c, *single, o, &graphed);
        // Global rank 0 lives on node 0.
        if (o.parallel.node_rank == 0) report(c, o.parallel, times, decode_weight_bytes(m, B), graphed, ranks);
      }
}

}  // namespace

void add_bench_one_batch(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench-one-batch", "prefill and decode latency of one static batch");
  auto a = std::make_shared<BenchArgs>();
  cmd->add_option("--model-path", a->model_path, "checkpoint directory")->required();
  cmd->add_option("--device", a->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--batch-size", a->batch_sizes, "sequences in the batch (several: a run each)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--input-len", a->input_lens, "prompt tokens per sequence (several: a run each)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--output-len", a->output_lens, "tokens generated per sequence (several: a run each)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--seed", a->seed, "seed of the random prompts");
  cmd->add_option("--cuda-graph-max-bs", a->cuda_graph_max_bs, "largest decode batch replayed from a CUDA graph");
  cmd->add_flag("--disable-cuda-graph", a->disable_cuda_graph, "run decode steps op by op");
  cmd->add_flag("--trace-ops", a->trace_ops,
                "CUDA: time the prefill (and, with --disable-cuda-graph, the last decode step) op by op with events "
                "and print where the GPU waited for the host");
  cmd->add_option("--result-file,--result-filename", a->result_file, "append a JSON line with each run's results");
  a->parallel.add(cmd);
  cmd->callback([a] { bench(*a); });
}

}  // namespace ms::cli
