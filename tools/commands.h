// Each tools/cmd_*.cpp adds its subcommands to the moeserve CLI.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace ms::cli {

void add_model_commands(CLI::App& app);  // logits, generate
void add_text_commands(CLI::App& app);   // tokenize, detokenize, chat-template, bench-tokenizer
void add_make_random_model(CLI::App& app);
void add_bench_one_batch(CLI::App& app);
void add_serve(CLI::App& app);            // serve (src/server: the OpenAI-compatible HTTP server)
void add_make_demo_model(CLI::App& app);  // make-demo-model (demo_model.h)
void add_bench_serving(CLI::App& app);  // bench-serving (tools/bench/: the HTTP benchmark client)
void add_bench_offline(CLI::App& app);
void add_eval_gsm8k(CLI::App& app);
void add_bench_speculative(CLI::App& app);  // bench-speculative (decode speed-up at set acceptance)

// "5,17,3" -> {5, 17, 3}; throws naming the flag on anything else.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& flag);

}  // namespace ms::cli
