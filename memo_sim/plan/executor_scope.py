"""What memo's executor builds of a plan, as the plan alone tells (the contract's side of memo-exec's refusals).

`memo-exec run` refuses a plan it cannot run as the simulator priced it with one line naming the field, before
anything is allocated (exit 2); the rules that need only the plan (no device, no torch) are here, so that the
what-if can say of its own answer that memo-exec refuses it, and why (`plan_why_not`). memo-exec asks the same
functions (`memo_exec.runner.run_model`); the rules that need a device or the built layer (an attention backend
that does not run here, full METP's architecture check, the static memory plan's placement) stay there.

The executor builds:

- the model in bf16 or fp32 (fp64 on a CPU), never fp16 (`dtype_why_not`);
- the layer's linear GEMMs in the model's dtype, ``fp8-tensorwise``, ``fp8-rowwise`` or ``fp8-blockwise``
  (`EXEC_GEMM_FORMATS`, `memo_exec.gemm_formats.GEMMS`), FP8 in the dense layer only, below ZeRO 3, at CUDA's
  16-multiple shapes (128-multiples for the block-scaled format);
- routed experts with expert parallelism ``ep`` over the ``alltoall``, ``allgather`` or ``deepep`` dispatcher
  (DeepEP's deduplicated sends, over torch's all-to-all) and expert tensor parallelism ``etp`` (each expert's FFN
  sliced over the ETP group, its copies all-gathered there), dropless routing (softmax or
  sigmoid scores, group-limited where the model has ``router_groups``, the weights scaled by ``router_scaling``;
  the sigmoid router's correction bias left at zero; Llama 4's ``sigmoid_topk`` weighting the experts' input, not
  under a capacity where the experts have biases), equal counts round-robin (``forced``), a uniform draw per
  token (``random``) or the router's choice dropped and padded to a capacity factor (``capacity:F``;
  `EXEC_BALANCES`);
- multi-head / grouped-query attention, with any head size (``head_dim``), QK norms, attention sinks and sliding
  windows (GPT-OSS's, placed by ``sliding_period``; on one rank's whole sequence: Megatron TP, data parallelism,
  pipelines, not ring CP, Ulysses or METP's rings, not SPPO's pieces; `memo_exec.attention_sinks`), and chunked
  attention (Llama 4's, placed by ``chunked_period``, under the same rule; the math kernel masks the earlier
  chunks); no latent attention;
- no rotary embedding (its layers encode no positions: a plan priced with its framework's ``rope`` runs, its
  ``report.md`` naming the kernels it priced and the executor did not run);
- uncompiled kernels (``kernel_fusion`` fused), its own ring (no ``ring_merge`` passes), a static memory plan for
  MEMO only; sequence parallelism as Megatron-LM runs it (the shard kept, gathered again in the backward) and as
  torch's ColwiseParallel does (``sp_input_kept``: the gathered input kept) in dense layers under store-all and full
  recompute (`sp_kept_why_not`);
- FSDP on one stage and beside pipeline stages as torchtitan runs it (a mixture of experts' routed experts sharded
  over their expert-data-parallel ranks, as torchtitan's ``efsdp``); ZeRO 2 / 3 and FSDP over several
  micro-batches too (each layer's gradient reduce-scattered after each micro-batch's backward and accumulated in
  the shard); a layout that splits the sequence, heads, K/V heads and FFN evenly over its ranks.
- multi-token-prediction modules on one stage or on a micro-batch pipeline's last stage (``MTP_SCHEDULES``: 1F1B,
  interleaved), their projection split by Megatron TP.
"""

from __future__ import annotations

from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig

# `memo_exec.gemm_formats.GEMMS` (a test holds them equal)
EXEC_GEMM_FORMATS = ("bf16", "fp8-tensorwise", "fp8-rowwise", "fp8-blockwise")
CUDA_MULTIPLE = 16  # torch._scaled_mm on CUDA: the reduction dimension and the second operand's a multiple of this
# a block-scaled format's dimensions: whole 128-element tiles along every reduction (memo-exec's casts and the
# cuBLASLt block-scale modes torch calls; TransformerEngine's block scaling pads what it must, memo-exec does not)
FORMAT_MULTIPLE = {"fp8-blockwise": 128}
EXEC_DISPATCHERS = ("alltoall", "allgather", "deepep")  # `memo_exec.moe.dispatchers` (a test holds them equal)
EXEC_ROUTERS = ("softmax", "sigmoid", "sigmoid_topk")  # `memo_exec.moe.routers` (a test holds them equal)
# the expert loads it routes (`memo_exec.moe.balance`: the router's own, equal counts round-robin, a uniform draw;
# `memo_exec.moe.capacity`: the router's dropped and padded to a capacity): every balance kind the simulator prices
EXEC_BALANCES = ("dropless", "measured", "forced", "random", "capacity")
# where the executor runs multi-token-prediction modules (`memo_exec.mtp`): after the head of one stage, or of a
# micro-batch pipeline's last stage (`memo_exec.pipeline.schedules`)
MTP_SCHEDULES = ("single_stage", "1f1b", "interleaved_1f1b")


def rank_token_rows(micro_batch: int, seq: int, layout: Layout) -> int:
    """The token rows a rank's linear GEMMs run over (TP-gathered: a micro-batch of the CP / Ulysses shard)."""
    return micro_batch * seq // (layout.cp * layout.ulysses)


def dtype_why_not(model: ModelConfig) -> str | None:
    """Why the executor cannot train the model's dtype, or None: fp16 training needs dynamic loss scaling, which the
    executor does not implement: `memo_exec.device.compute_dtype` refuses it on CUDA, where a run takes the plan's
    dtype, and a CPU run (fp32 unless --dtype) would train another precision than the plan's, silently; refused here
    on both, before anything runs (a review: the what-if gave fp16 plans without a word of it)."""
    if model.dtype == "fp16":
        return (f"plan model {model.name}: dtype fp16: the executor does not train fp16 (it needs loss scaling, which "
                f"memo-exec does not implement); plan with --dtype bf16 to run it")
    return None


def gemm_why_not(model: ModelConfig, layout: Layout, schedule: str, tokens: int | None = None) -> str | None:
    """Why the executor cannot run the plan's GEMM format as the simulator priced it (one line), or None: formats
    it has no GEMMs for, TransformerEngine's FP8 saved inputs (the executor keeps the high-precision ones, as
    torchao does), FP8 on the parts with GEMMs of their own (MoE experts, METP's rings, SPPO's pieces), under
    ZeRO 3 / FSDP (the executor keeps every layer's FP8 weight copies through a step, the simulator the gathered
    layers' only), and GEMM sizes CUDA's ``_scaled_mm`` refuses (``tokens``: the TP-gathered token rows a rank's
    weight gradients reduce over)."""
    fmt = model.gemm_format
    if fmt == EXEC_GEMM_FORMATS[0]:
        return None
    what = f"plan model {model.name}: gemm_format {fmt}"
    # the framework whose FP8 is the executor's (high-precision inputs saved, weight copies kept per step): memo's own
    # data (megatron and torchtitan@2024-12's torchao eab345c keep FP8 inputs, torchtitan now no weight copy)
    part = ("MoE experts" if model.moe else f"tp_mode {layout.tp_mode}" if layout.metp
            else "SPPO's pieces" if schedule == "sppo" else None)
    # where the parts run no FP8 GEMM in the executor at all, bf16 is the one fix (a review: a MoE model was sent to
    # fp8-tensorwise under any, which the next line refuses for its experts)
    # under --framework any the executor runs its own formats as memo prices them: the plan's, else tensorwise's
    ok = fmt if fmt in EXEC_GEMM_FORMATS else EXEC_GEMM_FORMATS[1]
    fix = ("plan with --precision bf16 to run it" if part else
           f"plan with --precision bf16, or {ok} under --framework any, to run it")
    if fmt not in EXEC_GEMM_FORMATS:
        return f"{what}: the executor runs {', '.join(EXEC_GEMM_FORMATS)} GEMMs only; {fix}"
    if model.fp8_saved_inputs:
        return (f"{what}: fp8_saved_inputs (TransformerEngine keeps the FP8 copies of the GEMM inputs): the executor "
                f"keeps the high-precision inputs as torchao's Float8Linear does; {fix}")
    if model.fp8_weights_per_use:
        return (f"{what}: fp8_weights_per_use (torchao casts the weights at every use and keeps no FP8 copy): the "
                f"executor keeps each layer's FP8 weight copies through a step; {fix}")
    if model.fp8_weights_saved:
        return (f"{what}: fp8_weights_saved (torchao eab345c saves each layer's FP8 weight for its backward): the "
                f"executor keeps each layer's FP8 weight copies through a step; {fix}")
    if part:
        return f"{what}: the executor runs FP8 GEMMs in the dense layer only, not in {part}; plan with --precision bf16"
    if layout.zero >= 3:
        return (f"{what}: ZeRO 3 / FSDP: the executor keeps every layer's FP8 weight copies through a step, where the "
                f"simulator prices the gathered layers' only; plan with --zero 2 or below")
    p = layout.tp
    sizes = {"hidden": model.hidden, "the queries' width / tp": model.q_dim // p,
             "the K/V width / tp": model.kv_dim // p, "ffn / tp": model.ffn // p, "a rank's token rows": tokens}
    multiple = FORMAT_MULTIPLE.get(fmt, CUDA_MULTIPLE)
    odd = [f"{k} {v}" for k, v in sizes.items() if v is not None and v % multiple]
    if odd:
        need = (": memo-exec casts whole 128-element scale tiles along every reduction" if multiple != CUDA_MULTIPLE
                else ", which CUDA's FP8 GEMMs (torch._scaled_mm) need")
        return f"{what}: {', '.join(odd)} not a multiple of {multiple}{need}; change the shape or the sequence"
    return None


def ffn_why_not(model: ModelConfig) -> str | None:
    """Why the executor cannot build the model's FFN activation, or None: GPT-OSS's clamped SwiGLU runs in the routed
    and shared experts (`memo_exec.moe.experts`), not in a dense FFN (GPT-OSS has none)."""
    if model.swiglu_limit and (not model.moe or model.dense_layers):
        where = "a dense model's FFN" if not model.moe else f"its {model.dense_layers} dense-FFN layers"
        return (f"plan model {model.name}: swiglu_limit = {model.swiglu_limit:g}: the executor runs GPT-OSS's clamped "
                f"SwiGLU in MoE experts only, not in {where}; plan a model without it (swiglu_limit 0) to run")
    return None


def mla_why_not(model: ModelConfig, layout: Layout | None, schedule: str = "") -> str | None:
    """Where the executor's latent attention does not run: its down projections on one TP rank's whole sequence (no
    TP, ring CP or Ulysses split: their kernels take one head width for q, k and v), in the model's dtype, without
    QKV biases, outside SPPO's pieces."""
    head = f"plan model {model.name}: kv_lora_rank = {model.kv_lora_rank} (latent attention)"
    if model.bias in ("all", "qkv"):
        return f"{head} with bias {model.bias!r}: the executor builds latent attention without QKV biases"
    if model.gemm.quantised:
        return f"{head}: the executor runs its projections in the model's dtype; plan with --precision bf16"
    if layout is None:
        return None
    split = [f"{f} {getattr(layout, f)}" for f in ("tp", "cp", "ulysses") if getattr(layout, f) > 1]
    if split:
        return (f"{head} with {', '.join(split)}: the executor runs latent attention on a rank that holds every head "
                f"of the whole sequence (data and expert parallelism, pipelines, ZeRO / FSDP); plan with tp, cp and "
                f"ulysses 1")
    if schedule == "sppo":
        return f"{head} under schedule sppo: SPPO's pieces run standard attention; plan another schedule"
    return None


def attention_why_not(model: ModelConfig, layout: Layout | None = None, schedule: str = "") -> str | None:
    """Why the executor cannot build the model's attention (latent attention; sinks, sliding windows and chunks
    where the sequence or the heads are split otherwise than by Megatron TP, or under SPPO; sliding or chunked
    layers the model does not place), or None."""
    m = model
    if m.kv_lora_rank:  # latent attention: memo-exec's layer (`memo_exec.layer.LayerCompute._mla_forward`), one rank
        why = mla_why_not(m, layout, schedule)
        if why:
            return why
    if m.sliding_layers and m.window_at(0) is None:
        return (f"plan model {m.name}: sliding_layers = {m.sliding_layers} of {m.layers} without sliding_period: the "
                f"executor must know which layers slide; give sliding_period (GPT-OSS: 2)")
    if m.chunked_layers and m.chunk_at(0) is None:
        return (f"plan model {m.name}: chunked_layers = {m.chunked_layers} of {m.layers} without chunked_period: the "
                f"executor must know which layers are chunked; give chunked_period (Llama 4: 4)")
    what = [n for n, on in (("attention_sinks", m.attention_sinks), ("sliding_window", m.sliding_layers),
                            ("attention_chunk", m.chunked_layers)) if on]
    if not what or layout is None:
        return None
    head = f"plan model {m.name}: {' and '.join(what)}"
    split = [f"{f} {getattr(layout, f)}" for f in ("cp", "ulysses") if getattr(layout, f) > 1]
    if split:
        # a review: "on a rank that holds the whole sequence of its heads" read as a refusal of what Ulysses gives
        return (f"{head} with {', '.join(split)}: the executor's ring and Ulysses attention run plain causal masks; it "
                f"applies sinks, windows and chunks where no rank splits the sequence (Megatron TP, data parallelism, "
                f"pipelines); plan without cp, ulysses (e.g. whatif --cp 1 --ulysses 1) to run it")
    if layout.tp > 1 and layout.tp_mode != "megatron":
        return f"{head} with tp_mode {layout.tp_mode}: the executor applies them under Megatron TP only"
    if schedule == "sppo":
        return f"{head} under schedule sppo: SPPO's pieces run plain causal attention; plan another schedule"
    return None


def moe_why_not(model: ModelConfig, layout: Layout) -> str | None:
    """Why the executor cannot run this model's attention, or its MoE layers under ``layout`` (None: it can)."""
    why = attention_why_not(model, layout)
    if why or not model.moe:
        return why
    lab = layout.label()
    if model.router not in EXEC_ROUTERS:
        return (f"plan model {model.name}: router = {model.router!r}: the executor runs the {', '.join(EXEC_ROUTERS)} "
                f"routers (the simulator prices it); plan a model with one of them to run")
    if layout.moe_dispatcher not in EXEC_DISPATCHERS:
        return (f"plan layout {lab}: moe_dispatcher = {layout.moe_dispatcher!r}: the executor runs "
                f"{' and '.join(EXEC_DISPATCHERS)} only; plan with moe_dispatcher alltoall")
    if model.moe_router.weights_input and model.moe_bias and layout.balance.kind == "capacity":
        return (f"plan layout {lab}: moe_balance = {layout.moe_balance!r} with router {model.router!r} and expert "
                f"biases: a padded copy (weight 0 on its input) would add its expert's biases; plan dropless")
    if layout.balance.kind not in EXEC_BALANCES:  # measured loads are a dropless router's
        return (f"plan layout {lab}: moe_balance = {layout.moe_balance!r}: the executor routes the balances "
                f"{', '.join(EXEC_BALANCES)} only; plan with moe_balance dropless")
    if layout.tp_mode != "megatron" and layout.tp > 1:
        return f"plan layout {lab}: tp_mode = {layout.tp_mode!r}: MoE layers run Megatron TP only; plan with tp_mode megatron"
    if layout.tp > 1 and not layout.sp:
        return (f"plan layout {lab}: sp = False: a MoE layer with tp > 1 routes each rank's sequence shard; "
                f"plan with sequence parallelism")
    if layout.ep_overlap:
        return (f"plan layout {lab}: ep_overlap: the executor runs each micro-batch's forward and backward steps apart, "
                f"not Megatron-Core's merged steps with the EP all-to-alls beside the other micro-batch's compute (the "
                f"simulator prices them, memo-sim export --to megatron writes them); plan without --ep-overlap to run")
    if model.experts % layout.ep:
        return f"plan layout {lab}: ep = {layout.ep} does not divide the {model.experts} experts"
    stage = layout.tp * layout.cp * layout.ulysses * layout.dp
    if stage % (layout.ep * layout.etp):
        return f"plan layout {lab}: ep x etp = {layout.ep * layout.etp} does not divide the {stage} GPUs of a stage"
    if model.shared_width % layout.tp:
        return f"plan layout {lab}: tp = {layout.tp} does not divide the shared-expert width {model.shared_width}"
    return None


def ring_merge_why_not(layout: Layout) -> str | None:
    """A ring priced as a framework runs it (PyTorch's CP's separate merge passes, TransformerEngine's per-step
    kernels: ``layout.ring_merge``), which the executor does not run."""
    if layout.ring_merge != "none" and layout.cp > 1:
        return (f"plan layout {layout.label()}: ring_merge {layout.ring_merge}: the executor runs its own ring "
                f"(one kernel per pair of zigzag chunks, no separate merge passes), so it would measure another plan "
                f"than the one predicted; plan with a framework whose ring it runs (e.g. --framework any)")
    return None


def split_why_not(layout: Layout, model: ModelConfig, batch: int, seq: int) -> str | None:
    """Why this layout cannot split this model and a micro-batch of ``batch`` sequences evenly over its ranks as
    the executor splits them (None when it can)."""
    from memo_sim.layout.kv_heads import kv_heads_why_not  # noqa: PLC0415

    if layout.cp > 1 and seq % (2 * layout.cp):
        return f"seq_tokens {seq} is not divisible by 2 x cp = {2 * layout.cp} (zig-zag ring CP)"
    shard = seq // layout.cp
    if shard % layout.ulysses:
        return f"the CP shard of {shard} tokens is not divisible by ulysses = {layout.ulysses}"
    if layout.tp > 1 and (batch * shard // layout.ulysses) % layout.tp:
        return (f"seq_tokens {seq}: {batch * shard // layout.ulysses} tokens per shard are not divisible by tp = "
                f"{layout.tp}; plan a seq_tokens that is a multiple of {layout.tp * layout.cp * layout.ulysses}")
    heads_split = layout.tp * layout.ulysses
    if model.heads % heads_split:
        return (f"{model.heads} heads are not divisible by tp x ulysses = {heads_split}; plan with a tp x ulysses "
                f"that divides {model.heads}")
    # K/V heads: whole on each rank, or (tp x ulysses a multiple of them) each repeated before Ulysses'
    # all-to-all (`memo_sim.layout.kv_heads`, `memo_exec.distributed.attention.UlyssesAttention`)
    why = kv_heads_why_not(layout.tp, layout.ulysses, model.n_kv_heads, layout.ulysses_kv)
    if why:
        return why
    if model.ffn % layout.tp:
        return f"ffn {model.ffn} is not divisible by tp = {layout.tp}; plan with a tp that divides {model.ffn}"
    return None


def sppo_why_not(layout: Layout) -> str | None:
    """Why the executor cannot run an SPPO plan's layout (naming the field), or None: its SPPO stages run one rank
    each (`memo_exec.sppo.plugin`), so no TP, ring CP or Ulysses inside a stage."""
    split = [f for f in ("tp", "cp", "ulysses") if getattr(layout, f) > 1]
    if split:
        return (f"plan layout {layout.label()}: {', '.join(f'{f} = {getattr(layout, f)}' for f in split)} under "
                f"schedule sppo: the executor's SPPO stages run one rank each (tp = cp = ulysses = 1); plan with "
                f"{' '.join(f'--{f} 1' for f in split)} (TP+SP inside an SPPO stage is not executed yet)")
    return None


def data_parallel_why_not(layout: Layout, model: ModelConfig) -> str | None:
    """Why the executor cannot run the layout's data parallelism (naming the field), or None: the simulator's rules
    (`memo_sim.layout.parallel.dp_why_not`: ZeRO 3, a shard group dividing the data group); the executor runs every
    flavour the simulator prices, FSDP beside pipeline stages too (their own rules: `executor_stage_limit`)."""
    from memo_sim.layout.parallel import dp_why_not  # noqa: PLC0415

    lab = layout.label()
    why = dp_why_not(layout, model)
    if why:
        return f"plan layout {lab}: dp_mode {layout.dp_mode}: {why}"
    return None


# the policies under which the executor keeps torch TP's gathered GEMM inputs in a layer's storage (``sp_input_kept``):
# those that write a whole layer's storage in one forward (or re-run) and read it in its backward
SP_KEPT_POLICIES = ("store_all", "full_recompute")


def sp_kept_why_not(model: ModelConfig, layout: Layout, policy: str) -> str | None:
    """Why the executor cannot keep the plan's gathered sequence-parallel GEMM inputs as torch's ColwiseParallel
    does (``layout.sp_input_kept``: `memo_exec.layer.storage_shapes` keeps ln1 and ln2 gathered, the backward
    gathers nothing again), or None: dense layers without multi-token-prediction modules, under `SP_KEPT_POLICIES`
    (a token-wise policy offloads or re-runs a rank's own rows; a MoE block reads the norm's shard)."""
    if not (layout.sp_input_kept and layout.sp and layout.tp > 1):
        return None
    what = (f"experts = {model.experts}" if model.moe else f"mtp_layers = {model.mtp_layers}" if model.mtp_layers
            else f"policy {policy}" if policy not in SP_KEPT_POLICIES else None)
    if what is None:
        return None
    return (f"plan layout {layout.label()}: sp_input_kept with {what}: the executor keeps torch TP's gathered GEMM "
            f"inputs in dense layers without multi-token-prediction modules under {' or '.join(SP_KEPT_POLICIES)} "
            f"only; plan with --framework any or megatron (the shard kept, gathered again) to run it")


def plan_why_not(model: ModelConfig, layout: Layout, policy, schedule: str, batch: int, micro_batch: int,
                 seq: int) -> str | None:
    """The first refusal of `memo-exec run` the plan alone decides (module docs), or None: a static memory plan
    for a policy without one of its own (``policy``: the plan's `memo_sim.policy` object), compiled kernels, the
    model's dtype (`dtype_why_not`), a ring with merge passes, multi-token-prediction modules beyond the
    executor's (`MTP_SCHEDULES`, Megatron TP), torch TP's kept gathered inputs (``sp_input_kept``), the GEMM
    format, the attention and the MoE layers (`gemm_why_not`, `moe_why_not`), a MoE model or a split stage under
    SPPO (`sppo_why_not`), the data parallelism (`data_parallel_why_not`) and the split over the ranks
    (`split_why_not`). Not here (the executor's own, from its built parts): full METP's architecture, a schedule's
    split of the layers, an attention backend the device lacks."""
    lab = layout.label()
    if layout.memory_plan and not policy.static_memory_plan:
        return (f"plan layout {lab}: memory_plan: a static memory plan for the {policy.name} policy is priced by the "
                f"simulator only; the executor places MEMO's plan alone; re-create the plan without --allocator plan "
                f"to run it on the caching allocator")
    if layout.kernel_fusion == "compiled":  # eager plans run, their kernels named (memo_exec.report)
        return (f"plan layout {lab}: kernel_fusion compiled: the executor runs its layer's kernels uncompiled (no "
                f"torch.compile), so it would measure another plan than the one predicted; plan with a framework "
                f"whose kernels are not compiled (e.g. --framework torchtitan)")
    if (why := sp_kept_why_not(model, layout, policy.name)) is not None:
        return why
    if model.mtp_layers:  # the executor's modules (memo_exec.mtp): single stage or a micro-batch pipeline, Megatron TP
        head = f"plan model {model.name}: mtp_layers = {model.mtp_layers}"
        if schedule not in MTP_SCHEDULES:
            return (f"{head} under schedule {schedule}: the executor runs multi-token-prediction modules in the "
                    f"{', '.join(MTP_SCHEDULES)} schedules only (a pipeline's on its last stage, as Megatron-LM); plan "
                    f"with --schedule 1f1b or interleaved_1f1b, or with --mtp-layers 0 to run it")
        if layout.tp > 1 and (layout.tp_mode != "megatron" or model.hidden % layout.tp):
            what = (f"tp_mode {layout.tp_mode}" if layout.tp_mode != "megatron"
                    else f"hidden {model.hidden} not divisible by tp = {layout.tp}")
            return (f"{head} with {what}: the executor splits a module's projection and runs its layer with Megatron "
                    f"TP only (hidden divisible by tp); plan with --tp-mode megatron, or with --mtp-layers 0")
    why = (dtype_why_not(model) or ring_merge_why_not(layout)
           or gemm_why_not(model, layout, schedule, rank_token_rows(micro_batch, seq, layout))
           or attention_why_not(model, layout, schedule) or moe_why_not(model, layout) or ffn_why_not(model))
    if why is None and model.moe and schedule == "sppo":
        why = (f"plan model {model.name}: experts = {model.experts}: SPPO's pieces run dense layers only; plan MoE "
               f"models with a micro-batch schedule")
    if why is None and schedule == "sppo":
        why = sppo_why_not(layout)
    if why is None:
        why = data_parallel_why_not(layout, model)
    if why is None and (split := split_why_not(layout, model, micro_batch, seq)):
        why = f"plan layout {lab}: {split}"
    return why


def memory_plan_missing(plan) -> str | None:
    """Where a plan's policy runs on a static memory plan (MEMO) and the plan carries none (an edited file), what
    memo-exec does instead, in the words `memo-sim check-plan` warns with and `memo-exec run` warns with after its
    run (a review: check-plan said "layer transients (static plan)" of such a plan without a word); else None."""
    mp = plan.memory_plan
    if not getattr(plan.policy, "static_memory_plan", False) or (mp is not None and mp.phases):
        return None
    return (f"memory_plan is missing: memo-exec runs the {plan.policy.label()} plan's scratch on the caching "
            f"allocator, not the static memory plan the simulator prices; re-create the plan with memo-sim whatif, "
            f"or pass memo-exec run --no-memory-plan")
