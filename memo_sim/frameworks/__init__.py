"""Training frameworks as data: each framework version is a named set of mechanisms in one YAML
file under ``memo_sim/frameworks/data/`` (with its sources), read and validated once here.

A file says which layouts the framework offers (tensor parallelism and its sequence-parallel
settings, ring context parallelism, Ulysses, ZeRO stages / the distributed optimizer, TP
flavours, the schedules it runs: single stage, 1F1B, interleaved 1F1B, SPPO), which activation
policies, and how it runs what the simulator models as a switch
(`MECHANISMS`):

- ``attention``: ``flash`` (FlashAttention-2), ``cudnn`` (cuDNN's fused attention, TransformerEngine's
  choice on Hopper and newer) or ``materialised`` (`memo_sim.cost.attention_kernel`);
- ``grad_overlap``: whether the data-parallel gradient reduction overlaps the backward
  (`memo_sim.cost.grad_sync`);
- ``cross_entropy``: the loss kernel, ``chunked``, ``vocab_parallel``, ``torch_fused`` or ``chunked_wrapper``
  (`memo_sim.cost.boundary.cross_entropy_bytes_per_logit`);
- ``host_pool``: where offloaded activations sit in pinned host memory, memo's registered pool
  or PyTorch's caching host allocator (`memo_sim.policy.host_layout`; matters only to
  offloading policies);
- ``expandable_segments``: whether PyTorch's caching allocator runs with expandable segments
  (`memo_sim.memplan.caching_allocator`; matters to the policies without a static memory plan);
- ``alloc_conf`` (optional): the rest of the ``PYTORCH_CUDA_ALLOC_CONF`` the framework's launch
  scripts set (`memo_sim.layout.alloc_conf`; default: PyTorch's);
- ``nccl_record_stream`` (optional, default false): the framework's PyTorch has ProcessGroupNCCL
  call ``recordStream`` on collective tensors (PyTorch before TORCH_NCCL_AVOID_RECORD_STREAMS's
  stashing became the default, without that variable set), so freed collective buffers wait for
  the next synchronisation before the caching allocator reuses them (`memo_sim.layout.parallel`);
- ``kernel_fusion`` (optional, default ``fused``): how the norms, activations and residual adds run,
  hand-fused kernels or a ``compiled`` block (torch.compile: adjacent memory-bound ops and FP8 amax
  reductions fused; `memo_sim.model.kernel_fusion`);
- ``rope`` (optional, default ``none``): the kernels the framework's layers turn the query and key heads with,
  ``fused`` (Megatron-LM's rope fusion), ``hf`` (transformers' eager formula) or ``complex`` (torchtitan's eager
  complex multiply), ``none`` where it runs no rotary op (memo's executor; Megatron-LM before 2023's learned
  positions); priced for models with rotary positions (`memo_sim.model.rope_kernels`);
- ``sp_regather_overlap`` (optional, default false): under sequence parallelism the backward all-gathers
  a column-parallel GEMM's input again for its weight gradient; true where the framework issues that
  all-gather asynchronously beside the data-gradient GEMM, and the input gradient's reduce-scatter (with TP alone its
  all-reduce) beside the weight-gradient GEMM (Megatron-LM's and TransformerEngine's linears;
  `memo_sim.layout.parallel`);
- ``sp_input_kept`` (optional, default false): true where the column-parallel GEMMs keep the all-gathered input for
  their weight gradients instead (torch's ColwiseParallel: no backward re-gather, the full-length tensor saved;
  `memo_sim.layout.parallel`);
- ``ring_merge`` (optional, default ``none``): the framework's ring-CP implementation: the passes over HBM
  it runs beside its attention kernels, how it exchanges K/V and the buffers it holds, ``torch_cp`` for
  PyTorch's experimental context parallelism's fp32 merges and accumulations and its one K/V all-gather
  (`memo_sim.layout.ring_merge`);
- ``ulysses_kv`` (optional, default ``minimal``): how the framework's Ulysses repeats a GQA model's K/V
  heads before its all-to-all, ``minimal`` (one head per rank where the ranks outnumber the heads),
  ``query_heads`` (every K/V head repeated to the query heads) or ``whole`` (never repeated:
  TransformerEngine's all-to-all CP; `memo_sim.layout.kv_heads`);
- ``ulysses_bwd_resend`` (optional, default false): the framework's Ulysses backward all-to-alls q, k, v, the
  attention output and its gradient to head-sharded again before the kernel's backward (memo's own plans;
  memo_exec/distributed/attention.py UlyssesAttention runs either as the plan says), where an autograd one keeps the
  head-sharded tensors from the forward and sends the gradients alone (DeepSpeed's _SeqAllToAll, Megatron's
  TransformerEngine a2a CP; `memo_sim.cost.layer_time`);
- ``head_grads_unit`` (optional, default false): under ZeRO 2 / 3 the framework holds the gradients of the
  embedding, an untied head and the final norm whole together until the step (memo's executor's first gradient
  unit, memo_exec/distributed/zero.py), where per-parameter buckets reduce-scatter the head's before the
  embedding's is made (`memo_sim.cost.memory.model_state_parts`);
- ``ring_dkv_fp32`` (optional, default false): the framework's ring CP accumulates the travelling dK/dV in fp32
  and sends them so (memo's executor, `memo_exec.device.acc_dtype`), where TransformerEngine's p2p CP sends them in
  the model's dtype (`memo_sim.cost.ring_attention.ring_shift_bytes`; PyTorch's CP says its own through
  ``ring_merge`` torch_cp);
- ``reduce_bucket`` (optional, default 0): the gradient elements one ZeRO 2 / 3 reduction takes whole at a time, 0
  for one layer's (memo's executor, FSDP2's per-layer units, memo's DeepSpeed export, which writes
  ``reduce_bucket_size`` so); a framework whose configuration states a bucket size says it (XTuner's
  deepspeed_zero3.json: 3e8; `memo_sim.cost.memory.unsharded_grad_units`);
- ``param_gather`` (optional, default ``overlap``): how ZeRO-1/2 all-gathers the updated weights, ``overlap`` (each
  layer's gather beside the next forward: Megatron-LM's --overlap-param-gather) or ``after_step`` (one blocking
  collective at the end of the optimizer step: DeepSpeed's ``DeepSpeedZeroOptimizer.step``;
  `memo_sim.layout.parallel`, `memo_sim.cost.grad_sync`);
- ``replicate_fsdp`` (optional, default false): ZeRO 0 over replicas runs as FSDP2 over a shard group of one,
  keeping FSDP's mixed-precision states (torchtitan, which always applies FSDP: `memo_sim.layout.parallel`);
- ``fsdp_copies`` (optional, default false): FSDP2's copies out of each unit's all-gather and into its
  reduce-scatter, on the compute stream (torchtitan; memo's executor gathers into its parameters' own buffer:
  `memo_sim.layout.parallel`, `memo_sim.cost.grad_sync`);
- ``optimizer_impl`` (optional, default ``fused``): the Adam step as one fused kernel or as torch.optim's
  ``foreach`` kernels (torchtitan at 9dec370; `memo_sim.cost.boundary.optimizer_step_bytes`).

A file's ``layouts.dp_modes`` lists its data-parallel flavours (`memo_sim.dp`: ``zero``, the ZeRO
stages; ``fsdp``, FSDP2 with HSDP and resharding after the forward or not; default ``[zero]``).
``layouts.ddp`` (default true) says whether it runs ZeRO 0 over more than one data-parallel rank (replicated
weights); false where the version has no such run memo prices (torchtitan@2024-12: its DDP ran without mixed
precision, on a one-dimensional mesh only).

A file's ``layouts.experts`` section says how the framework trains mixture-of-experts models:
whether it offers expert parallelism (``expert_parallel``) and expert tensor parallelism
(``expert_tensor_parallel``), its token dispatchers (`memo_sim.layout.moe_dispatchers`) and the
expert-load settings it can run (``balances``, `memo_sim.layout.moe_balance`: ``forced`` where it routes
every expert the same tokens, ``random`` where it routes by random logits, ``capacity`` where it drops and
pads to a capacity factor; default ``dropless`` and ``measured``, its own router's loads), the ZeRO stages its
MoE layers run beside (``zero``, default every stage it offers: DeepSpeed's native MoE refuses ZeRO stage 3) and the
sequence-parallel settings they run beside TP (``sequence_parallel``, default the dense layouts': Megatron-LM's
MoELayer raises in training with TP and without SP); a framework without the section is refused a MoE model (one
line).

A file's ``precision`` section says how the framework keeps model states and which GEMM formats it
offers: ``recipes`` maps a model dtype to the model-state recipe the framework runs it with
(`memo_sim.model.precision`; a dtype not named takes memo's default, and a recipe the user names
with ``--precision`` wins), ``gemm_formats`` lists the formats (`memo_sim.model.gemm_formats`) the
version can run (default: ``bf16`` only), and under a quantised format ``fp8_saved_inputs`` (the
GEMM inputs kept for backward as quantised copies), ``fp8_sp_gathers`` (sequence parallelism
all-gathers the column-parallel GEMM inputs' and the row-parallel GEMM output gradients' quantised copies, cast on
the sequence shard), ``fp8_weights_per_use`` (the linear weights cast at every
use, no quantised copy kept), ``fp8_weights_saved`` (each layer's quantised weight copy made by its forward and
saved by autograd for its backward) and ``fp8_abs_saved`` (a per-op selective checkpoint's save list keeps each cast's
abs pass output: torchtitan@2024-12). `Framework.for_model` applies them to a model.

A file's ``layouts.rank_orders`` lists the orders it numbers ranks in (`memo_sim.layout.rank_order`; default:
pipeline stages outermost, every framework's own; Megatron-LM adds data parallelism outermost with
``--use-tp-pp-dp-mapping``). A plan's order is its layout's; the what-if tries the first, or every one with
``--rank-order all``. ``layouts.mapping_equal_groups``: in an order other than its first, with pipeline stages, the
expert layers' groups must cover the dense layers' (Megatron-Core asserts equal data-parallel sizes and pipeline
groups: etp x ep = tp x cp, its Ulysses being CP; a dense model's ETP is TP, so cp 1).

``layouts.ring_cp_sliding_window`` (default true): false where the framework's ring CP refuses a sliding-window
model (Megatron-LM's TransformerEngine runs a window under a2a or all_gather CP only, its default p2p ring and
a2a+p2p refused): such a model's layouts with ring CP are not offered (`Framework.for_layouts_of`). A file's
``layouts.experts.moe_block`` (default ``any``): the MoE block the framework builds (`MOE_BLOCKS`; ``deepspeed_moe``,
DeepSpeed-MoE's gate and experts), a model of another is refused in one line (`Framework.for_model`).

``layouts.serial_grads`` (default true): false where no launch setting of the framework reduces the data-parallel
gradients after the backward (torchtitan: FSDP2 and DDP reduce in their backward hooks), so ``whatif
--no-grad-overlap`` is refused in one line there; the exporters write the setting where it is one
(`memo_sim.export.base.kept_launch`).

A file's ``layouts.uneven_stages`` lets the first and last pipeline stages have their own layer
counts, and ``layouts.embedding_loss_slots`` (default: as ``uneven_stages``) lets the embedding and
the loss each take a layer's slot in the split (Megatron-LM's --account-for-*-in-pipeline-split).

Only mechanisms the simulator prices can be switched; what the framework ran that memo does not
model yet is listed under ``not_modelled`` (shown with the framework, never silently dropped).
``--framework NAME`` (`memo_sim.search.frameworks`) searches the layouts a framework allows with
its mechanisms applied (`Framework.adapt`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from memo_sim.errors import MemoError, validated
from memo_sim.fileio import load_yaml, read_utf8
from memo_sim.dp import DP_MODES
from memo_sim.layout.alloc_conf import merged_alloc_conf
from memo_sim.layout.moe_balance import KINDS as BALANCE_KINDS
from memo_sim.layout.moe_dispatchers import DISPATCHER_NAMES
from memo_sim.layout.parallel import BLOCK_KERNELS, HOST_POOLS, OPTIMIZER_IMPLS, PARAM_GATHERS, Layout
from memo_sim.layout.rank_order import DEFAULT_RANK_ORDER, RANK_ORDER_NAMES
from memo_sim.layout.kv_heads import ULYSSES_KV_RULES
from memo_sim.layout.ring_merge import RING_MERGE_NAMES
from memo_sim.layout.schedule import SCHEDULE_NAMES
from memo_sim.model.config import DTYPES, ModelConfig, modules_words
from memo_sim.model.gemm_formats import GEMM_FORMATS
from memo_sim.model.kernel_fusion import KERNEL_FUSIONS
from memo_sim.model.rope_kernels import ROPE_KERNELS
from memo_sim.profile.attention_kernels import ATTENTION_KERNELS
from memo_sim.model.layer_graph import CROSS_ENTROPY_KERNELS
from memo_sim.model.precision import RECIPES
from memo_sim.tp import TP_MODES
from memo_sim.policy import policy_names

DATA = Path(__file__).parent / "data"
# the switchable mechanisms: name -> the Layout field it sets
MECHANISMS = {"attention": "attention", "block_attention": "block_attention", "grad_overlap": "grad_overlap",
              "cross_entropy": "cross_entropy",
              "host_pool": "host_pool", "expandable_segments": "expandable_segments", "alloc_conf": "alloc_conf",
              "nccl_record_stream": "nccl_record_stream", "kernel_fusion": "kernel_fusion", "rope": "rope",
              "sp_regather_overlap": "sp_regather_overlap", "sp_input_kept": "sp_input_kept",
              "ring_merge": "ring_merge",
              "ulysses_kv": "ulysses_kv", "ulysses_bwd_resend": "ulysses_bwd_resend",
              "ring_dkv_fp32": "ring_dkv_fp32", "head_grads_unit": "head_grads_unit", "param_gather": "param_gather",
              "replicate_fsdp": "replicate_fsdp", "reduce_bucket": "reduce_bucket", "fsdp_copies": "fsdp_copies",
              "optimizer_impl": "optimizer_impl"}


def deepspeed_moe_why_not(m: ModelConfig) -> list[str]:
    """What of the model's MoE block DeepSpeed-MoE (deepspeed/moe/sharded_moe.py's TopKGate at edaa7221: softmax over
    the experts, the top k, their weights renormalised; experts of Megatron-DeepSpeed's ParallelMLP, --ffn-hidden-size
    wide, on every --expert-interval-th layer) cannot build, in words; empty where it builds it as the model has it.
    The deepspeed file's ``experts.moe_block`` (`MOE_BLOCKS`): its what-if refuses such a model (`Framework.for_model`),
    as `memo_sim.export.deepspeed` cannot write it (moved here from there, which imports it: the framework data sits
    below the exports)."""
    out = []
    if m.router != "softmax" or m.router_groups or m.router_scaling != 1.0:
        out.append(f"{m.router} router" + (" with groups" if m.router_groups else "")
                   + (f" scaled by {m.router_scaling:g}" if m.router_scaling != 1.0 else "")
                   + " (its gate is a softmax top-k, renormalised)")
    elif not m.weights_normalised and m.top_k > 1:  # top2gating / topkgating divide by the chosen weights' sum
        out.append(f"top-{m.top_k} router weights left as the softmax over all the experts gives them (norm_topk_prob "
                   f"false; its gate renormalises them)")
    if m.shared_experts:
        out.append("shared experts (its --mlp-type residual is a dense MLP mixed in by a learned coefficient)")
    if m.moe_bias:
        out.append("biases on the experts and the gate")
    if m.mixes_dense_layers and not (m.dense_period == 2 and m.ffn == m.expert_width):
        out.append(f"dense layers {m.dense_where} of width {m.ffn} beside experts of width {m.expert_width} (its "
                   f"--expert-interval N puts experts of the dense FFN's width on every N-th layer)")
    return out


# the MoE blocks a framework builds (``layouts.experts.moe_block``): name -> what of a model it cannot build
MOE_BLOCKS = {"any": lambda m: [], "deepspeed_moe": deepspeed_moe_why_not}


class _ExpertsIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    expert_parallel: bool = Field(strict=True)
    expert_tensor_parallel: bool = Field(strict=True)
    dispatchers: tuple[Literal[DISPATCHER_NAMES], ...] = Field(min_length=1)
    # EP borrows its ranks from TP x CP x the FSDP shard group only (torchtitan), not from replicated DP ranks
    ep_within_shards: bool = Field(False, strict=True)
    # the expert-load settings it runs (`memo_sim.layout.moe_balance` kinds); its own router's loads always
    balances: tuple[Literal[BALANCE_KINDS], ...] = ("dropless", "measured")
    # the ZeRO stages its MoE layers run beside (None: every stage it offers)
    zero: tuple[Literal[0, 1, 2, 3], ...] | None = None
    # the SP settings its MoE layers run beside TP (None: the dense ones, ``layouts.sequence_parallel``)
    sequence_parallel: tuple[bool, ...] | None = Field(None, min_length=1)
    # the MoE block it builds (`MOE_BLOCKS`): a model it cannot build is refused (`Framework.for_model`)
    moe_block: Literal[tuple(MOE_BLOCKS)] = "any"
    # Megatron-Core's EP all-to-all overlap (--overlap-moe-expert-parallel-comm, `Layout.ep_overlap`)
    ep_overlap: bool = Field(False, strict=True)


class ExpertsOffer(NamedTuple):
    """How a framework trains mixture-of-experts models (the file's ``layouts.experts``)."""

    expert_parallel: bool
    expert_tensor_parallel: bool
    dispatchers: tuple[str, ...]
    ep_within_shards: bool  # EP within TP x CP x the FSDP shard group
    balances: tuple[str, ...]  # `memo_sim.layout.moe_balance` kinds
    zero: tuple[int, ...] | None = None  # the ZeRO stages its MoE layers run beside (None: all it offers)
    sequence_parallel: tuple[bool, ...] | None = None  # the SP settings beside TP (None: the dense layouts')
    moe_block: str = "any"  # the MoE block it builds (`MOE_BLOCKS`)
    ep_overlap: bool = False  # the EP all-to-alls beside the other micro-batch's compute (`Layout.ep_overlap`)

    @property
    def zero_words(self) -> str:
        return ", ".join(map(str, self.zero or ()))


class _LayoutsIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tensor_parallel: bool = Field(strict=True)
    sequence_parallel: tuple[bool, ...] = Field(min_length=1)  # sp settings offered with tp > 1
    context_parallel: bool = Field(strict=True)  # ring CP
    ulysses: bool = Field(strict=True)
    zero: tuple[Literal[0, 1, 2, 3], ...] = Field(min_length=1)
    tp_modes: tuple[Literal[TP_MODES], ...] = ("megatron",)
    schedules: tuple[Literal[SCHEDULE_NAMES], ...] = ("single_stage",)  # `memo_sim.layout.schedule`
    # the schedules it runs with at least as many micro-batches as pipeline stages (PyTorch's Schedule1F1B raises
    # below that: torchtitan; Megatron-LM runs fewer)
    microbatches_at_least_stages: tuple[Literal[SCHEDULE_NAMES], ...] = ()
    optimizer_offload: bool = Field(False, strict=True)  # the optimizer's states and step on the host
    # the ZeRO stages it keeps the optimizer on the host beside (None: every stage it offers)
    optimizer_offload_zero: tuple[Literal[0, 1, 2, 3], ...] | None = None
    uneven_stages: bool = Field(False, strict=True)  # first / last pipeline stages of their own layer counts
    # the embedding and the loss each taking a layer's slot in the split (Megatron-LM's
    # --account-for-embedding/loss-in-pipeline-split); default: where it has uneven stages
    embedding_loss_slots: bool | None = Field(None, strict=True)
    experts: _ExpertsIn | None = None  # mixture-of-experts training (None: not offered)
    dp_modes: tuple[Literal[DP_MODES], ...] = ("zero",)  # data-parallel flavours (`memo_sim.dp`)
    ddp: bool = Field(True, strict=True)  # ZeRO 0 over more than one data-parallel rank (module docs)
    # its FSDP mesh holds the context-parallel ranks (torchtitan's dp_shard x cp): with cp > 1 the weights are
    # sharded over a group of a multiple of cp ranks, never replicated (ZeRO 0) or sharded over fewer
    shards_over_cp: bool = Field(False, strict=True)
    # it trains a model's multi-token-prediction modules (`ModelConfig.mtp_layers`); else its runs are priced without
    multi_token_prediction: bool = Field(False, strict=True)
    # the orders it numbers ranks in (`memo_sim.layout.rank_order`)
    rank_orders: tuple[Literal[RANK_ORDER_NAMES], ...] = Field((DEFAULT_RANK_ORDER,), min_length=1)
    # in an order other than its first, with stages: the expert groups cover the dense ones (module docs)
    mapping_equal_groups: bool = Field(False, strict=True)
    # ring CP (the ring alone, or beside Ulysses) for a model with sliding-window layers (module docs)
    ring_cp_sliding_window: bool = Field(True, strict=True)
    # the data-parallel gradients reduced after the backward where a launch line leaves out the overlap (Megatron-LM's
    # --overlap-grad-reduce, DeepSpeed's overlap_comm); False where no setting defers them (torchtitan's FSDP2 and DDP
    # reduce each unit's or bucket's gradients in their backward hooks): `whatif --no-grad-overlap` is refused there
    serial_grads: bool = Field(True, strict=True)


class _MechanismsIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    attention: Literal[ATTENTION_KERNELS]
    block_attention: Literal[BLOCK_KERNELS] = ""  # the blocks' kernel where not attention's (`Layout.block_kernel`)
    grad_overlap: bool = Field(strict=True)
    cross_entropy: Literal[CROSS_ENTROPY_KERNELS]
    host_pool: Literal[HOST_POOLS]
    expandable_segments: bool = Field(strict=True)
    alloc_conf: str = Field("", strict=True)  # the rest of PYTORCH_CUDA_ALLOC_CONF (`memo_sim.layout.alloc_conf`)
    nccl_record_stream: bool = Field(False, strict=True)  # recordStream on collective tensors (`layout.parallel`)
    kernel_fusion: Literal[KERNEL_FUSIONS] = "fused"  # fused | compiled (`memo_sim.model.kernel_fusion`)
    rope: Literal[ROPE_KERNELS] = "none"  # the rotary embedding's kernels (`memo_sim.model.rope_kernels`)
    sp_regather_overlap: bool = Field(False, strict=True)  # SP's backward re-gather beside the dgrad GEMM
    sp_input_kept: bool = Field(False, strict=True)  # SP's gathered GEMM inputs saved, no backward re-gather
    ring_merge: Literal[RING_MERGE_NAMES] = "none"  # ring CP's passes beside its kernels (`layout.ring_merge`)
    ulysses_kv: Literal[ULYSSES_KV_RULES] = "minimal"  # K/V heads before Ulysses' all-to-all (`layout.kv_heads`)
    ulysses_bwd_resend: bool = Field(False, strict=True)  # Ulysses' backward re-sends q, k, v, out, dout
    ring_dkv_fp32: bool = Field(False, strict=True)  # ring CP's dK/dV travel in fp32
    head_grads_unit: bool = Field(False, strict=True)  # ZeRO 2 / 3: embedding, head, norm gradients whole together
    param_gather: Literal[PARAM_GATHERS] = "overlap"  # ZeRO-1/2's updated-weight all-gather (`layout.parallel`)
    replicate_fsdp: bool = Field(False, strict=True)  # ZeRO 0 as FSDP2 over a shard group of one
    fsdp_copies: bool = Field(False, strict=True)  # FSDP's copies out of its gathers and into its reductions
    optimizer_impl: Literal[OPTIMIZER_IMPLS] = "fused"  # the Adam step's kernels (`layout.parallel`)
    reduce_bucket: Annotated[int, Field(strict=True, ge=0, le=1 << 40)] = 0  # ZeRO 2 / 3 elements a reduction takes

    @model_validator(mode="after")
    def _conf(self):
        try:
            merged_alloc_conf(self.expandable_segments, self.alloc_conf)
        except MemoError as e:
            raise ValueError(str(e)) from None
        return self


class _PrecisionIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    recipes: dict[Literal[DTYPES], Literal[tuple(RECIPES)]] = {}  # model dtype -> the recipe it ran with
    gemm_formats: tuple[Literal[GEMM_FORMATS], ...] = Field(("bf16",), min_length=1)
    fp8_saved_inputs: bool = Field(False, strict=True)  # FP8 GEMM inputs kept for backward as FP8 copies
    fp8_sp_gathers: bool = Field(False, strict=True)  # FP8 GEMM inputs all-gathered (SP) as FP8 copies
    fp8_weights_per_use: bool = Field(False, strict=True)  # FP8 weights cast at every use, no copy kept
    fp8_weights_saved: bool = Field(False, strict=True)  # each layer's FP8 weight saved by autograd to its backward
    fp8_attention_copy: bool = Field(True, strict=True)  # the output projection's own quantised input kept
    fp8_abs_saved: bool = Field(False, strict=True)  # its per-op checkpoint saves each cast's abs output


class _FrameworkIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)
    summary: str = Field(min_length=1)
    sources: tuple[str, ...] = Field(min_length=1)
    policies: tuple[str, ...] = Field(min_length=1)
    layouts: _LayoutsIn
    mechanisms: _MechanismsIn
    precision: _PrecisionIn = _PrecisionIn()
    not_modelled: tuple[str, ...] = ()
    chunked_attention: bool = Field(False, strict=True)  # it runs Llama 4's chunked attention (else full causal)
    # QK norms (Qwen3): their outputs kept for the backward beside the projections (`ModelConfig.qk_norm_kept`)
    qk_norm_outputs_kept: bool = Field(True, strict=True)
    # its fine-grained activation offload copies a tensor once per offload group that saves it
    # (`ModelConfig.offload_copies_per_group`; Megatron-LM's, the one such offload memo prices)
    offload_copies_per_group: bool = Field(True, strict=True)

    @model_validator(mode="after")
    def _consistent(self):
        unknown = [p for p in self.policies if p not in policy_names()]
        if unknown:
            raise ValueError(f"policies {unknown} unknown; choose from {', '.join(policy_names())}")
        if self.mechanisms.attention == "materialised" and self.layouts.context_parallel:
            raise ValueError("materialised attention holds whole score matrices: it cannot run with ring CP")
        return self


@dataclass(frozen=True)
class Framework:
    name: str
    summary: str
    policies: tuple[str, ...]
    sources: tuple[str, ...]
    tensor_parallel: bool
    sequence_parallel: tuple[bool, ...]
    context_parallel: bool
    ulysses: bool
    zero: tuple[int, ...]
    tp_modes: tuple[str, ...]
    mechanisms: tuple[tuple[str, object], ...]  # (mechanism, value) in `MECHANISMS` order
    not_modelled: tuple[str, ...] = ()
    path: str = ""
    schedules: tuple[str, ...] = ("single_stage",)  # the schedules it runs (`memo_sim.layout.schedule`)
    microbatches_at_least_stages: tuple[str, ...] = ()  # ... of them with m >= pp only (`schedule_why_not`)
    recipes: tuple[tuple[str, str], ...] = ()  # (model dtype, model-state recipe it runs it with)
    gemm_formats: tuple[str, ...] = ("bf16",)  # the GEMM formats it offers
    fp8_saved_inputs: bool = False  # under FP8 it keeps the GEMM inputs for backward as FP8 copies
    fp8_sp_gathers: bool = False  # under FP8 its sequence-parallel all-gathers carry the GEMM inputs' FP8 copies
    fp8_weights_per_use: bool = False  # under FP8 it casts the linear weights at every use and keeps no FP8 copy
    fp8_weights_saved: bool = False  # under FP8 each layer's forward saves its FP8 weight copy for its backward
    fp8_attention_copy: bool = True  # under FP8 the output projection keeps its own quantised input (its 1-byte copy)
    fp8_abs_saved: bool = False  # under FP8 its per-op selective checkpoint saves each cast's abs pass output
    optimizer_offload: bool = False  # it can keep the optimizer's states and step on the host
    optimizer_offload_zero: tuple[int, ...] | None = None  # ... beside these ZeRO stages only (None: all it offers)
    uneven_stages: bool = False  # it can give the first / last pipeline stages their own layer counts
    embedding_loss_slots: bool = False  # the embedding and the loss each take a layer's slot in its split
    experts: ExpertsOffer | None = None  # mixture of experts (None: MoE models not offered)
    dp_modes: tuple[str, ...] = ("zero",)  # its data-parallel flavours (`memo_sim.dp`; zero: ZeRO stages)
    ddp: bool = True  # it runs ZeRO 0 over more than one data-parallel rank (`_LayoutsIn.ddp`)
    chunked_attention: bool = False  # it runs chunked attention (Llama 4); else a model's chunked layers run full
    qk_norm_outputs_kept: bool = True  # a QK-norm model's normalised queries and keys kept (`ModelConfig.qk_norm_kept`)
    offload_copies_per_group: bool = True  # `ModelConfig.offload_copies_per_group`
    shards_over_cp: bool = False  # its FSDP shards over the CP ranks too (`_LayoutsIn.shards_over_cp`)
    multi_token_prediction: bool = False  # it trains multi-token-prediction modules (`_LayoutsIn`)
    rank_orders: tuple[str, ...] = (DEFAULT_RANK_ORDER,)  # the orders it numbers ranks in (`layout.rank_order`)
    mapping_equal_groups: bool = False  # another order needs etp x ep = tp x cp (`_LayoutsIn`)
    trains_moe: bool = False  # the layouts asked of it are a mixture of experts' (`for_layouts_of`)
    ring_cp_sliding_window: bool = True  # it runs ring CP for a sliding-window model (`_LayoutsIn`)
    trains_windowed: bool = False  # the layouts asked of it are a sliding-window model's (`for_layouts_of`)
    serial_grads: bool = True  # a launch line can reduce its gradients after the backward (`_LayoutsIn.serial_grads`)
    # its file as validated, every field with its default filled in (`file_fields`; not compared)
    parsed: "_FrameworkIn | None" = field(default=None, compare=False, repr=False)

    def file_fields(self) -> dict:
        """Every field of its file as read, defaults filled in, from the validated model itself (so that a field
        added to the schema is never left out: `memo-sim frameworks --json`; a review found ten dropped by a
        hand-written list), the defaults it resolves at read time as resolved, and the file's path."""
        if self.parsed is None:
            raise MemoError(f"framework {self.name}: built without its file; only `load_frameworks` ones have fields")
        out = self.parsed.model_dump(mode="json")
        out["layouts"]["embedding_loss_slots"] = self.embedding_loss_slots  # None in the file: as uneven_stages
        return {**out, "file": self.path}

    def for_layouts_of(self, model: ModelConfig) -> "Framework":
        """This framework as it lays out ``model``: a mixture of experts' layouts keep to what its MoE layers run
        beside (``experts.zero``), a sliding-window model's to the context parallelism it runs beside a window
        (``layouts.ring_cp_sliding_window``)."""
        want = {"trains_moe": self.trains_moe or bool(model.moe),
                "trains_windowed": self.trains_windowed or bool(model.sliding_layers)}
        return replace(self, **want) if want != {"trains_moe": self.trains_moe,
                                                 "trains_windowed": self.trains_windowed} else self

    def for_model(self, model: ModelConfig) -> ModelConfig:
        """``model`` as this framework trains it: its recipe for the model's dtype where the model
        names none, full causal attention where it runs no chunked attention; a GEMM format it does not offer, or a
        mixture of experts where it trains none, is refused (one line); multi-token-prediction modules it does not
        train are left out and named."""
        if model.moe and self.experts is None:
            raise MemoError(f"model {model.name} is a mixture of experts: {self.name} does not train them in memo's "
                            f"framework data; choose another --framework (megatron, torchtitan, deepspeed, any)")
        if model.moe and (why := MOE_BLOCKS[self.experts.moe_block](model)):
            raise MemoError(f"model {model.name}: {self.name}'s MoE layers ({self.experts.moe_block}) cannot build its "
                            f"{'; '.join(why)}, so its script would train another model; choose another --framework "
                            f"(megatron, torchtitan, any)")
        if model.gemm_format not in self.gemm_formats:
            raise MemoError(f"--precision {model.gemm_format}: {self.name} does not offer {model.gemm_format} GEMMs "
                            f"(it offers {', '.join(self.gemm_formats)}); fix: drop it or choose another --framework")
        fp8 = {"fp8_saved_inputs": self.fp8_saved_inputs, "fp8_sp_gathers": self.fp8_sp_gathers,
               "fp8_weights_per_use": self.fp8_weights_per_use, "fp8_weights_saved": self.fp8_weights_saved,
               "fp8_attention_copy": self.fp8_attention_copy, "fp8_abs_saved": self.fp8_abs_saved}
        if model.gemm.quantised and any(getattr(model, k) != v for k, v in fp8.items()):
            model = replace(model, **fp8)
        if model.qk_norm and model.qk_norm_kept != self.qk_norm_outputs_kept:  # as it keeps them for the backward
            model = replace(model, qk_norm_kept=self.qk_norm_outputs_kept)
        if model.offload_copies_per_group != self.offload_copies_per_group:  # as its offload copies shared tensors
            model = replace(model, offload_copies_per_group=self.offload_copies_per_group)
        if model.chunked_layers and not self.chunked_attention:  # as its script would run the model
            note = (f"chunked attention ({model.attention_chunk}-token chunks on {model.chunked_layers} layers): "
                    f"{self.name} has none, priced as full causal attention")
            model = replace(model, attention_chunk=0, chunked_layers=0, chunked_period=0,
                            not_modelled="; ".join(x for x in (model.not_modelled, note) if x)[:500])
        if model.mtp_layers and not self.multi_token_prediction:
            note = (f"multi-token prediction ({modules_words(model.mtp_layers)}): "
                    f"{self.name} does not train it in memo's framework data, priced without")
            model = replace(model, mtp_layers=0,
                            not_modelled="; ".join(x for x in (model.not_modelled, note) if x)[:500])
        recipe = dict(self.recipes).get(model.dtype)
        if model.precision is not None or recipe is None:
            return model
        return replace(model, precision=recipe)

    def mechanism(self, name: str):
        return dict(self.mechanisms)[name]

    def allows(self, lay: Layout) -> bool:
        return self.why_not(lay) is None

    def why_not(self, lay: Layout) -> str | None:
        """None when the framework offers the layout, else why not (one phrase)."""
        what = None
        if lay.tp > 1 and not self.tensor_parallel:
            what = "tensor parallelism"
        elif lay.tp > 1 and lay.sp not in self.sequence_parallel:
            what = "TP with" + ("" if lay.sp else "out") + " sequence parallelism"
        elif (self.trains_moe and self.experts is not None and self.experts.sequence_parallel is not None
              and lay.tp > 1 and lay.sp not in self.experts.sequence_parallel):
            what = "TP with" + ("" if lay.sp else "out") + " sequence parallelism beside MoE layers"
        elif lay.cp > 1 and not self.context_parallel:
            what = "ring context parallelism"
        elif lay.cp > 1 and self.trains_windowed and not self.ring_cp_sliding_window:
            what = ("ring context parallelism beside a sliding window: TransformerEngine's CP runs a window under its "
                    "a2a or all_gather communication only" + (", Ulysses (a2a) alone does" if self.ulysses else ""))
        elif lay.ulysses > 1 and not self.ulysses:
            what = "Ulysses"
        elif lay.zero not in self.zero:
            what = f"ZeRO stage {lay.zero}"
        elif lay.dp_mode not in self.dp_modes and (lay.dp_mode != "zero" or lay.zero > 0):
            what = f"data-parallel flavour {lay.dp_mode}" + (f" at stage {lay.zero}" if lay.dp_mode == "zero" else "")
        elif self.shards_over_cp and lay.cp > 1 and lay.zero < 3:
            what = f"weights replicated over the {lay.cp} context-parallel ranks: its FSDP shards over them"
        elif self.shards_over_cp and lay.cp > 1 and lay.fsdp_shard % lay.cp:
            what = f"an FSDP shard group of {lay.fsdp_shard}, not a multiple of the {lay.cp} context-parallel ranks"
        elif lay.zero == 0 and lay.state_shards > 1 and not self.ddp:
            what = f"ZeRO 0 over {lay.state_shards} data-parallel replicas (DDP); use ZeRO 3"
        elif lay.tp_mode not in self.tp_modes:
            what = f"tp_mode {lay.tp_mode}"
        elif lay.optimizer_offload and not self.offloads_optimizer(lay.zero, lay.dp * lay.cp * lay.ulysses):
            what = "optimizer offload" + (f" at ZeRO stage {lay.zero}" if self.optimizer_offload else "")
        elif lay.uneven and not self.uneven_stages:
            what = "uneven pipeline stages"
        elif lay.account_embedding_loss and not self.embedding_loss_slots:
            what = "the embedding and the loss in the pipeline split"
        elif (lay.ep > 1 or lay.etp > 1) and self.experts is None:
            what = "expert parallelism"
        elif self.experts is not None and lay.ep > 1 and not self.experts.expert_parallel:
            what = "expert parallelism"
        elif self.experts is not None and lay.etp > 1 and not self.experts.expert_tensor_parallel:
            what = "expert tensor parallelism"
        elif self.experts is not None and lay.moe_dispatcher not in self.experts.dispatchers:
            what = f"the {lay.moe_dispatcher} token dispatcher"
        elif self.experts is not None and lay.balance.kind not in self.experts.balances:
            what = f"expert loads {lay.moe_balance}"
        elif lay.ep_overlap and (self.experts is None or not self.experts.ep_overlap):
            what = "the EP all-to-all overlap (--overlap-moe-expert-parallel-comm)"
        elif self.trains_moe and self.experts is not None and self.experts.zero is not None and \
                lay.zero not in self.experts.zero:
            what = f"ZeRO stage {lay.zero} beside MoE layers (it runs them beside stages {self.experts.zero_words})"
        elif self.experts is not None and self.experts.ep_within_shards and lay.ep > 1 and (
                lay.tp * (lay.dp_flavour.shard_group(lay) if lay.dp_mode == "fsdp" else lay.cp)) % (lay.ep * lay.etp):
            what = "expert parallelism beyond the ranks it borrows from (TP x CP x the FSDP shard group)"
        elif lay.rank_order not in self.rank_orders and lay.pp > 1 and lay.dp > 1:
            what = f"rank order {lay.rank_order} (it numbers ranks {', '.join(self.rank_orders)})"
        elif (self.mapping_equal_groups and lay.rank_order != self.rank_orders[0] and lay.pp > 1 and lay.dp > 1
              and (lay.etp * lay.ep if lay.ep > 1 or lay.etp > 1 else lay.tp) != lay.tp * lay.cp * lay.ulysses):
            expert = lay.etp * lay.ep if lay.ep > 1 or lay.etp > 1 else lay.tp
            what = (f"rank order {lay.rank_order} with expert groups of {expert} ranks (etp x ep; a dense model's: "
                    f"tp) other than the {lay.tp * lay.cp * lay.ulysses} of tp x cp: its expert and dense "
                    f"data-parallel groups must be equal in that order")
        return None if what is None else f"{self.name} does not offer {lay.label()} ({what})"

    def fixed_why_not(self, *, tp: int | None = None, cp: int | None = None, ulysses: int | None = None,
                      zero: int | None = None, sp: bool | None = None) -> str | None:
        """Where a degree the request fixes is one the framework never offers, why (one phrase), else None: the
        answer then names it rather than a rejected layout's first reason (a review: --zero 1 under megatron@2021
        said 'does not offer tp4+sp-pp2-z1 (TP with sequence parallelism)')."""
        if zero is not None and zero not in self.zero:
            return f"{self.name} does not offer ZeRO stage {zero} (it offers {', '.join(map(str, self.zero))})"
        if tp is not None and tp > 1 and not self.tensor_parallel:
            return f"{self.name} does not offer tensor parallelism (--tp {tp})"
        if cp is not None and cp > 1 and not self.context_parallel:
            return f"{self.name} does not offer ring context parallelism (--cp {cp})"
        if ulysses is not None and ulysses > 1 and not self.ulysses:
            return f"{self.name} does not offer Ulysses (--ulysses {ulysses})"
        if sp is not None and (tp is None or tp > 1) and sp not in self.sequence_parallel:
            return f"{self.name} does not offer TP with{'' if sp else 'out'} sequence parallelism"
        return None

    def schedule_why_not(self, schedule: str, pp: int, micro_batches: int) -> str | None:
        """None where the framework runs ``schedule`` over ``pp`` stages with ``micro_batches`` micro-batches, else
        why not (one phrase; a review: torchtitan's 1F1B planned and exported with 2 micro-batches over 4 stages,
        which PyTorch's Schedule1F1B refuses as it starts)."""
        if schedule in self.microbatches_at_least_stages and pp > 1 and micro_batches < pp:
            return (f"{self.name} runs {schedule} with at least as many micro-batches as pipeline stages, got "
                    f"{micro_batches} for pp {pp} (PyTorch's Schedule1F1B raises below that)")
        return None

    def offloads_optimizer(self, zero: int, zero_group: int = 2) -> bool:
        """Whether it keeps the optimizer's states and step on the host beside ZeRO stage ``zero``, ZeRO sharding
        over ``zero_group`` ranks (dp x cp x ulysses): over one rank the stages shard nothing and are one setting
        (memo enumerates ZeRO 0 alone there), so e.g. Megatron's distributed optimizer over a data-parallel group of
        1 with --optimizer-cpu-offload is its ZeRO 0 layout."""
        if not self.optimizer_offload:
            return False
        allowed = self.optimizer_offload_zero
        return allowed is None or zero in allowed or (zero_group == 1 and bool(allowed))

    def adapt(self, lay: Layout, profile=None) -> Layout:
        """The layout as this framework runs it: its mechanisms applied; on ``profile`` (a `HardwareProfile`),
        its attention kernels as the profile prices them (cuDNN's where the profile has its own curves, else
        FlashAttention-2, which TransformerEngine too runs there), so that a layout's label names the kernel
        priced."""
        mech = {MECHANISMS[k]: v for k, v in self.mechanisms}
        # the data-parallel mechanisms set only where they act (ZeRO-1/2's weight gather, ZeRO 0's replicas), so a
        # plan's file names them only there (`Layout.to_dict` leaves their defaults out)
        if lay.zero not in (1, 2):
            mech["param_gather"] = "overlap"
        if lay.zero != 0:
            mech["replicate_fsdp"] = False
        if lay.zero < 2:  # ZeRO 0 / 1 keep the gradients whole: no bucket of them is priced
            mech["reduce_bucket"] = 0
        if lay.zero < 3 or lay.dp_mode != "fsdp":  # FSDP's copies: FSDP's gathers and reductions only
            mech["fsdp_copies"] = False
        out = replace(lay, **mech)
        if profile is None:
            return out
        priced = profile.efficiency.priced_attention_kernel
        attention = priced(out.attention)
        blocks = priced(out.block_attention) if out.block_attention else ""
        return replace(out, attention=attention, block_attention="" if blocks == attention else blocks)


def mechanism_changes(mine: Layout, theirs: Layout, profile) -> list[str]:
    """What a framework runs its own way in ``theirs`` (``Framework.adapt`` of ``mine``), priced so: each of the
    plan's mechanisms it replaces as "name mine -> theirs" (memo's chunked loss, ...), where the change reaches the
    plan (a K/V repeat rule needs Ulysses, a ring's merges ring CP, SP's re-gather TP with SP, an attention kernel
    other curves on ``profile``: a ring's attention runs as its blocks, a layer kernel's otherwise)."""
    eff = profile.efficiency
    moot = {"ulysses_kv": theirs.ulysses == 1, "ring_merge": theirs.cp == 1,
            "ulysses_bwd_resend": theirs.ulysses == 1, "ring_dkv_fp32": theirs.cp == 1,
            "head_grads_unit": theirs.zero < 2, "param_gather": theirs.zero not in (1, 2) or theirs.state_shards < 2,
            "replicate_fsdp": theirs.zero > 0, "reduce_bucket": theirs.zero < 2,
            "fsdp_copies": theirs.zero < 3 or theirs.dp_mode != "fsdp" or theirs.state_shards < 2,
            "optimizer_impl": theirs.optimizer_offload,
            "sp_regather_overlap": theirs.tp == 1 or (theirs.sp and theirs.sp_input_kept),
            "sp_input_kept": not (theirs.tp > 1 and theirs.sp),
            "attention": theirs.runs_blocks() or eff.priced_attention_kernel(mine.attention)
            == eff.priced_attention_kernel(theirs.attention),
            "block_attention": not theirs.runs_blocks() or eff.priced_attention_kernel(mine.block_kernel)
            == eff.priced_attention_kernel(theirs.block_kernel)}

    def shown(k: str, f: str, lay: Layout) -> str:  # a blocks' kernel of "" reads as the layer kernel's
        return lay.block_kernel if k == "block_attention" else getattr(lay, f)

    # compared as shown: a ring's blocks on the layer kernel ("") of flash and of cudnn are other kernels though
    # both fields read "" (a review: a torchtitan plan's ring on FlashAttention-2 exported to Megatron-LM, priced on
    # TransformerEngine's cuDNN, named no kernel change)
    return [f"{k} {shown(k, f, mine)} -> {shown(k, f, theirs)}" for k, f in MECHANISMS.items()
            if shown(k, f, mine) != shown(k, f, theirs) and not moot.get(k, False)]


def _read(path: Path) -> Framework:
    try:
        raw = load_yaml(read_utf8(path, MemoError))
    except yaml.YAMLError as e:
        raise MemoError(f"{path}: cannot parse framework file ({str(e).splitlines()[0]})") from None
    f = validated(_FrameworkIn, raw, str(path))
    if f.name != path.stem:
        raise MemoError(f"{path}: name {f.name!r} differs from the file name; rename one of them")
    lay = f.layouts
    return Framework(f.name, f.summary, f.policies, f.sources, lay.tensor_parallel, lay.sequence_parallel,
                     lay.context_parallel, lay.ulysses, lay.zero, lay.tp_modes,
                     tuple((k, getattr(f.mechanisms, k)) for k in MECHANISMS), f.not_modelled, str(path),
                     lay.schedules, microbatches_at_least_stages=lay.microbatches_at_least_stages,
                     recipes=tuple(f.precision.recipes.items()), gemm_formats=f.precision.gemm_formats,
                     optimizer_offload=lay.optimizer_offload, optimizer_offload_zero=lay.optimizer_offload_zero,
                     uneven_stages=lay.uneven_stages,
                     embedding_loss_slots=lay.uneven_stages if lay.embedding_loss_slots is None
                     else lay.embedding_loss_slots,
                     fp8_saved_inputs=f.precision.fp8_saved_inputs, fp8_sp_gathers=f.precision.fp8_sp_gathers,
                     fp8_weights_per_use=f.precision.fp8_weights_per_use,
                     fp8_weights_saved=f.precision.fp8_weights_saved, fp8_attention_copy=f.precision.fp8_attention_copy,
                     fp8_abs_saved=f.precision.fp8_abs_saved,
                     dp_modes=lay.dp_modes, ddp=lay.ddp, chunked_attention=f.chunked_attention,
                     shards_over_cp=lay.shards_over_cp,
                     qk_norm_outputs_kept=f.qk_norm_outputs_kept, offload_copies_per_group=f.offload_copies_per_group,
                     multi_token_prediction=lay.multi_token_prediction, rank_orders=lay.rank_orders,
                     mapping_equal_groups=lay.mapping_equal_groups, ring_cp_sliding_window=lay.ring_cp_sliding_window,
                     serial_grads=lay.serial_grads,
                     experts=None if lay.experts is None else ExpertsOffer(**lay.experts.model_dump()), parsed=f)


@lru_cache(maxsize=1)
def load_frameworks() -> dict[str, Framework]:
    """Every framework file under `DATA`, by name (``any`` first)."""
    out = {f.name: f for f in (_read(p) for p in sorted(DATA.glob("*.yaml")))}
    return dict(sorted(out.items(), key=lambda kv: (kv[0] != "any", kv[0])))


__all__ = ["DATA", "MECHANISMS", "Framework", "load_frameworks"]
