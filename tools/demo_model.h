// The demo model: a small random-weight Qwen3-MoE-shaped checkpoint with a real byte-level BPE
// tokenizer (trained on a built-in text) and a ChatML chat template, so that `moeserve serve`
// and `generate` work with no download. Its weights are random: its text is noise.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace ms::cli {

void make_demo_model(const std::string& dir);
// $XDG_CACHE_HOME/moeserve/demo-v1, else ~/.cache/moeserve/demo-v1.
std::string default_demo_dir();
// The default demo model's directory, written on first use (safe against concurrent first uses).
std::string ensure_demo_model();
void add_make_demo_model(CLI::App& app);

}  // namespace ms::cli
