// Published model shapes for random-weight checkpoints (benchmarks, tests): the exact
// config.json fields of each family's real checkpoint, optionally with fewer layers.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ms::cli {

std::vector<std::string> known_shapes();
// config.json for `shape`; `layers` > 0 overrides num_hidden_layers; `fp8` adds DeepSeek's
// 128x128 block quantization_config. Throws for an unknown shape.
nlohmann::json shape_config(const std::string& shape, int layers, bool fp8);
// Applies "KEY=VALUE" to a config: VALUE parsed as JSON (a bare word is taken as a string).
// KEY must already exist, so a typo cannot silently write an unused field.
void apply_override(nlohmann::json& config, const std::string& key_value);

}  // namespace ms::cli
