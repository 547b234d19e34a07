#!/usr/bin/env python3
"""Rooflines for bench-one-batch results: for each run, the prefill and decode-step floors from
the measured copy bandwidth and bf16 matrix rate (ms_cuda_ceilings) and the model's config.

  bench/roofline.py ceilings.json bench.jsonl config.json [config.json ...]

Decode step: bytes = the weights the step reads (bench-one-batch's figure: dense weights, the
lm head, and the experts a batch of B touches under uniform routing) + the KV cache it reads
(B sequences at the mean context of the decode steps); FLOPs = 2 x active parameters per token
x B + attention (QK and PV over the context). Prefill: bytes = every weight once; FLOPs = 2 x
active parameters per prompt token (the lm head on the last token only) + causal attention.
Time floor = max(bytes / bandwidth, FLOPs / matrix rate). Prints a Markdown table.
"""
import json
import sys


def model_terms(c):
    """(active params per token without lm head, lm head params, total params, attention FLOPs
    per query-key pair, KV bytes per token over all layers)."""
    H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    ds = c["model_type"].startswith("deepseek")
    if ds:
        nh, lora, rope = c["num_attention_heads"], c["kv_lora_rank"], c["qk_rope_head_dim"]
        nope, vd, ql = c["qk_nope_head_dim"], c["v_head_dim"], c.get("q_lora_rank") or 0
        q = (H * ql + ql * nh * (nope + rope)) if ql else H * nh * (nope + rope)
        attn = q + (lora + rope) * H + nh * (nope + vd) * lora + nh * vd * H
        pair = 2 * nh * (lora + rope) + 2 * nh * lora
        kv = (lora + rope) * 2
        E, k, I = c["n_routed_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
        shared = 3 * H * I * c.get("n_shared_experts", 0)
        dense_layers = c.get("first_k_dense_replace", 0)
    else:
        nh, kvh, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        attn = H * nh * D * 2 + 2 * H * kvh * D
        pair = 4 * nh * D
        kv = 2 * kvh * D * 2
        E, k, I = c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
        shared = 3 * H * c.get("shared_expert_intermediate_size", 0)
        dense_layers = len(c.get("mlp_only_layers", []))
    dense_mlp = 3 * H * c["intermediate_size"]
    moe_layers = L - dense_layers
    active = L * attn + dense_layers * dense_mlp + moe_layers * (E * H + k * 3 * H * I + shared)
    total = L * attn + dense_layers * dense_mlp + moe_layers * (E * H + E * 3 * H * I + shared) + 2 * V * H
    return active, V * H, total, pair * L, kv * L


def main():
    ceil = json.load(open(sys.argv[1]))
    bw, rate = ceil["copy_GBps"] * 1e9, ceil["bf16_gemm_TFLOPs"] * 1e12
    configs = {}  # NAME=config.json: runs whose model path contains NAME use that config
    for arg in sys.argv[3:]:
        name, path = arg.split("=", 1)
        configs[name] = json.load(open(path))
    print(f"Ceilings: copy {bw / 1e12:.2f} TB/s, bf16 GEMM {rate / 1e12:.0f} TFLOP/s ({ceil['gpu']})\n")
    print("| model | B | input | prefill tok/s | floor tok/s | % of floor | decode tok/s | step ms "
          "| floor ms (GB, GFLOP) | % of floor |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for line in open(sys.argv[2]):
        r = json.loads(line)
        c = next(c for name, c in configs.items() if name in r["model_path"])
        active, head, total, pair, kvb = model_terms(c)
        B, I, O = r["batch_size"], r["input_len"], r["output_len"]
        pf_flops = B * I * 2 * active + B * 2 * head + B * pair * I * I / 2
        pf_time = max(total * 2 / bw, pf_flops / rate)
        ctx = I + O / 2
        dec_bytes = r["decode_weight_bytes"] + B * ctx * kvb
        dec_flops = B * (2 * (active + head) + pair * ctx)
        dec_floor = max(dec_bytes / bw, dec_flops / rate)
        step = r["median_decode_latency"]
        print(f"| {c['model_type']} ({c['num_hidden_layers']} layers) | {B} | {I} | {r['prefill_throughput']:.0f} "
              f"| {B * I / pf_time:.0f} | {100 * pf_time / r['prefill_latency']:.1f} "
              f"| {r['median_decode_throughput']:.1f} | {step * 1e3:.2f} "
              f"| {dec_floor * 1e3:.3f} ({dec_bytes / 1e9:.2f}, {dec_flops / 1e9:.0f}) | {100 * dec_floor / step:.1f} |")


if __name__ == "__main__":
    main()
