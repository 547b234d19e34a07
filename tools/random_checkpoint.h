// Random-weight checkpoints: every tensor a config.json implies, with the family's exact names,
// shapes and dtypes, in sharded safetensors with an index (make-random-model, make-demo-model).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace ms::cli {

// Writes config.json, the shards and model.safetensors.index.json into `dir`; `label` names
// the model in messages. Weights are a deterministic function of `seed`.
void write_random_checkpoint(const nlohmann::json& config, uint64_t seed, const std::string& dir,
                             const std::string& label);

}  // namespace ms::cli
