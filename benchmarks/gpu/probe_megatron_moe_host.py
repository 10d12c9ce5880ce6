#!/usr/bin/env python
"""Is Megatron-Core's MoE layer host-bound at a rank's shape? One GPU, one process: a real
Megatron-Core ``TransformerLayer`` with a MoE MLP (the local, Transformer-Engine-free spec: torch
RMSNorm, Megatron's own linear layers and softmax attention, ``SequentialMLP`` experts, the
``alltoall`` or ``allgather`` token dispatcher at EP 1), timed forward + backward per layer:

    python3 benchmarks/gpu/probe_megatron_moe_host.py --mcore DIR --out "$OUT"
    python3 benchmarks/gpu/probe_megatron_moe_host.py --mcore DIR --out DIR --device cpu   # tiny, tests the script

``DIR`` holds ``megatron/core`` (e.g. ``git archive 1e05700595 megatron/core | tar -x -C DIR``
from NVIDIA/Megatron-LM: the commit the Model Zoo's Qwen3-235B rows ran). Per case (a rank's share
of a published layout: attention heads / TP, local experts, tokens per expert):

- ``wall_ms``: forward + backward of the layer, synchronised before and after (median of reps);
- ``gpu_ms``, ``kernels``: torch.profiler's device time summed over the kernels of one forward +
  backward and their count;
- ``host_ms``: the same layer, same op sequence, at ``--tiny-tokens`` tokens a sequence, where
  every kernel is short and the wall time is the host's issuing (and its one synchronisation);
- ``fwd_wall_ms``, ``fwd_host_ms``: the forward alone, at the two sizes;
- ``syncs``: the host's synchronising CUDA calls in one forward + backward (torch.profiler);
- ``tiny_fwd_host_parts_ms``: at the tiny size, the host time the forward spends in each module
  (norms, attention, router, experts; the dispatch and combine as the MoE block less those two);
- ``idle_ms`` = wall - gpu: the time the GPU waited (for the host, or for the synchronisation).

A layer whose host_ms approaches its gpu_ms is host-bound once a synchronisation has drained the
GPU's queue (the dispatcher synchronises once a layer forward to learn its split sizes). Nothing
here feeds a profile by itself; reports/ says what each number was used for.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from probe_log import emit, write_results  # noqa: E402 (this folder: the probes' record)
# name, hidden, heads on the rank, query groups on the rank, local experts, top-k, expert width,
# sequence, micro-batch, dispatcher; top-k chosen so that tokens per local expert match the
# published layout's (tokens x top-k / experts of the model / EP ... as a rank sees them)
CASES = [
    # Qwen3-235B-A22B, TP 4 / EP 8 (Model Zoo a5): 64/4 heads, 4/4 groups, 128/8 experts, 512 tokens each
    ("qwen3-235b-tp4-ep8-4k", 4096, 16, 1, 16, 2, 1536, 4096, 1, "alltoall"),
    # the same layout at 16K (the long-context rows): 2,048 tokens per local expert
    ("qwen3-235b-tp4-ep8-16k", 4096, 16, 1, 16, 2, 1536, 16384, 1, "alltoall"),
    # Qwen3-235B-A22B, TP 2 / EP 32 (Model Zoo a1): 32 heads, 2 groups, 4 local experts of 4,096 tokens
    ("qwen3-235b-tp2-ep32-4k", 4096, 32, 2, 4, 4, 1536, 4096, 1, "alltoall"),
    # Mixtral-8x7B, TP 8 = ETP 8, EP 1 (FlagPerf): 4 heads, 1 group, 8 experts 14336/8 wide, mbs 3
    ("mixtral-8x7b-tp8-etp8-mbs3", 4096, 4, 1, 8, 2, 1792, 4096, 3, "allgather"),
    # a dense reference: a5's attention with a dense SwiGLU MLP of a TP-4 share's width (no routing)
    ("dense-tp4-attention-mlp3072", 4096, 16, 1, 0, 0, 3072, 4096, 1, "-"),
]
# the script's own test on the CPU (the alltoall dispatcher needs a CUDA stream)
CPU_CASES = [("tiny-cpu", 64, 4, 1, 4, 2, 32, 64, 1, "allgather"), ("tiny-cpu-dense", 64, 4, 1, 0, 0, 96, 64, 1, "-")]


def build(case, dev, mcore_ps, TransformerConfig, TransformerLayer, spec, RotaryEmbedding):
    name, h, heads, groups, experts, topk, width, seq, mbs, disp = case
    moe = dict(num_moe_experts=experts, moe_router_topk=topk, moe_ffn_hidden_size=width,
               moe_token_dispatcher_type=disp, moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-3,
               moe_router_dtype="fp32", moe_grouped_gemm=False) if experts else {}
    cuda = dev.type == "cuda"
    cfg = TransformerConfig(
        num_layers=1, hidden_size=h, num_attention_heads=heads, num_query_groups=groups,
        kv_channels=128 if cuda else 16, ffn_hidden_size=4 * h if experts else width, **moe,
        normalization="RMSNorm", qk_layernorm=True, add_bias_linear=False, gated_linear_unit=True,
        activation_func=F.silu, bf16=cuda, params_dtype=torch.bfloat16 if cuda else torch.float32,
        hidden_dropout=0.0, attention_dropout=0.0, masked_softmax_fusion=False, bias_activation_fusion=False,
        bias_dropout_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, use_cpu_initialization=not cuda)
    layer = TransformerLayer(cfg, spec.submodules, layer_number=1).to(dev)
    rope = RotaryEmbedding(kv_channels=cfg.kv_channels, rotary_percent=1.0,
                           use_cpu_initialization=dev.type != "cuda")
    return cfg, layer, rope


def step(layer, embs, seq, mbs, h, dtype, dev):
    """One layer's forward + backward (the rotary table is the model's, made once a sequence
    length outside the layer, as GPTModel does; on the CPU none: Megatron builds it on CUDA)."""
    x = torch.randn(seq, mbs, h, device=dev, dtype=dtype, requires_grad=True)
    mask = None if dev.type == "cuda" else torch.ones(1, 1, seq, seq, dtype=torch.bool).triu(1)
    out, _ = layer(x, attention_mask=mask, rotary_pos_emb=embs.get(seq))
    out.float().sum().backward()


def forward_only(layer, embs, seq, mbs, h, dtype, dev):
    x = torch.randn(seq, mbs, h, device=dev, dtype=dtype, requires_grad=True)
    mask = None if dev.type == "cuda" else torch.ones(1, 1, seq, seq, dtype=torch.bool).triu(1)
    layer(x, attention_mask=mask, rotary_pos_emb=embs.get(seq))


def timed(fn, reps: int, dev) -> float:
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def profiled(fn, dev) -> tuple[float, int, int]:
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    if dev.type == "cuda":
        torch.cuda.synchronize()
    with profile(activities=acts) as prof:
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
    if dev.type != "cuda":
        return 0.0, 0, 0
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    syncs = sum(1 for e in prof.events() if e.device_type.name == "CPU" and e.name in SYNC_CALLS)
    return sum(e.device_time for e in kernels) / 1e3, len(kernels), syncs


def forward_parts(layer, run, reps: int) -> dict[str, float]:
    """Host time (ms) the forward spends issuing each part, at the tiny size: forward pre/post hooks
    on the layer's modules (the dispatcher is no module: the MoE block less its router and experts)."""
    parts = {"input_norm": layer.input_layernorm, "attention": layer.self_attention,
             "pre_mlp_norm": layer.pre_mlp_layernorm, "moe": layer.mlp}
    for sub in ("router", "experts"):
        if hasattr(layer.mlp, sub):
            parts[sub] = getattr(layer.mlp, sub)
    spent: dict[str, list[float]] = {k: [] for k in parts}
    start: dict[str, float] = {}
    handles = []
    for name, mod in parts.items():
        handles.append(mod.register_forward_pre_hook(lambda m, a, n=name: start.__setitem__(n, time.perf_counter())))
        handles.append(mod.register_forward_hook(
            lambda m, a, o, n=name: spent[n].append((time.perf_counter() - start[n]) * 1e3)))
    try:
        for _ in range(reps):
            run()
    finally:
        for h in handles:
            h.remove()
    out = {k: round(statistics.median(v), 3) for k, v in spent.items() if v}
    if {"moe", "router", "experts"} <= out.keys():
        out["dispatch_and_combine"] = round(out["moe"] - out["router"] - out["experts"], 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mcore", required=True, help="a folder holding megatron/core")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--tiny-tokens", type=int, default=256)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.mcore).resolve()))
    dev = torch.device(args.device)
    if dev.type == "cpu":  # the script's own test: Megatron-Core puts buffers on the current CUDA device
        torch.cuda.current_device = lambda: "cpu"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.distributed.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=0, world_size=1)
    from megatron.core import parallel_state
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import TransformerLayer
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, expert_model_parallel_size=1)
    if dev.type == "cuda":
        torch.cuda.set_device(0)
        model_parallel_cuda_manual_seed(1234)
    else:  # the script's own test: no CUDA RNG states to fork on the CPU (dropout is 0 anyway)
        import contextlib

        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
        get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    emit(case="env", torch=torch.__version__, device=torch.cuda.get_device_name(0) if dev.type == "cuda" else
         "cpu", cpus=os.cpu_count(), date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
         megatron=str(args.mcore))
    spec_cache: dict[int, object] = {}
    for case in (CASES if dev.type == "cuda" else CPU_CASES):
        name, h, heads, groups, experts, topk, width, seq, mbs, disp = case
        try:
            spec = spec_cache.setdefault(experts, get_gpt_layer_local_spec(
                num_experts=experts or None, moe_grouped_gemm=False, qk_layernorm=True, normalization="RMSNorm"))
            cfg, layer, rope = build(case, dev, parallel_state, TransformerConfig, TransformerLayer, spec,
                                     RotaryEmbedding)
            dtype = cfg.params_dtype
            tiny = max(args.tiny_tokens // mbs, 8) if dev.type == "cuda" else 16
            embs = {s: rope(s) for s in (seq, tiny)} if dev.type == "cuda" else {}
            gc.disable()
            for s in (seq, tiny):
                for _ in range(3):
                    step(layer, embs, s, mbs, h, dtype, dev)
            wall = timed(lambda: step(layer, embs, seq, mbs, h, dtype, dev), args.reps, dev)
            host = timed(lambda: step(layer, embs, tiny, mbs, h, dtype, dev), args.reps, dev)
            fwd_wall = timed(lambda: forward_only(layer, embs, seq, mbs, h, dtype, dev), args.reps, dev)
            fwd_host = timed(lambda: forward_only(layer, embs, tiny, mbs, h, dtype, dev), args.reps, dev)
            gpu, kernels, syncs = profiled(lambda: step(layer, embs, seq, mbs, h, dtype, dev), dev)
            _, tiny_kernels, _ = profiled(lambda: step(layer, embs, tiny, mbs, h, dtype, dev), dev)
            parts = forward_parts(layer, lambda: forward_only(layer, embs, tiny, mbs, h, dtype, dev), args.reps)
            gc.enable()
            emit(case="layer", name=name, hidden=h, heads=heads, query_groups=groups, local_experts=experts,
                 topk=topk, expert_width=width, seq=seq, micro_batch=mbs, dispatcher=disp,
                 tokens_per_expert=seq * mbs * topk // experts if experts else None, wall_ms=round(wall, 3),
                 gpu_ms=round(gpu, 3), kernels=kernels, syncs=syncs, tiny_fwd_host_parts_ms=parts,
                 host_ms=round(host, 3), tiny_tokens=tiny * mbs, tiny_kernels=tiny_kernels,
                 idle_ms=round(wall - gpu, 3), fwd_wall_ms=round(fwd_wall, 3), fwd_host_ms=round(fwd_host, 3))
            del layer
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        except Exception as exc:  # one case's failure is reported, the others still run
            gc.enable()
            emit(case="layer", name=name, error=f"{type(exc).__name__}: {exc}"[:400])
    write_results(args.out, "megatron_moe_host.json")
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
