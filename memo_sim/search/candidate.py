"""The what-if's one candidate type, whatever its schedule: a layout, an activation policy, a
schedule and a batch split, with its analytic estimate and memory (tier 1) and, where tier 2 ran,
its simulated summary; and the words that say why a candidate stops where it does."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Callable

from memo_sim.policy.base import uses_memory_plan
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.footprint import MemoryBreakdown, over_capacity_share
from memo_sim.model.config import ModelConfig
from memo_sim.plan.schema import Plan
from memo_sim.policy import Policy
from memo_sim.policy.rounding_buffers import KEPT_LAYERS, offloaded_layer_count
from memo_sim.profile.schema import HardwareProfile
from memo_sim.search.estimate import IterationEstimate
from memo_sim.search.plan_build import build_plan


@dataclass
class Candidate:
    model: ModelConfig
    layout: Layout
    policy: Policy
    batch: int
    seq: int
    profile: HardwareProfile
    priced: IterationEstimate | Callable[[], IterationEstimate]  # the estimate, or how to price it (`estimate`)
    memory: MemoryBreakdown
    alpha_note: str = ""
    simulated: dict | None = None  # filled by the event simulator (tier 2)
    folded: list[str] = field(default_factory=list)  # policy labels of duplicate rows folded into this one
    sppo: dict | None = None  # SPPO: the solved point (N, partition, alphas, stage of the peak, ...) and its role
    schedule: str = "single_stage"  # how the iteration runs over stages and micro-batches (`memo_sim.layout.schedule`)
    micro_batch: int = 0  # sequences per micro-batch (0: the whole batch in one)
    pipeline: dict | None = None  # micro-batch pipelines: the analytic per-stage rows and the bubble
    framework: str = "any"  # the framework its search was for (`memo_sim.search.request.answer_whatif` stamps it)

    def __post_init__(self) -> None:
        if not self.micro_batch:
            self.micro_batch = self.batch

    @property
    def estimate(self) -> IterationEstimate:
        """The analytic estimate (tier 1), priced on first read where the search deferred it: of a
        cluster-scale query's tens of thousands of candidates most do not fit, and what ranks
        and lists those is their memory (the same estimate whenever it is priced: its costs are
        pure functions of the candidate)."""
        e = self.priced
        if not isinstance(e, IterationEstimate):
            e = self.priced = e()
        return e

    @property
    def micro_batches(self) -> int:
        return self.batch // self.micro_batch

    @property
    def status(self) -> str:
        if self.simulated is not None:
            return self.simulated["status"]
        return self.memory.status

    @property
    def tier(self) -> str:
        """``simulated`` where the event simulator ran it (tier 2), else ``analytic`` (tier 1)."""
        return "simulated" if self.simulated is not None else "analytic"

    @property
    def over_bytes(self) -> float:
        """By how much the candidate does not fit: the simulated failure's request past capacity
        where tier 2 ran out of memory, else the analytic excess."""
        f = (self.simulated or {}).get("failure")
        if f:
            return max(0.0, f["in_use_bytes"] + f["requested_bytes"] - f["capacity_bytes"])
        return self.memory.oom_by if self.memory.status == "OOM" else self.memory.oohm_by

    @property
    def host_over_bytes(self) -> float:
        """Pinned host bytes per node over the node's usable memory (the candidate's own tier), whatever the status:
        an OOM row's status and `over_bytes` name the GPU's overflow only, and this is the host's beside it."""
        return max(0.0, self.host_bytes_per_node - self.memory.host_capacity_bytes)

    @property
    def over_share(self) -> float:
        """How far the candidate is from fitting, what ranks the ones that do not (`sort_key`, the what-if's
        "closest"): a simulated failure's request past its capacity as a share of it (the event simulator stops at
        its first failure: memo_sim/engine/core.py ``_fail``), else both analytic overflows, GPU and pinned host,
        each as a share of its capacity, added (`MemoryBreakdown.over_share`: a plan over both memories is farther
        than one over either by the same amount)."""
        f = (self.simulated or {}).get("failure")
        if f:
            return over_capacity_share(self.over_bytes, f["capacity_bytes"])
        return self.memory.over_share

    @property
    def tgs(self) -> float:
        """Tokens per GPU per second: simulated where tier 2 ran, else analytic."""
        return self.simulated["tgs_tokens_per_gpu_s"] if self.simulated else self.estimate.tgs

    def sort_key(self) -> tuple:
        """Fitting first, by throughput; equal throughputs by the lower peak GPU memory (the same time for
        less memory: ZeRO 3 beside ZeRO 2 where the gathers hide). Exact ties only, so the proved-bound
        search, which simulates every candidate whose bound reaches the best, ranks as the exhaustive one."""
        if self.status != "OK":  # a simulated failure has no throughput; both overflows count (`over_share`)
            return (True, self.over_share, 0.0, 0.0)
        return (False, 0.0, -self.tgs, self.peak_gpu_bytes)

    def _own_tier(self, simulated_key: str, analytic: float) -> float:
        """The simulated number under ``simulated_key`` where tier 2 ran and gave one, else ``analytic``."""
        s = self.simulated
        return s[simulated_key] if s and s.get(simulated_key) is not None else analytic

    @property
    def peak_gpu_bytes(self) -> float:
        """Peak GPU memory: simulated where tier 2 ran, else analytic."""
        return self._own_tier("peak_gpu_bytes", self.memory.peak_gpu_bytes)

    @property
    def host_bytes_per_node(self) -> float:
        """Pinned host memory per node: simulated where tier 2 ran, else analytic."""
        return self._own_tier("peak_host_bytes_per_node", self.memory.host_bytes_per_node)

    @property
    def global_batch(self) -> int:
        """Sequences per iteration over the whole cluster: the replica's batch times the data-parallel replicas."""
        return self.batch * self.layout.dp

    def to_json(self) -> dict:
        e, m = self.estimate, self.memory
        d = {
            "layout": self.layout.label(),
            "layout_degrees": dict(_layout_dict(self.layout)),
            "policy": self.policy.name,
            "tier": self.tier,
            "alpha": self.policy.alpha,
            "alpha_note": self.alpha_note,
            "status": self.status,
            "analytic_status": m.status,
            "oom_by_bytes": m.oom_by,
            "oohm_by_bytes": m.oohm_by,
            "analytic_iteration_s": e.iteration_s,
            "analytic_mfu": e.mfu,
            "analytic_tgs_tokens_per_gpu_s": e.tgs,
            "analytic_exposed_copy_s": e.exposed_copy_s,
            "peak_gpu_bytes": self.peak_gpu_bytes,  # the row's own tier (its "tier"), as "peak" says
            "analytic_peak_gpu_bytes": m.peak_gpu_bytes,
            "gpu_capacity_bytes": m.gpu_capacity_bytes,
            "host_bytes_per_node": self.host_bytes_per_node,
            "analytic_host_bytes_per_node": m.host_bytes_per_node,
            "host_capacity_bytes": m.host_capacity_bytes,
            "model_states_bytes": m.model_states_bytes,
            "skeletal_resident_bytes": m.skeletal_resident_bytes,
            "rounding_buffer_bytes": m.rounding_buffer_bytes,
            "transient_peak_bytes": m.transient_peak_bytes,
            "transient_planned_bytes": m.transient_planned_bytes,
            "transient_caching_allocator_bytes": m.transient_caching_allocator_bytes,
            "transient_source": "static memory plan" if uses_memory_plan(self.policy, self.layout) else "caching allocator",
            "layer_forward_s": e.layer.forward,
            "layer_backward_s": e.layer.backward,
            "layer_recompute_s": e.layer.recompute,
            "layer_offload_s": e.layer.offload,
            "layer_prefetch_s": e.layer.prefetch,
            "tp_mode": self.layout.tp_mode,
            "pp": self.layout.pp,
            "vpp": self.layout.vpp,
            "schedule": self.schedule,
            "batch": self.batch,
            "global_batch": self.global_batch,
            "micro_batch": self.micro_batch,
            "micro_batches": self.micro_batches,
            "binding": binding_words(self),
        }
        if self.folded:
            d["folded"] = list(self.folded)
        if self.pipeline is not None:
            d["pipeline"] = dict(self.pipeline)
        if self.sppo is not None:
            d["sppo"] = dict(self.sppo)
            d["policy_label"] = self.policy.label()
        if self.simulated is not None:
            d.update({f"simulated_{k}": v for k, v in self.simulated.items() if k != "status"})
            d["simulated_status"] = self.simulated["status"]
        return d

    def to_plan(self) -> Plan:
        """This candidate's plan.json, memory plan included: `memo_sim.search.plan_build.build_plan`,
        the one function `memo-sim whatif` writes its plans by, naming the framework its search was for (a review:
        a --framework megatron answer's ``best.to_plan()`` named ``any``, where the command's plan names megatron)."""
        plan = build_plan(self)
        return plan if plan.framework == self.framework else replace(plan, framework=self.framework)


@lru_cache(maxsize=1 << 16)
def _layout_dict(layout: Layout) -> dict:
    """`Layout.to_dict` once per layout (a query's tens of thousands of candidates share a few
    thousand layouts; its fields are scalars, so callers take a shallow copy)."""
    return layout.to_dict()


def need_of_capacity(need: float, capacity: float, what: str = "", need_what: str = "") -> str:
    """``need`` (``need_what`` after it) of ``capacity`` (``what`` after it) in words, with digits enough to tell
    the two apart: a need over the capacity is never printed as equal to it (a review: pinned host memory of
    1680 GiB against 1676.4 GiB usable read "1.64 TiB of 1.64 TiB"); where the two round alike at two decimals,
    more are printed and the excess is named. maxseq's words and the what-if's take it from here."""
    from memo_sim.units import fmt_bytes

    a, b = fmt_bytes(need), fmt_bytes(capacity)
    over = ""
    if a == b and need != capacity:
        unit, size = _unit_of(max(abs(need), abs(capacity)))
        for digits in range(3, 7):
            a, b = f"{need / size:.{digits}f} {unit}", f"{capacity / size:.{digits}f} {unit}"
            if a != b:
                break
        if need > capacity:
            over = f", {fmt_bytes(need - capacity)} over"
    return f"{a}{' ' + need_what if need_what else ''} of {b}{' ' + what if what else ''}{over}"


def _unit_of(n: float) -> tuple[str, float]:
    """The unit `memo_sim.units.fmt_bytes` prints ``n`` bytes in, and its size."""
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return unit, float(size)
    return "B", 1.0


# `memo_sim.search.pipeline.pipeline_host_words`, registered there at import: a micro-batch pipeline candidate is
# built only by that module, which imports this one (so no import back: `tests/test_import_direction.py`)
PIPELINE_HOST_WORDS: dict = {}


def host_memory_words(c: Candidate) -> str:
    """Pinned host memory of a candidate in words, from the numbers its pricing counts: a single stage's offloaded
    layers x GPUs x pinned bytes per layer, a micro-batch pipeline's (layer, micro-batch) units in flight per stage
    x pinned bytes per unit (`memo_sim.search.pipeline.pipeline_host_words`), an SPPO plan's pinned bytes per stage
    GPU over its (subsequence, layer) units (`_sppo_host_words`), against the node's usable memory, and how much the host
    layout's rounding adds to the raw bytes."""
    from memo_sim.units import fmt_bytes

    m = c.memory
    if m.host_bytes_per_node <= 0:
        return "nothing is offloaded to host memory"
    if c.sppo is not None:
        return _sppo_host_words(c) + _hosts_words(c, min(c.layout.gpus, c.profile.node_gpus))
    if c.layout.pp > 1 and c.pipeline is not None:
        # the words of the module that prices micro-batch pipelines (it imports this one and registers them)
        return PIPELINE_HOST_WORDS["words"](c)
    # a single stage: every GPU holds the model's layers, the first n_off of them offloaded
    # (a review: pipelines and SPPO were given this template, "30 offloaded layers x 8 GPUs", their totals / 240)
    n_off = c.policy.offloaded_layers(c.model.layers)
    if n_off == 0:  # no activation offloaded, yet pinned bytes (the optimizer's states on the host): the total
        return need_of_capacity(m.host_bytes_per_node, m.host_capacity_bytes, "usable per node", "pinned")
    from memo_sim.cost.optimizer_offload import host_state_bytes
    from memo_sim.cost.param_split import model_gpu_params

    gpus = min(c.layout.gpus, c.profile.node_gpus)
    optim = host_state_bytes(c.model, c.layout, model_gpu_params(c.model, c.layout))  # under optimizer offload
    raw = (m.host_bytes_per_gpu - optim) / n_off
    pinned = (m.host_bytes_per_node - gpus * optim) / (gpus * n_off)
    words = (f"{n_off} offloaded layers x {gpus} GPUs x {fmt_bytes(pinned)} pinned per layer"
             + (f" + {gpus} GPUs' optimizer states of {fmt_bytes(optim)}" if optim > 0 else "")
             + f" = {need_of_capacity(m.host_bytes_per_node, m.host_capacity_bytes, 'usable per node')}")
    words += _hosts_words(c, gpus)
    return words + _rounding_words(c, raw, pinned, "layer")


def _hosts_words(c: Candidate, gpus: int) -> str:
    """Which hosts of the node the pinned bytes sit on, where a node has several (GB200 NVL72)."""
    from memo_sim.units import fmt_bytes

    m = c.memory
    used, hosts = c.profile.hosts_taken(gpus)
    if used < hosts:  # a node of several hosts (GB200 NVL72): the memory of the hosts the plan's GPUs take
        return (f" (the {used} of the node's {hosts} hosts of {c.profile.host_gpus} GPUs that its {gpus} GPUs take, "
                f"{fmt_bytes(m.host_capacity_bytes / used)} usable each)")
    if hosts > 1:  # every host of the node: the pinned bytes are each host's GPUs' own, spread evenly
        return (f" (the node's {hosts} hosts of {c.profile.host_gpus} GPUs, "
                f"{fmt_bytes(m.host_bytes_per_node / hosts)} of {fmt_bytes(m.host_capacity_bytes / hosts)} usable "
                f"on each)")
    return ""


def _rounding_words(c: Candidate, raw: float, pinned: float, unit: str) -> str:
    """How much the host layout's rounding adds to one ``unit``'s ``raw`` bytes (``pinned`` after it), where it does."""
    from memo_sim.units import fmt_bytes

    if raw > 0 and pinned > raw * 1.01:
        return (f"; {c.layout.host_pool} with {c.profile.host.pinned_rounding} rounding turns "
                f"{fmt_bytes(raw)} of activations per {unit} into {fmt_bytes(pinned)} pinned "
                f"({pinned / raw:.2f}x)")
    return ""


def _sppo_host_words(c: Candidate) -> str:
    """An SPPO plan's pinned host memory in words, from the numbers `memo_sim.memplan.footprint.sppo_memory` prices it
    by (`sppo_host_stages`): on the fullest node, each stage GPU's pinned bytes over its (subsequence, layer) units,
    all but its last `KEPT_LAYERS` offloaded at their subsequence's alpha (K/V kept on the GPU), and what that is
    per layer of the whole sequence."""
    from memo_sim.layout.parallel import node_stage_gpus
    from memo_sim.memplan.footprint import sppo_host_stages
    from memo_sim.units import fmt_bytes

    m = c.memory
    per_stage = sppo_host_stages(c.model, c.layout, c.batch, c.policy, c.profile)
    node = max(node_stage_gpus(c.layout, c.profile.node_gpus).values(),
               key=lambda per: sum(n * per_stage[s][3] for s, n in per.items()))
    groups: list[list] = []  # consecutive stages with the same numbers, said once
    for s, n in sorted(node.items()):
        key = (n, *per_stage[s])
        if groups and groups[-1][1] == key and groups[-1][0][-1] == s - 1:
            groups[-1][0].append(s)
        else:
            groups.append([[s], key])
    parts = []
    for stages, (n, n_l, n_k, n_off, pinned) in groups:
        if pinned <= 0:
            continue
        which = (f"stage {stages[0]}" if len(stages) == 1 else f"stages {stages[0]}-{stages[-1]}") + (
            f" ({n} GPU{'s' if n > 1 else ''}{' each' if len(stages) > 1 else ''})")
        per_layer = pinned / n_off * n_k if n_off else 0.0
        parts.append(f"{which} x {fmt_bytes(pinned)} pinned per GPU ({n_l} "
                     f"layers x {n_k} subsequence pieces: {n_off} of the {n_l * n_k} units offloaded, "
                     f"{fmt_bytes(per_layer)} per layer of the whole sequence)")
    total = need_of_capacity(m.host_bytes_per_node, m.host_capacity_bytes, "usable per node")
    return " + ".join(parts) + f" = {total}"


def binding_words(c: Candidate) -> str:
    """Why a candidate stops where it does, in words: what runs out (GPU or pinned host memory,
    with the terms that fill it), or which limit fixed MEMO's alpha."""
    from memo_sim.units import fmt_bytes, fmt_time

    m = c.memory  # the estimate read only where the words use it (a deferred candidate stays unpriced)
    if c.status == "OOM" or (c.simulated is None and m.status == "OOM"):
        if c.simulated and c.simulated.get("failure"):
            f = c.simulated["failure"]
            return (f"GPU memory: {f['tensor']} needs {fmt_bytes(f['requested_bytes'])} with "
                    f"{fmt_bytes(f['in_use_bytes'])} of {fmt_bytes(f['capacity_bytes'])} in use (simulated)")
        t = memory_term_words(m)  # the peak holds the larger of a layer's side and the classifier's
        layer = m.layer_side_bytes()
        rec = (f", its recompute buffer {fmt_bytes(t['recompute buffer'])}" if "recompute buffer" in t else "")
        last = (f"the classifier and loss {fmt_bytes(t['classifier'])} (above a layer's transients and "
                f"input{' and recompute buffer' if m.backward_buffer_bytes else ''}, {fmt_bytes(layer)})"
                if "classifier" in t else f"transients {fmt_bytes(t['transients'])}, the layer's input "
                f"{fmt_bytes(t['layer input'])}{rec}")
        # the status names the GPU only; a plan over the pinned host memory as well says so, or more GPU memory
        # would read as the fix (a review: "OOM +7.88 GiB" with 2.74 TiB pinned per node of 1.64 TiB)
        host = f"; pinned host memory too: {host_memory_words(c)}" if m.oohm_by > 0 else ""
        return (f"GPU memory: peak {need_of_capacity(m.peak_gpu_bytes, m.gpu_capacity_bytes, 'usable')} "
                f"(model states {fmt_bytes(t['model states'])}, kept activations "
                f"{fmt_bytes(t['kept activations'])}"
                + (f", attention lse {fmt_bytes(t['attention lse'])}" if "attention lse" in t else "")
                + f", buffers {fmt_bytes(t['buffers'])}, {last})" + host)
    if c.status == "OOHM":
        return "pinned host memory: " + host_memory_words(c)
    if c.policy.takes_alpha and c.layout.pp == 1 and offloaded_layer_count(c.model.layers) == 0:
        kept = (f"of {c.model.layers} layers the last {KEPT_LAYERS}" if c.model.layers > KEPT_LAYERS
                else f"all {c.model.layers} layer{'s' if c.model.layers > 1 else ''}")
        return (f"alpha {c.policy.alpha:.3f} offloads nothing here: {kept} stay on the GPU (the rounding buffers' "
                f"last {KEPT_LAYERS}), so no layer is offloaded; " + gpu_memory_words(c))
    if c.policy.takes_alpha and c.alpha_note:
        if "host memory" in c.alpha_note:
            # the solver fills the analytic count up to the usable memory; where the simulated iteration pins less
            # (a pipeline's analytic count holds every unit in flight at once), the host is not full and is not
            # said to be (a review: "host memory full" beside "pinned host 1.58 TiB (simulated) of 1.64 TiB")
            host = c.host_bytes_per_node
            if c.simulated is not None and host < m.host_bytes_per_node:
                return (f"alpha {c.policy.alpha:.3f}: set by the host memory on the analytic count -- "
                        f"{host_memory_words(c)}; the simulated iteration pins at most "
                        f"{need_of_capacity(host, m.host_capacity_bytes, 'usable per node')} "
                        f"({100 * host / m.host_capacity_bytes:.0f}%)" + gpu_headroom_words(c, full=False))
            return f"alpha {c.policy.alpha:.3f}: host memory full -- {host_memory_words(c)}" + gpu_headroom_words(c)
        if "offload time" in c.alpha_note:
            e = c.estimate
            return (f"alpha {c.policy.alpha:.3f}: the offload of one layer ({fmt_time(e.layer.offload)}) "
                    f"hides under its forward ({fmt_time(e.layer.forward)}); more would stall compute")
        return f"alpha {c.policy.alpha:.3f}: {c.alpha_note}"
    return gpu_memory_words(c)


def memory_term_words(m) -> dict[str, float]:
    """The terms of a `MemoryBreakdown`'s peak by the names the what-if's and maxseq's words give them: what both sides
    hold (model states, kept activations, the static buffers), then the side that makes the peak
    (`MemoryBreakdown.peak_with`): the classifier and loss, or a layer's transients, its input and the recompute
    buffer. The recompute buffer (``backward_buffer_bytes``) is live beside a layer's backward only, so it is not a
    buffer of a classifier peak (a review: maxseq named "classifier 71.95 GiB, buffers 13.50 GiB" above an 80.74 GiB
    peak, the what-if 1.50 GiB of buffers for the same plan). The one list both commands name terms from."""
    # the attention lse a term of its own, as explain names it (a review: 'kept activations 1.25 GiB' here where
    # explain showed kept 0 B and the lse 1.25 GiB)
    held = {"model states": m.model_states_bytes, "kept activations": m.skeletal_resident_bytes,
            "attention lse": m.lse_bytes, "buffers": m.rounding_buffer_bytes - m.backward_buffer_bytes}
    held = {k: v for k, v in held.items() if v or k != "attention lse"}
    if m.classifier_peak_bytes > m.layer_side_bytes():
        return {**held, "classifier": m.classifier_peak_bytes}
    side = {"transients": m.transient_peak_bytes, "layer input": m.layer_boundary_bytes}
    if m.backward_buffer_bytes:
        side["recompute buffer"] = m.backward_buffer_bytes
    return {**held, **side}


def gpu_headroom_words(c, full: bool = True) -> str:
    """For a MEMO plan whose alpha the host memory binds: why the GPU memory left free does not raise it, and what a
    full host (``full``; else the host's bound) means (by design, not a risk of failing), where a tenth or more of
    the GPU is free."""
    from memo_sim.units import fmt_bytes

    m = c.memory
    free = m.gpu_capacity_bytes - c.peak_gpu_bytes
    if free < 0.1 * m.gpu_capacity_bytes:
        return ""
    return (f"; the GPU keeps {fmt_bytes(free)} free, which does not raise alpha: MEMO offloads every layer but the "
            f"last {KEPT_LAYERS} (the paper's scheme; keeping more layers whole on the GPU is not modelled) and "
            f"recomputes the tokens the host cannot hold; {'a full host' if full else 'the host bound'} is by design "
            f"(less host memory lowers alpha, the plan still fits)")


def replayed_reserved_bytes(allocator: dict | None) -> float:
    """The caching allocator replay's reserved peak (``torch.cuda.max_memory_reserved()``: the allocated bytes and
    the cache the allocator holds beside them, `memo_sim.engine.result.allocator_summary`), or 0 where none ran (a
    pipeline's summed allocations: ``replayed`` False); a static memory plan's replay too (its arena one request, the
    rest the caching allocator's: `memo_sim.memplan.iteration_replay.engine_replay`)."""
    a = allocator or {}
    if a.get("replayed") is False or "peak_reserved_bytes" not in a:
        return 0.0
    return float(a.get("peak_reserved_bytes") or 0.0)


def deciding_gpu_peak(peak_bytes: float, allocator: dict | None) -> tuple[float, bool]:
    """The GPU peak that decides fit, and whether it is the replay's reserved one: the higher of the peak and the
    replay's reserved peak (`replayed_reserved_bytes`). A plan fits where both hold (the peak within the GPU, and
    the replay finding room for every request), as explain says (`memo_sim.cli.explain._decides_words`); a review
    found "GPU memory 73% full" beside a reserved peak at 100% of the usable memory. The what-if's words, explain's
    binding line and the answer's margin line take it from here."""
    reserved = replayed_reserved_bytes(allocator)
    return (reserved, True) if reserved > peak_bytes else (peak_bytes, False)


def deciding_peak_words(peak_text: str, peak_bytes: float, allocator: dict | None, capacity: float) -> str:
    """``GPU memory N% full (...)`` of the deciding peak (`deciding_gpu_peak`): the replay's reserved peak named as
    such, with the replay's allocated peak (``torch.cuda.max_memory_allocated()``) and the simulator's own peak
    (``peak_text``, its source named) beside it where the reserved one decides."""
    from memo_sim.units import fmt_bytes

    use, reserved = deciding_gpu_peak(peak_bytes, allocator)
    if not reserved:
        return f"GPU memory {100 * use / capacity:.0f}% full ({peak_text} of {fmt_bytes(capacity)}"
    # a review: "the allocated peak" here named the simulator's own high-water mark (73.51 GiB), while check-plan
    # gave torch.cuda.max_memory_allocated() as the replay's allocated peak (69.42 GiB): two numbers, one name
    allocated = (allocator or {}).get("peak_allocated_bytes")
    replay = f"; {fmt_bytes(allocated)} allocated at most" if allocated else ""
    return (f"GPU memory {100 * use / capacity:.0f}% full (PyTorch's reserved peak {fmt_bytes(use)} (simulated, "
            f"caching allocator replay{replay}) of {fmt_bytes(capacity)}, the higher of it and the simulator's own "
            f"peak (each phase's tensors one block) {peak_text}, so the one that decides fit")


def gpu_memory_words(c) -> str:
    """How full a fitting candidate's GPU memory is (the deciding peak, `deciding_peak_words`), and its largest
    term, in words."""
    from memo_sim.units import fmt_bytes

    m = c.memory
    peak, host = c.peak_gpu_bytes, c.host_bytes_per_node  # the candidate's own tier
    terms = memory_term_words(m)
    big = max(terms, key=terms.get)
    alloc = (c.simulated or {}).get("allocator") if c.simulated and c.simulated.get("peak_gpu_bytes") else None
    words = (deciding_peak_words(fmt_bytes(peak), peak, alloc, m.gpu_capacity_bytes)
             + f"; largest term {big} {fmt_bytes(terms[big])})")
    if host > 0:
        words += f"; pinned host memory {100 * host / m.host_capacity_bytes:.0f}% full"
    return words
