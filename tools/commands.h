// Each tools/cmd_*.cpp adds its subcommands to the moeserve CLI.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace ms::cli {

void add_model_commands(CLI::App& app);  // logits, generate

// "5,17,3" -> {5, 17, 3}; throws naming the flag on anything else.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& flag);

}  // namespace ms::cli
