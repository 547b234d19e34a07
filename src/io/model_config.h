// Hugging Face config.json for the supported MoE families, in the v4-style layout the
// published DeepSeek and Qwen checkpoints use. Fields a family does not have keep defaults.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace ms {

struct RopeScaling {
  std::string type;  // "" (none), "yarn"
  double factor = 1.0;
  int original_max_position_embeddings = 0;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 1.0, mscale_all_dim = 0.0;
};

struct Fp8Quant {
  bool enabled = false;
  int block_n = 128, block_k = 128;  // weight_block_size: [output rows, input columns]
};

struct ModelConfig {
  std::string architecture;  // e.g. "DeepseekV3ForCausalLM"
  std::string model_type;
  int vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0;
  int num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;
  int max_position_embeddings = 4096;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false, attention_bias = false;
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;

  // MLA (DeepSeek). q_lora_rank 0 means no q compression (V2-Lite).
  int q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;

  // MoE.
  int n_routed_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0;
  int n_shared_experts = 0, shared_expert_intermediate_size = 0;
  int n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
  std::string scoring_func = "softmax", topk_method = "greedy";
  bool norm_topk_prob = false;
  int first_k_dense_replace = 0, moe_layer_freq = 1, decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
  int num_nextn_predict_layers = 0;

  Fp8Quant fp8;

  bool is_deepseek() const { return model_type == "deepseek_v2" || model_type == "deepseek_v3"; }
  bool is_moe_layer(int layer) const;  // the family's rule for which layers are sparse
};

ModelConfig load_model_config(const std::string& model_dir);
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);

}  // namespace ms
