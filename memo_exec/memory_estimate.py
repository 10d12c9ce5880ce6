"""The executor's device-memory estimate before anything is allocated, term by term in the
simulator's terms (`memo_sim.memplan.footprint.MemoryBreakdown`), and the fit check.

Terms (bytes on the device):

- ``model_states``: weights, gradients, AdamW states (fp32 master weights for 16-bit parameters) of every
  parameter the run trains (`ModelConfig.trained_params`: the multi-token-prediction modules' too), and
  under FP8 GEMMs every layer's linear weights' two FP8 copies, the modules' layers included (`memo_exec.gemm_formats`;
  the simulator's `memo_sim.cost.gemm_format.weight_cache_bytes`).
- ``skeletal_resident``: skeletal tensors kept across layers (store all: every layer's; full
  recompute: every layer's input).
- ``buffers``: the two rounding buffers (offloading policies; a pipeline rank's MEMO: four, two forward and
  two prefetch, shared by its micro-batches in flight) or the one recompute buffer (a pipeline rank's: one).
- ``lse``: every layer's attention log-sum-exp.
- ``norm_stats``: every layer's norm statistics, mean and rstd slots (the simulator does not count these).
- ``transient_peak``: one layer at its peak: the arena (the memory plan's largest level-1 phase
  peak, shared by forward and backward) plus what lives outside it at that moment: scratch the
  plan does not place, the attention kernel's own outputs (the aten SDPA kernels and flash-attn
  allocate them; the layer copies them into its slots) and, in backward, its own workspace
  (FlashAttention's fp32 dQ accumulator and two fp32 lse-sized vectors, the simulator's
  ``attention_bwd_workspace``: `memo_exec.attention.kernel_bwd_workspace`), LayerNorm outputs
  (aten allocates them), an RMSNorm backward's temporaries (`memo_exec.layer.norm_backward_temp_bytes`; the QK
  norms' `memo_exec.layer.qk_norm_temp_bytes`; FP8 GEMMs' cast of their widest input,
  `memo_exec.gemm_formats.cast_temp_bytes`).
- ``layer_boundary``: the activation handed between layers, live beside a layer's work (the
  embedding output in layer 0's forward, the incoming gradient in backward).
- ``classifier_peak``: the chunked head: the last layer output, the final norm output and its
  gradient, the head's weight gradient and one chunk's logits (with the fp32 softmax and the
  gradient cast back when the model dtype is 16-bit). With multi-token-prediction modules also what
  they keep from their forward to their backward (`memo_exec.mtp.mtp_kept_bytes`: under a policy that re-runs
  whole layers each module's two inputs alone, its layer re-run in the policy's recompute buffer; the simulator's
  `memo_sim.cost.memory.mtp_activation_bytes` there too), and each module's final-normed rows and their
  gradient join the head's. Under a memory plan the layer arena stays
  allocated through the classifier: the chunk's logits and their fp32 copy are placed in it
  (`memo_exec.model.ChunkPlace`, as the plan's level-2 arena puts ``classifier_chunk`` over the
  layer blocks), or come on top of it where they do not fit.
- ``optimizer_step_peak``: the arena (if any) and the AdamW step's temporaries for the largest
  parameter: none with fp32 main gradients (the fused step), a cast gradient otherwise (the
  simulator does not count these).
- ``peak_total`` = states + resident + buffers + lse + norm stats +
  max(transient + boundary, classifier, optimizer step), the simulator's formula plus the
  executor-only terms.

Whole-model buffers (rounding buffers, hidden states, the classifier chunk) are allocated once
outside the arena, so the level-2 ``arena_bytes`` of a plan is not allocated.
"""

from __future__ import annotations

from dataclasses import dataclass

from memo_exec.device import acc_dtype, element_size, gib
from memo_exec.errors import FitError
from memo_exec.gemm_formats import cast_temp_bytes
from memo_exec.layer import norm_backward_temp_bytes, qk_norm_temp_bytes
from memo_exec.model import ChunkPlace, padded_vocab, vocab_padding_params
from memo_exec.mtp import modules_recomputed, mtp_kept_bytes
from memo_exec.optim import AdamW, model_state_bytes
from memo_exec.optim_offload import HostAdamW

# executor term -> the simulator's MemoryBreakdown field (None: computed here from the simulator's
# skeletal bytes, or a term the simulator does not have)
SIM_TERMS = {
    "model_states": "model_states_bytes",
    "skeletal_resident": "skeletal_resident_bytes",
    "buffers": "rounding_buffer_bytes",
    "lse": "lse_bytes",
    "norm_stats": None,
    "transient_peak": "transient_peak_bytes",
    "layer_boundary": "layer_boundary_bytes",
    "classifier_peak": "classifier_peak_bytes",
    "optimizer_step_peak": None,
    "peak_total": "peak_gpu_bytes",
}
STATIC_TERMS = ("model_states", "skeletal_resident", "buffers", "lse", "norm_stats")
PEAK_TERMS = ("transient_peak", "layer_boundary", "classifier_peak", "optimizer_step_peak")
TRANSIENT_TERMS = PEAK_TERMS[:3]  # what the plan's level-1 transients and the classifier's peak size
ACTIVATION_TERMS = STATIC_TERMS[1:]  # a policy's activations (autograd's where the executor does not size them)


def peak_total(static: float, terms: dict) -> int:
    """The peak of an estimate (the module docs' ``peak_total``, the simulator's formula plus the optimizer step):
    the ``static`` terms' sum and the largest of a layer's transients with the boundary, the classifier and the
    optimizer step (``terms``' `PEAK_TERMS`); the one-device and the distributed estimates both take it."""
    return int(static + max(terms["transient_peak"] + terms["layer_boundary"], terms["classifier_peak"],
                            terms["optimizer_step_peak"]))


@dataclass
class MemoryEstimate:
    terms: dict[str, int]  # the SIM_TERMS keys, peak_total last
    host: int  # pinned host bytes (the offload pool)
    detail: dict[str, int]  # how transient_peak is made up
    not_estimated: tuple[str, ...] = ()  # terms left at 0 because this estimate cannot make them (compared as none)

    @property
    def total(self) -> int:
        return self.terms["peak_total"]

    def lines(self) -> list[str]:
        return [f"{k}: {gib(v)}" for k, v in self.terms.items()]

    def compare(self, sim: dict | None) -> list[dict]:
        """Rows ``term, executor, simulator, rel_error`` against a simulator memory breakdown
        (``MemoryBreakdown.to_dict()``)."""
        rows = []
        for k, v in self.terms.items():
            field = SIM_TERMS[k]
            s = None
            if sim is not None:
                if field is not None:
                    s = sim.get(field)
                else:
                    s = 0.0
            if k in self.not_estimated:  # neither 0 bytes nor a -100% error: not known
                v = None
            rel = (v - s) / s if s and v is not None else None
            rows.append({"term": k, "executor_bytes": v, "simulator_bytes": s, "rel_error": rel,
                         "simulator_field": field})
        return rows


def scratch_peak(events: list[tuple[str, str, str, int]], phase: str, skip: set[str] = frozenset()) -> int:
    """Max-live bytes of one phase's recorded scratch requests, leaving out ``phase:name`` in ``skip``."""
    live = peak = 0
    sizes: dict[str, int] = {}
    for op, ph, name, nb in events:
        if ph != phase or f"{ph}:{name}" in skip:
            continue
        if op == "malloc":
            sizes[name] = nb
            live += nb
            peak = max(peak, live)
        else:
            live -= sizes.pop(name, 0)
    return peak


def estimate_memory(model, batch: int, seq: int, dtype, policy, backend, dims, requests, arena_plan,
                    classifier_chunk_tokens: int, largest_param_numel: int, grad_dtype=None,
                    layer_grad_bytes: int = 0, optimizer_on_host: bool = False) -> MemoryEstimate:
    """``policy``: the executor policy (sizes only); ``requests``: the layer's recorded scratch
    requests (`memo_exec.arena.AllocRecorder`); ``arena_plan``: the parsed memory plan or None;
    ``grad_dtype``: the gradients the optimizer reads (fp32 main gradients under Megatron's recipe,
    `memo_exec.optim.main_grad_dtype`), whose 16-bit layer gradients (``layer_grad_bytes``) then
    live during that layer's backward only. ``optimizer_on_host`` (optimizer offload,
    `memo_exec.optim_offload`): AdamW's states and its step's temporaries are host memory, so the
    device keeps the weights and the gradients only."""
    T, h, V = batch * seq, model.hidden, padded_vocab(model.vocab)
    e, acc_e = element_size(dtype), element_size(acc_dtype(dtype))
    P = model.trained_params() + vocab_padding_params(model)
    dev = policy.device_bytes()
    states = model_state_bytes(P, dtype, grad_dtype)
    if model.gemm.quantised:  # every linear weight's FP8 copies (one device: the simulator's weight_cache_bytes)
        states += model.gemm.quantised_bytes((model.layers + model.mtp_layers) * model.linear_params(), weight=True)
    if optimizer_on_host:
        states -= AdamW.state_bytes_for(P, dtype)
    terms = {"model_states": states,
             "skeletal_resident": dev.get("skeletal_resident", 0), "buffers": dev.get("buffers", 0),
             "lse": dev.get("lse", 0), "norm_stats": dev.get("norm_stats", 0)}

    arena, placed = 0, set()
    if arena_plan is not None:
        arena = arena_plan.arena_bytes
        placed = {f"{ph}:{n}" for ph, offs in arena_plan.offsets.items() for n in offs}
    hidden = T * h * e  # one [T, h] activation: LayerNorm output, layer input/output, incoming gradient
    kernel = {ph: backend.outside_bytes(dims, e, ph) for ph in ("fwd", "bwd")}
    recomputes_attention = bool(getattr(policy.choice, "recomputes_attention", False))
    # FP8 GEMMs: the cast of the widest GEMM input (`memo_exec.gemm_formats.cast_temp_bytes`)
    fp8_cast_bytes = cast_temp_bytes(T * max(h, model.q_dim, model.fc1_width), e) if model.gemm.quantised else 0
    outside = {
        "fwd": scratch_peak(requests.events, "fwd", placed) + max(hidden, kernel["fwd"], fp8_cast_bytes),
        # backward: LayerNorm backward outputs, the kernel's gradients, or (full recompute) its forward outputs
        "bwd": scratch_peak(requests.events, "bwd", placed) + layer_grad_bytes + max(
            hidden + norm_backward_temp_bytes(model, T, dtype), kernel["bwd"], qk_norm_temp_bytes(model, T, dtype),
            fp8_cast_bytes,
            kernel["fwd"] if recomputes_attention else 0),
    }
    terms["transient_peak"] = arena + max(outside.values())
    terms["layer_boundary"] = hidden
    chunk = min(classifier_chunk_tokens, T)
    widened = chunk * V * (acc_e + e) if acc_e != e else 0  # fp32 softmax copy and the gradient cast back
    chunk_tensors = chunk * V * e + widened
    if arena:  # the arena stays allocated: the chunk's logits and fp32 copy lie in it when they fit
        # (`memo_exec.model.ChunkPlace`), else they come on top of it
        placed = ChunkPlace.rows_for(arena, chunk, V, e, acc_e if acc_e != e else 0)
        chunk_tensors = arena if placed else arena + chunk_tensors
    # the last layer's output, every final-normed row (the model's and each module's) and its gradient
    mtp = mtp_kept_bytes(model, batch, seq, dtype, modules_recomputed(policy.choice))
    head = (1 + 2 * (1 + model.mtp_layers)) * hidden + V * h * e + chunk_tensors + mtp
    terms["classifier_peak"] = max(head, hidden + V * h * e)  # or the embedding's dense gradient beside dy
    terms["optimizer_step_peak"] = arena + (0 if optimizer_on_host else AdamW.step_temporary_bytes(
        largest_param_numel, dtype, grad_dtype))
    static = sum(terms[k] for k in STATIC_TERMS)
    terms["peak_total"] = peak_total(static, terms)
    detail = {"arena": arena, "outside_arena_fwd": outside["fwd"], "outside_arena_bwd": outside["bwd"],
              "attention_kernel_fwd": kernel["fwd"], "attention_kernel_bwd": kernel["bwd"]}
    host = policy.host_bytes() + (HostAdamW.host_bytes_for(P, dtype) if optimizer_on_host else 0)
    return MemoryEstimate({k: int(v) for k, v in terms.items()}, int(host), detail)


def check_fit(est: MemoryEstimate, *, device_free: int, host_available: int, on_cuda: bool, what: str,
              where: str, hint: str = "", host_ranks: list[tuple[int, int, int]] | None = None,
              rank: int = 0) -> None:
    """Raise `FitError` when the estimate exceeds the device's free memory or (offloading on CUDA)
    the pinned pool exceeds the host's available memory. On a CPU the device is the host, so the
    host pool counts against the same free memory.

    ``host_ranks``: (rank, device bytes, host bytes) of every rank of a multi-rank run on this host, this one's
    included (None, or one rank: this process alone); ``rank``: whose estimate ``est`` is. The ranks share the host:
    on a CPU every rank's estimate and pool count against the host's free memory together, on CUDA every rank's
    pinned pool against the host's available memory (each rank's device is its own, checked with its own estimate).
    A review: each rank was checked alone against the whole host's free memory, so two ranks of 52 MB ran on 80 MB
    free, and a tp-2 plan said one rank's share as what the host needed."""
    ranks = host_ranks if host_ranks is not None and len(host_ranks) > 1 else None
    if not on_cuda and ranks is not None:
        needs = [t + h for _, t, h in ranks]
        if sum(needs) > device_free:
            n = len(needs)
            whose = "each rank" if len({(t, h) for _, t, h in ranks}) == 1 else f"rank {rank}"
            if len(set(needs)) == 1:
                amount, terms = f"{n} ranks x {_times(needs[0], n)} on {where}", whose
            else:
                amount = f"{gib(sum(needs))} for its {n} ranks on {where}"
                terms = f"{' + '.join(gib(v) for v in needs)}; {whose}"
            raise FitError(f"does not fit: {what} needs about {amount} ({terms}: {_largest_terms(est)}), which has "
                           f"{gib(device_free)} free{hint}")
    need = est.total + (0 if on_cuda else est.host)
    if need > device_free:
        raise FitError(f"does not fit: {what} needs about {gib(need)} on {where} "
                       f"({_largest_terms(est)}), which has {gib(device_free)} free{hint}")
    pools = [h for _, _, h in ranks] if on_cuda and ranks is not None else [est.host]
    if on_cuda and sum(pools) > host_available:
        if len(pools) == 1:
            whose, amount = "offloaded activations", gib(est.host)
        elif len(set(pools)) == 1:
            whose, amount = "the offloaded activations of this host's ranks", \
                f"{len(pools)} ranks x {_times(pools[0], len(pools))}"
        else:
            whose = f"the offloaded activations of this host's {len(pools)} ranks"
            amount = f"{gib(sum(pools))} ({' + '.join(gib(v) for v in pools)})"
        raise FitError(f"does not fit: {whose} need {amount} of pinned host memory, "
                       f"the host has {gib(host_available)} available")


def _largest_terms(est: MemoryEstimate) -> str:
    big = sorted(((k, v) for k, v in est.terms.items() if k != "peak_total"), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{k} {gib(v)}" for k, v in big)


def _times(each: float, n: int) -> str:
    """``EACH = TOTAL`` of ``n`` ranks of ``each`` bytes, the total the product of the figure shown (the line says
    "about"), to three decimals below 1 GiB (a review: "2 ranks x 0.05 GiB = 0.09 GiB", each rounded on its own)."""
    digits = 3 if each < 2**30 else 2
    shown = round(each / 2**30, digits)
    return f"{shown:.{digits}f} GiB = {n * shown:.{digits}f} GiB"
