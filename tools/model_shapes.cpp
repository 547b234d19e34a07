#include "model_shapes.h"

#include "core/check.h"

namespace ms::cli {
using nlohmann::json;

namespace {

json yarn(double factor, int original, double mscale) {
  return {{"type", "yarn"},          {"rope_type", "yarn"}, {"factor", factor},
          {"original_max_position_embeddings", original},    {"beta_fast", 32},
          {"beta_slow", 1},          {"mscale", mscale},    {"mscale_all_dim", mscale}};
}

json qwen3_30b_a3b() {
  return {{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}, {"vocab_size", 151936},
          {"hidden_size", 2048}, {"intermediate_size", 6144}, {"moe_intermediate_size", 768},
          {"num_hidden_layers", 48}, {"num_attention_heads", 32}, {"num_key_value_heads", 4}, {"head_dim", 128},
          {"num_experts", 128}, {"num_experts_per_tok", 8}, {"norm_topk_prob", true}, {"decoder_sparse_step", 1},
          {"mlp_only_layers", json::array()}, {"rms_norm_eps", 1e-6}, {"rope_theta", 1000000.0},
          {"max_position_embeddings", 40960}, {"tie_word_embeddings", false}, {"attention_bias", false},
          {"hidden_act", "silu"}, {"bos_token_id", 151643}, {"eos_token_id", 151645}, {"torch_dtype", "bfloat16"}};
}

// A small Qwen3-MoE for CPU benchmarks: hidden 1024, 64 experts.
json qwen3_moe_small() {
  json c = qwen3_30b_a3b();
  c["vocab_size"] = 32000, c["hidden_size"] = 1024, c["intermediate_size"] = 2816, c["moe_intermediate_size"] = 512;
  c["num_hidden_layers"] = 8, c["num_attention_heads"] = 16, c["num_key_value_heads"] = 4, c["head_dim"] = 64;
  c["num_experts"] = 64, c["num_experts_per_tok"] = 8, c["bos_token_id"] = 1, c["eos_token_id"] = 2;
  return c;
}

json deepseek_v2_lite() {
  return {{"architectures", {"DeepseekV2ForCausalLM"}}, {"model_type", "deepseek_v2"}, {"vocab_size", 102400},
          {"hidden_size", 2048}, {"intermediate_size", 10944}, {"moe_intermediate_size", 1408},
          {"num_hidden_layers", 27}, {"num_attention_heads", 16}, {"num_key_value_heads", 16},
          {"q_lora_rank", nullptr}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64},
          {"v_head_dim", 128}, {"n_routed_experts", 64}, {"n_shared_experts", 2}, {"num_experts_per_tok", 6},
          {"n_group", 1}, {"topk_group", 1}, {"routed_scaling_factor", 1.0}, {"scoring_func", "softmax"},
          {"topk_method", "greedy"}, {"norm_topk_prob", false}, {"first_k_dense_replace", 1}, {"moe_layer_freq", 1},
          {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0}, {"max_position_embeddings", 163840},
          {"rope_scaling", yarn(40, 4096, 0.707)}, {"tie_word_embeddings", false}, {"attention_bias", false},
          {"hidden_act", "silu"}, {"bos_token_id", 100000}, {"eos_token_id", 100001}, {"torch_dtype", "bfloat16"}};
}

json deepseek_v3() {
  return {{"architectures", {"DeepseekV3ForCausalLM"}}, {"model_type", "deepseek_v3"}, {"vocab_size", 129280},
          {"hidden_size", 7168}, {"intermediate_size", 18432}, {"moe_intermediate_size", 2048},
          {"num_hidden_layers", 61}, {"num_attention_heads", 128}, {"num_key_value_heads", 128},
          {"q_lora_rank", 1536}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64},
          {"v_head_dim", 128}, {"n_routed_experts", 256}, {"n_shared_experts", 1}, {"num_experts_per_tok", 8},
          {"n_group", 8}, {"topk_group", 4}, {"routed_scaling_factor", 2.5}, {"scoring_func", "sigmoid"},
          {"topk_method", "noaux_tc"}, {"norm_topk_prob", true}, {"first_k_dense_replace", 3}, {"moe_layer_freq", 1},
          {"num_nextn_predict_layers", 1}, {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0},
          {"max_position_embeddings", 163840}, {"rope_scaling", yarn(40, 4096, 1.0)}, {"tie_word_embeddings", false},
          {"attention_bias", false}, {"hidden_act", "silu"}, {"bos_token_id", 0}, {"eos_token_id", 1},
          {"torch_dtype", "bfloat16"}};
}

}  // namespace

std::vector<std::string> known_shapes() { return {"qwen3-30b-a3b", "qwen3-moe-small", "deepseek-v2-lite", "deepseek-v3"}; }

json shape_config(const std::string& shape, int layers, bool fp8) {
  json c = shape == "qwen3-30b-a3b"      ? qwen3_30b_a3b()
           : shape == "qwen3-moe-small"  ? qwen3_moe_small()
           : shape == "deepseek-v2-lite" ? deepseek_v2_lite()
           : shape == "deepseek-v3"      ? deepseek_v3()
                                         : json();
  MS_CHECK(!c.is_null(), "--shape: unknown shape \"", shape, "\"");
  if (layers > 0) {
    c["num_hidden_layers"] = layers;
    if (c.contains("first_k_dense_replace")) c["first_k_dense_replace"] = std::min(c["first_k_dense_replace"].get<int>(), layers - 1 > 0 ? 1 : 0);
  }
  if (fp8) {
    MS_CHECK(c["model_type"].get<std::string>().rfind("deepseek", 0) == 0, "--fp8: only DeepSeek shapes ship FP8 weights");
    c["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                                {"weight_block_size", {128, 128}}};
  }
  return c;
}

void apply_override(json& config, const std::string& key_value) {
  const size_t eq = key_value.find('=');
  MS_CHECK(eq != std::string::npos && eq > 0, "--set: expected KEY=VALUE, got \"", key_value, "\"");
  const std::string key = key_value.substr(0, eq), value = key_value.substr(eq + 1);
  MS_CHECK(config.contains(key), "--set: config.json has no field \"", key, "\"");
  json parsed = json::parse(value, nullptr, /*allow_exceptions=*/false);
  config[key] = parsed.is_discarded() ? json(value) : parsed;
}

}  // namespace ms::cli
