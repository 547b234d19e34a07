#include "io/model_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"

namespace ms {
using json = nlohmann::json;

namespace {

const char* const kArchitectures[][2] = {
    {"DeepseekV2ForCausalLM", "deepseek_v2"},
    {"DeepseekV3ForCausalLM", "deepseek_v3"},
    {"Qwen2MoeForCausalLM", "qwen2_moe"},
    {"Qwen3MoeForCausalLM", "qwen3_moe"},
};

// Reads typed fields and names the field and file in every error.
struct Reader {
  const json& j;
  const std::string& src;

  template <class T>
  T req(const char* key) const {
    MS_CHECK(j.contains(key) && !j[key].is_null(), src, ": missing required field \"", key, "\"");
    return as<T>(j[key], key);
  }
  template <class T>
  T opt(const char* key, T fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    return as<T>(j[key], key);
  }
  template <class T>
  T as(const json& v, const char* key) const {
    try {
      if constexpr (std::is_same_v<T, bool>) {
        MS_CHECK(v.is_boolean(), "");
      } else if constexpr (std::is_arithmetic_v<T>) {
        MS_CHECK(v.is_number(), "");
      } else if constexpr (std::is_same_v<T, std::string>) {
        MS_CHECK(v.is_string(), "");
      }
      return v.get<T>();
    } catch (const std::exception&) {
      fail(src, ": field \"", key, "\" has the wrong type (", v.dump(), ")");
    }
  }
};

void parse_rope_scaling(const json& j, const std::string& src, ModelConfig& c) {
  if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) return;
  const json& rs = j["rope_scaling"];
  MS_CHECK(rs.is_object(), src, ": rope_scaling must be an object");
  Reader r{rs, src};
  std::string type = r.opt<std::string>("rope_type", r.opt<std::string>("type", ""));
  MS_CHECK(type == "yarn" || type == "default" || type.empty(), src, ": rope_scaling type \"", type,
           "\" is not supported (supported: yarn)");
  if (type != "yarn") return;
  auto& y = c.rope_scaling;
  y.type = "yarn";
  y.factor = r.req<double>("factor");
  y.original_max_position_embeddings = r.opt<int>("original_max_position_embeddings", c.max_position_embeddings);
  y.beta_fast = r.opt<double>("beta_fast", 32.0);
  y.beta_slow = r.opt<double>("beta_slow", 1.0);
  y.mscale = r.opt<double>("mscale", 1.0);
  y.mscale_all_dim = r.opt<double>("mscale_all_dim", 0.0);
  MS_CHECK(y.factor >= 1.0, src, ": rope_scaling.factor must be >= 1");
}

void parse_quantization(const json& j, const std::string& src, ModelConfig& c) {
  if (!j.contains("quantization_config") || j["quantization_config"].is_null()) return;
  Reader r{j["quantization_config"], src};
  std::string method = r.opt<std::string>("quant_method", "");
  MS_CHECK(method == "fp8", src, ": quantization method \"", method, "\" is not supported (supported: fp8)");
  c.fp8.enabled = true;
  const json& q = j["quantization_config"];
  if (q.contains("weight_block_size") && !q["weight_block_size"].is_null()) {
    auto& b = q["weight_block_size"];
    MS_CHECK(b.is_array() && b.size() == 2, src, ": weight_block_size must be [n, k]");
    c.fp8.block_n = b[0].get<int>();
    c.fp8.block_k = b[1].get<int>();
  } else {
    fail(src, ": fp8 quantization without weight_block_size (per-tensor fp8) is not supported");
  }
  std::string act = r.opt<std::string>("activation_scheme", "dynamic");
  MS_CHECK(act == "dynamic", src, ": fp8 activation_scheme \"", act, "\" is not supported (supported: dynamic)");
}

}  // namespace

bool ModelConfig::is_moe_layer(int layer) const {
  if (n_routed_experts == 0) return false;
  if (is_deepseek()) return layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

ModelConfig parse_model_config(const std::string& text, const std::string& src) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(src, ": not valid JSON (", e.what(), ")");
  }
  MS_CHECK(j.is_object(), src, ": not a JSON object");
  Reader r{j, src};
  ModelConfig c;
  MS_CHECK(j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty(), src,
           ": missing \"architectures\"");
  c.architecture = j["architectures"][0].get<std::string>();
  for (auto& [arch, type] : kArchitectures)
    if (c.architecture == arch) c.model_type = type;
  if (c.model_type.empty()) {
    std::string known;
    for (auto& [arch, type] : kArchitectures) known += (known.empty() ? "" : ", ") + std::string(arch);
    fail(src, ": unknown architecture \"", c.architecture, "\" (supported: ", known, ")");
  }
  c.vocab_size = r.req<int>("vocab_size");
  c.hidden_size = r.req<int>("hidden_size");
  c.intermediate_size = r.req<int>("intermediate_size");
  c.num_hidden_layers = r.req<int>("num_hidden_layers");
  c.num_attention_heads = r.req<int>("num_attention_heads");
  c.num_key_value_heads = r.opt<int>("num_key_value_heads", c.num_attention_heads);
  c.rms_norm_eps = r.opt<double>("rms_norm_eps", 1e-6);
  c.rope_theta = r.opt<double>("rope_theta", 10000.0);
  c.max_position_embeddings = r.opt<int>("max_position_embeddings", 4096);
  c.tie_word_embeddings = r.opt<bool>("tie_word_embeddings", false);
  c.attention_bias = r.opt<bool>("attention_bias", false);
  c.bos_token_id = r.opt<int>("bos_token_id", -1);
  if (j.contains("eos_token_id") && j["eos_token_id"].is_array()) {
    for (auto& v : j["eos_token_id"]) c.eos_token_ids.push_back(v.get<int>());
  } else if (j.contains("eos_token_id") && j["eos_token_id"].is_number()) {
    c.eos_token_ids.push_back(j["eos_token_id"].get<int>());
  }
  MS_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_hidden_layers > 0 && c.num_attention_heads > 0, src,
           ": vocab_size, hidden_size, num_hidden_layers and num_attention_heads must be positive");
  MS_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, src, ": num_attention_heads (", c.num_attention_heads,
           ") is not a multiple of num_key_value_heads (", c.num_key_value_heads, ")");
  parse_rope_scaling(j, src, c);
  parse_quantization(j, src, c);

  c.num_experts_per_tok = r.opt<int>("num_experts_per_tok", 0);
  c.moe_intermediate_size = r.opt<int>("moe_intermediate_size", 0);
  c.norm_topk_prob = r.opt<bool>("norm_topk_prob", false);
  if (c.is_deepseek()) {
    c.q_lora_rank = r.opt<int>("q_lora_rank", 0);
    c.kv_lora_rank = r.req<int>("kv_lora_rank");
    c.qk_nope_head_dim = r.req<int>("qk_nope_head_dim");
    c.qk_rope_head_dim = r.req<int>("qk_rope_head_dim");
    c.v_head_dim = r.req<int>("v_head_dim");
    c.n_routed_experts = r.opt<int>("n_routed_experts", 0);
    c.n_shared_experts = r.opt<int>("n_shared_experts", 0);
    c.n_group = r.opt<int>("n_group", 1);
    c.topk_group = r.opt<int>("topk_group", 1);
    c.routed_scaling_factor = r.opt<double>("routed_scaling_factor", 1.0);
    c.scoring_func = r.opt<std::string>("scoring_func", "softmax");
    c.topk_method = r.opt<std::string>("topk_method", "greedy");
    c.first_k_dense_replace = r.opt<int>("first_k_dense_replace", 0);
    c.moe_layer_freq = r.opt<int>("moe_layer_freq", 1);
    c.num_nextn_predict_layers = r.opt<int>("num_nextn_predict_layers", 0);
    MS_CHECK(c.scoring_func == "softmax" || c.scoring_func == "sigmoid", src, ": scoring_func \"", c.scoring_func,
             "\" is not supported (softmax, sigmoid)");
    MS_CHECK(c.topk_method == "greedy" || c.topk_method == "group_limited_greedy" || c.topk_method == "noaux_tc",
             src, ": topk_method \"", c.topk_method, "\" is not supported (greedy, group_limited_greedy, noaux_tc)");
    MS_CHECK(c.n_group > 0 && c.n_routed_experts % c.n_group == 0 && c.topk_group <= c.n_group, src,
             ": n_routed_experts (", c.n_routed_experts, ") must split into n_group (", c.n_group,
             ") groups and topk_group (", c.topk_group, ") must not exceed n_group");
  } else {
    c.head_dim = r.opt<int>("head_dim", c.hidden_size / c.num_attention_heads);
    c.n_routed_experts = r.opt<int>("num_experts", 0);
    c.shared_expert_intermediate_size = r.opt<int>("shared_expert_intermediate_size", 0);
    c.decoder_sparse_step = r.opt<int>("decoder_sparse_step", 1);
    c.mlp_only_layers = r.opt<std::vector<int>>("mlp_only_layers", {});
    if (c.model_type == "qwen2_moe") c.attention_bias = true;  // Qwen2 always has qkv bias
    MS_CHECK(c.decoder_sparse_step > 0, src, ": decoder_sparse_step must be positive");
  }
  if (c.n_routed_experts > 0)
    MS_CHECK(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.n_routed_experts && c.moe_intermediate_size > 0,
             src, ": num_experts_per_tok must be in 1..", c.n_routed_experts, " and moe_intermediate_size positive");
  return c;
}

ModelConfig load_model_config(const std::string& model_dir) {
  std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  std::ifstream in(path);
  MS_CHECK(in, "cannot read ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), path);
}

}  // namespace ms
