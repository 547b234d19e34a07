// `moeserve make-random-model`: a random-weight checkpoint with a published model's exact
// tensor names, shapes and dtypes (sharded safetensors + index + config.json), for
// benchmarks and tests. The text such a model produces is noise.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "commands.h"
#include "core/check.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "io/model_config.h"
#include "model_shapes.h"
#include "random_checkpoint.h"

namespace ms::cli {
namespace {
using nlohmann::json;

struct Spec {
  std::string name;
  Shape shape;
  DType dtype;
  enum Fill { Random, Ones, Zeros, Scale } fill = Random;
};

struct SpecList {
  std::vector<Spec> specs;
  bool fp8 = false;
  void plain(const std::string& n, Shape s, Spec::Fill f = Spec::Random) { specs.push_back({n, s, DType::BF16, f}); }
  // A linear weight; FP8 checkpoints store it as F8_E4M3 with a 128x128 block scale.
  void linear(const std::string& p, int64_t out, int64_t in, bool quantizable = true) {
    if (!(fp8 && quantizable)) return plain(p + ".weight", {out, in});
    specs.push_back({p + ".weight", {out, in}, DType::F8_E4M3});
    specs.push_back({p + ".weight_scale_inv", {(out + 127) / 128, (in + 127) / 128}, DType::F32, Spec::Scale});
  }
  void mlp(const std::string& p, int64_t hidden, int64_t inter) {
    linear(p + "gate_proj", inter, hidden), linear(p + "up_proj", inter, hidden), linear(p + "down_proj", hidden, inter);
  }
};

void add_qwen_layer(SpecList& l, const ModelConfig& c, int i) {
  const std::string p = "model.layers." + std::to_string(i) + ".";
  const int64_t H = c.hidden_size, D = c.head_dim;
  l.plain(p + "input_layernorm.weight", {H}, Spec::Ones), l.plain(p + "post_attention_layernorm.weight", {H}, Spec::Ones);
  l.linear(p + "self_attn.q_proj", c.num_attention_heads * D, H);
  l.linear(p + "self_attn.k_proj", c.num_key_value_heads * D, H);
  l.linear(p + "self_attn.v_proj", c.num_key_value_heads * D, H);
  l.linear(p + "self_attn.o_proj", H, c.num_attention_heads * D);
  if (c.model_type == "qwen3_moe")
    l.plain(p + "self_attn.q_norm.weight", {D}, Spec::Ones), l.plain(p + "self_attn.k_norm.weight", {D}, Spec::Ones);
  else
    for (const char* n : {"q_proj", "k_proj", "v_proj"}) {
      int64_t rows = std::string(n) == "q_proj" ? c.num_attention_heads * D : c.num_key_value_heads * D;
      l.plain(p + "self_attn." + n + ".bias", {rows}, Spec::Zeros);
    }
  if (!c.is_moe_layer(i)) return l.mlp(p + "mlp.", H, c.intermediate_size);
  l.plain(p + "mlp.gate.weight", {c.n_routed_experts, H});
  for (int e = 0; e < c.n_routed_experts; ++e) l.mlp(p + "mlp.experts." + std::to_string(e) + ".", H, c.moe_intermediate_size);
  if (c.shared_expert_intermediate_size > 0) {
    l.mlp(p + "mlp.shared_expert.", H, c.shared_expert_intermediate_size);
    l.plain(p + "mlp.shared_expert_gate.weight", {1, H});
  }
}

void add_deepseek_layer(SpecList& l, const ModelConfig& c, int i) {
  const std::string p = "model.layers." + std::to_string(i) + ".", a = p + "self_attn.";
  const int64_t H = c.hidden_size, heads = c.num_attention_heads, qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  l.plain(p + "input_layernorm.weight", {H}, Spec::Ones), l.plain(p + "post_attention_layernorm.weight", {H}, Spec::Ones);
  if (c.q_lora_rank > 0) {
    l.linear(a + "q_a_proj", c.q_lora_rank, H);
    l.plain(a + "q_a_layernorm.weight", {c.q_lora_rank}, Spec::Ones);
    l.linear(a + "q_b_proj", heads * qk, c.q_lora_rank);
  } else {
    l.linear(a + "q_proj", heads * qk, H);
  }
  l.linear(a + "kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, H);
  l.plain(a + "kv_a_layernorm.weight", {c.kv_lora_rank}, Spec::Ones);
  l.linear(a + "kv_b_proj", heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
  l.linear(a + "o_proj", H, heads * c.v_head_dim);
  if (!c.is_moe_layer(i)) return l.mlp(p + "mlp.", H, c.intermediate_size);
  l.linear(p + "mlp.gate", c.n_routed_experts, H, false);
  if (c.topk_method == "noaux_tc")
    l.specs.push_back({p + "mlp.gate.e_score_correction_bias", {c.n_routed_experts}, DType::F32, Spec::Zeros});
  for (int e = 0; e < c.n_routed_experts; ++e) l.mlp(p + "mlp.experts." + std::to_string(e) + ".", H, c.moe_intermediate_size);
  if (c.n_shared_experts > 0) l.mlp(p + "mlp.shared_experts.", H, int64_t(c.moe_intermediate_size) * c.n_shared_experts);
}

std::vector<Spec> all_specs(const ModelConfig& c) {
  SpecList l;
  l.fp8 = c.fp8.enabled;
  l.plain("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  for (int i = 0; i < c.num_hidden_layers; ++i) c.is_deepseek() ? add_deepseek_layer(l, c, i) : add_qwen_layer(l, c, i);
  if (c.is_deepseek() && c.num_nextn_predict_layers > 0) {
    const int i = c.num_hidden_layers;
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add_deepseek_layer(l, c, i);
    l.plain(p + "embed_tokens.weight", {c.vocab_size, c.hidden_size});
    l.plain(p + "enorm.weight", {c.hidden_size}, Spec::Ones), l.plain(p + "hnorm.weight", {c.hidden_size}, Spec::Ones);
    l.linear(p + "eh_proj", c.hidden_size, 2 * c.hidden_size);
    l.plain(p + "shared_head.norm.weight", {c.hidden_size}, Spec::Ones);
    l.linear(p + "shared_head.head", c.vocab_size, c.hidden_size, false);
  }
  l.plain("model.norm.weight", {c.hidden_size}, Spec::Ones);
  l.linear("lm_head", c.vocab_size, c.hidden_size, false);
  return l.specs;
}

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Fills `count` elements of `spec` starting at element `first`, deterministically from `seed`.
void fill(const Spec& s, uint64_t seed, int64_t first, int64_t count, char* out) {
  for (int64_t i = 0; i < count; ++i) {
    uint64_t r = splitmix(seed ^ uint64_t(first + i) * 0x2545f4914f6cdd1dull);
    float u = float(r >> 40) / float(1 << 24) * 2.0f - 1.0f;  // uniform in [-1, 1)
    switch (s.dtype) {
      case DType::BF16: {
        float v = s.fill == Spec::Ones ? 1.0f : s.fill == Spec::Zeros ? 0.0f : u * 0.0346f;  // std 0.02
        reinterpret_cast<uint16_t*>(out)[i] = f32_to_bf16(v);
        break;
      }
      case DType::F32:
        reinterpret_cast<float*>(out)[i] = s.fill == Spec::Scale ? 0.02f / 96.0f : s.fill == Spec::Zeros ? 0.f : u;
        break;
      case DType::F8_E4M3: reinterpret_cast<uint8_t*>(out)[i] = f32_to_fp8_e4m3(u * 170.0f); break;
      default: MS_ASSERT(false);
    }
  }
}

void write_shard(const std::string& path, const std::vector<const Spec*>& specs, uint64_t seed) {
  json header = json::object();
  size_t offset = 0;
  for (const Spec* s : specs) {
    int64_t n = 1;
    for (auto d : s->shape) n *= d;
    size_t bytes = size_t(n) * dtype_size(s->dtype);
    header[s->name] = {{"dtype", std::string(dtype_name(s->dtype))}, {"shape", s->shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while (h.size() % 8) h.push_back(' ');
  std::ofstream out(path, std::ios::binary);
  MS_CHECK(out, "cannot write ", path);
  uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), std::streamsize(h.size()));
  std::vector<char> buf;
  for (const Spec* s : specs) {
    int64_t n = 1;
    for (auto d : s->shape) n *= d;
    const size_t es = dtype_size(s->dtype);
    const uint64_t tseed = splitmix(seed ^ std::hash<std::string>{}(s->name));
    constexpr int64_t kChunk = 1 << 22;
    for (int64_t first = 0; first < n; first += kChunk) {
      int64_t count = std::min(kChunk, n - first);
      buf.resize(size_t(count) * es);
      ThreadPool::global().parallel_for(count, 1 << 16, [&](int64_t b, int64_t e) {
        fill(*s, tseed, first + b, e - b, buf.data() + size_t(b) * es);
      });
      out.write(buf.data(), std::streamsize(buf.size()));
    }
  }
  MS_CHECK(out.good(), "failed writing ", path);
}

}  // namespace

void write_random_checkpoint(const json& cfg, uint64_t seed, const std::string& dir, const std::string& label) {
  namespace fs = std::filesystem;
  ModelConfig c = parse_model_config(cfg.dump(), label);
  auto specs = all_specs(c);
  fs::create_directories(dir);
  std::ofstream(fs::path(dir) / "config.json") << cfg.dump(2);
  // Shards of about 4 GB, as published checkpoints have.
  std::vector<std::vector<const Spec*>> shards(1);
  size_t shard_bytes = 0, total = 0;
  for (const Spec& s : specs) {
    int64_t n = 1;
    for (auto d : s.shape) n *= d;
    size_t bytes = size_t(n) * dtype_size(s.dtype);
    if (shard_bytes + bytes > (size_t(4) << 30) && !shards.back().empty()) shards.emplace_back(), shard_bytes = 0;
    shards.back().push_back(&s);
    shard_bytes += bytes, total += bytes;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", json::object()}};
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    for (const Spec* s : shards[i]) index["weight_map"][s->name] = name;
    std::cerr << "writing " << name << " (" << shards[i].size() << " tensors)\n";
    write_shard((fs::path(dir) / name).string(), shards[i], seed + i);
  }
  std::ofstream(fs::path(dir) / "model.safetensors.index.json") << index.dump(2);
  std::cerr << "wrote " << label << " (" << c.num_hidden_layers << " layers, " << double(total) / 1e9 << " GB) to "
            << dir << "\n";
}

void add_make_random_model(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-random-model", "write a random-weight checkpoint of a published model's shapes");
  struct Args {
    std::string shape, dir;
    int layers = 0;
    bool fp8 = false;
    uint64_t seed = 0;
    std::vector<std::string> overrides;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--shape", a->shape, "model shape")->required()->check(CLI::IsMember(known_shapes()));
  cmd->add_option("--layers", a->layers, "num_hidden_layers (keeps at most one dense first layer)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--fp8", a->fp8, "DeepSeek FP8 128x128 block weights");
  cmd->add_option("--seed", a->seed, "random seed");
  cmd->add_option("--set", a->overrides,
                  "KEY=VALUE: replace a config.json field, VALUE as JSON (e.g. n_routed_experts=32, the expert shard "
                  "one GPU of EP8 holds; num_nextn_predict_layers=0 drops the MTP layer)");
  cmd->add_option("dir", a->dir, "output directory")->required();
  cmd->callback([a] {
    nlohmann::json cfg = shape_config(a->shape, a->layers, a->fp8);
    for (const std::string& kv : a->overrides) apply_override(cfg, kv);
    write_random_checkpoint(cfg, a->seed, a->dir, a->shape);
  });
}

}  // namespace ms::cli
