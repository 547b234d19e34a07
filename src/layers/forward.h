// What one forward step computes and the state it runs against. The runtime builds a
// ForwardBatch (flat arrays, as SGLang and nano-vllm keep them); layers read it through the
// ForwardContext that is passed explicitly into every forward.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "parallel/groups.h"

namespace ms {

struct ForwardBatch {
  std::vector<int32_t> input_ids;      // [T] tokens of this step, sequence after sequence
  std::vector<int32_t> positions;      // [T]
  std::vector<int32_t> out_cache_loc;  // [T] KV slot each token's keys/values are written to
  ops::AttentionLayout attn;           // per sequence: its queries and the slots of all its keys
  bool all_logits = false;             // logits for every token, else the last of each sequence
  // Overlap scheduling: I32 ids on the model's device that the previous step sampled and the host
  // has not read yet; input id -(j + 1) is earlier_ids[j]. Undefined: every id is a token.
  Tensor earlier_ids;
  int num_tokens() const { return int(input_ids.size()); }
  int num_seqs() const { return attn.num_seqs(); }
};

// KV storage: for every layer, one or more buffers of [num_slots, per-token shape...]
// (GQA: keys and values; MLA: the latent plus the roped key), in the activation dtype.
class KvCache {
 public:
  KvCache(int num_layers, const std::vector<Shape>& per_token, int64_t num_slots, DType dtype = DType::F32,
          Device device = Device::CPU);
  Tensor& buffer(int layer, int i) { return buffers_.at(size_t(layer)).at(size_t(i)); }
  int64_t num_slots() const { return num_slots_; }
  int num_layers() const { return int(buffers_.size()); }
  size_t bytes_per_slot() const { return bytes_per_slot_; }

 private:
  std::vector<std::vector<Tensor>> buffers_;
  int64_t num_slots_;
  size_t bytes_per_slot_ = 0;
};

struct ForwardContext {
  const ForwardBatch& batch;
  KvCache& kv;
  bool bf16_activations = false;  // round activations to bf16 as bf16 storage would

  // When set, every MoE layer appends the expert ids it chose ([T, k] I32), layer by layer
  // (expert-load statistics, and tests that tell routing flips from arithmetic error).
  std::vector<Tensor>* routing_trace = nullptr;
  Device device = Device::CPU;
  DType act_dtype = DType::F32;  // activations: F32 on the CPU, BF16 on the GPU
  const ParallelGroups* parallel = nullptr;  // this rank's groups; null when running alone

  // A new activation tensor on this step's device, for an op that writes every element: on a
  // GPU its contents start undefined (a fill would be a node of its own in the step's graph).
  Tensor empty(Shape shape, DType dtype) const { return Tensor::uninit(dtype, std::move(shape), device); }
  Tensor empty(Shape shape) const { return empty(std::move(shape), act_dtype); }
  // A zero-filled one, for ops that add into their output.
  Tensor zeros(Shape shape) const { return Tensor::empty(act_dtype, std::move(shape), device); }

  void round(Tensor& t) const {
    if (bf16_activations) ops::round_to_bf16(t);
  }
};

}  // namespace ms
