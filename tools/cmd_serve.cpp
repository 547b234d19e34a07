// `moeserve serve`: the OpenAI-compatible HTTP server (src/server) on the batching engine.
// Without --model-path it serves the demo model (random weights: its text is noise).
#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <iostream>
#include <pthread.h>

#include "commands.h"
#include "core/check.h"
#include "demo_model.h"
#include "io/safetensors.h"
#include "parallel_args.h"
#include "runtime_args.h"
#include "runtime/parallel_engine.h"
#include "server/http_server.h"

namespace ms::cli {
namespace {

struct ServeArgs {
  std::string model_path, dtype = "float32", device = "cpu";
  server::ServerOptions server;
  RuntimeArgs runtime;
  ParallelArgs parallel;
};

// One line before the (possibly long) load: what is about to be read.
void print_checkpoint_summary(const std::string& dir) {
  namespace fs = std::filesystem;
  WeightStore store = WeightStore::open_dir(dir);
  std::set<std::string> shards;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const nlohmann::json j = nlohmann::json::parse(std::ifstream(index));
    for (const auto& [name, file] : j.at("weight_map").items()) shards.insert(file.get<std::string>());
  }
  else
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") shards.insert(e.path().filename().string());
  std::cerr << "loading " << dir << ": " << shards.size() << " shards, " << store.names().size() << " tensors, "
            << double(store.total_bytes()) / 1e9 << " GB" << std::endl;
}

// SIGINT/SIGTERM are blocked in every thread and taken here, so the stop is an ordinary call
// on an ordinary thread rather than work inside a signal handler.
std::thread signal_thread(server::HttpServer& http, sigset_t set) {
  return std::thread([&http, set] {
    int sig = 0;
    sigwait(&set, &sig);
    if (sig == SIGUSR1) return;  // our own wake-up at normal exit
    std::cerr << "\nshutting down (" << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ")" << std::endl;
    http.stop();
  });
}

void run_serve(ServeArgs& a) {
  if (a.model_path.empty()) a.model_path = ensure_demo_model();
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT), sigaddset(&set, SIGTERM), sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before any thread starts: they all inherit it
  std::signal(SIGPIPE, SIG_IGN);              // a client gone mid-write is an error return, not death
  print_checkpoint_summary(a.model_path);
  const auto t0 = std::chrono::steady_clock::now();
  LoadOptions lo;
  lo.device = a.device == "cuda" ? Device::CUDA : Device::CPU;
  lo.act_dtype = a.device == "cuda" ? DType::BF16 : DType::F32;
  lo.parallel = a.parallel.resolved();
  auto text = server::TextProcessor::load_if_present(a.model_path);
  Detokenizer detok;
  if (text) detok = [t = text.get()](std::span<const int32_t> ids) { return t->decode(ids, false); };
  const EngineOptions eo = a.runtime.options(a.dtype == "bfloat16" && a.device == "cpu");
  // One rank: the engine on this thread's device. Several: a rank thread per GPU (or CPU
  // shard), one engine each, stepped in lockstep (runtime/parallel_engine.h).
  std::unique_ptr<CausalLM> model;
  std::unique_ptr<ParallelRunner> ranks;
  std::unique_ptr<EngineApi> engine_owner;
  if (a.parallel.multi_rank()) {
    MS_CHECK(a.dtype != "bfloat16" || a.device == "cuda", "--tp > 1 on the CPU computes in float32");
    ranks = std::make_unique<ParallelRunner>(a.model_path, lo.parallel, lo);
    engine_owner = std::make_unique<ParallelEngine>(*ranks, eo, detok);
  } else {
    model = load_model(a.model_path, lo);
    engine_owner = std::make_unique<Engine>(*model, eo, detok);
  }
  EngineApi& engine = *engine_owner;
  const CausalLM& first_model = model ? *model : ranks->model(0);
  server::ServerContext ctx{engine, first_model.config, text.get(), a.model_path,
                            a.server.served_model_name.empty() ? a.model_path : a.server.served_model_name, eo};
  ctx.limits.max_sequence_len = int(std::min<int64_t>(first_model.config.max_position_embeddings, engine.kv_slots()));
  std::cerr << "loaded in " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
            << " s: KV pool " << engine.kv_slots() << " tokens"
            << (text ? "" : "; no tokenizer.json: token ids only (/generate with input_ids)") << std::endl;
  engine.start();
  server::HttpServer http(ctx, a.server);
  const int port = http.bind();
  std::thread signals = signal_thread(http, set);
  std::cerr << "ready: serving " << ctx.model_name << " at http://" << a.server.host << ":" << port << std::endl;
  std::cout << "ready http://" << a.server.host << ":" << port << std::endl;
  http.run();
  pthread_kill(signals.native_handle(), SIGUSR1);  // no-op if it already took a signal
  signals.join();
  engine.stop();
  std::cerr << "stopped" << std::endl;
}

}  // namespace

void add_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (demo model without --model-path)");
  auto a = std::make_shared<ServeArgs>();
  cmd->add_option("--model-path", a->model_path, "Hugging Face checkpoint directory (default: the demo model)");
  cmd->add_option("--host", a->server.host, "address to listen on");
  cmd->add_option("--port", a->server.port, "port (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", a->server.api_key, "require Authorization: Bearer <key>");
  cmd->add_option("--served-model-name", a->server.served_model_name, "model id reported by /v1/models");
  cmd->add_option("--http-threads", a->server.http_threads, "connections served at once (each stream holds one)")
      ->check(CLI::Range(4, 8192));
  cmd->add_option("--dtype", a->dtype, "activation precision on the CPU")->check(CLI::IsMember({"float32", "bfloat16"}));
  cmd->add_option("--device", a->device, "where the model runs")->check(CLI::IsMember({"cpu", "cuda"}));
  a->runtime.add(cmd);
  a->parallel.add(cmd);
  cmd->callback([a] { run_serve(*a); });
}

}  // namespace ms::cli
