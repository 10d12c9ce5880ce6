"""Where a mixture-of-experts plan's layer time and GPU memory go (issue [moe] item 8): the
per-layer time split into attention, router, dispatch, experts, combine, shared experts and the
rest, forward and backward; and the memory split into the dense model states, the expert states
and the dispatcher's buffers beside the activations. A table for `memo-sim explain` and a figure
(``moe_split.png``) for `memo-sim simulate --out`; both read the cost model the simulator runs
(`memo_sim.cost.layer_time`, `memo_sim.cost.memory`), per GPU of the busiest expert rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from memo_sim.cost.activations import saved_bytes
from memo_sim.cost.layer_time import backward_costs, forward_costs
from memo_sim.cost.memory import model_state_parts
from memo_sim.cost.moe import dispatcher_buffer_bytes
from memo_sim.cost.opcost import base_op_name
from memo_sim.cost.sppo import stage_model_state_bytes
from memo_sim.layout.parallel import Layout, stage_shard, stage_shards
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import layer_tensors
from memo_sim.profile.schema import HardwareProfile

# the parts of a MoE layer's time, in the order a layer runs them; each op name maps to one
PARTS = ("attention", "router", "dispatch", "experts", "combine", "shared experts", "norms and adds", "other comm")
_ATTENTION = {"qkv", "q_down", "q_lnorm", "q_up", "q_proj", "kv_down", "kv_lnorm", "kv_up", "attention", "out_proj"}
_EXPERTS = {"permute", "weight_input", "expert_fc1", "expert_act", "expert_fc2", "unpermute"}


def part_of(name: str) -> str:
    """The part of the split an op (an `OpCost` name) belongs to."""
    name = base_op_name(name)  # async TP's GEMM parts (`memo_sim.cost.opcost`)
    if name.startswith("moe_dispatch"):
        return "dispatch"
    if name.startswith("moe_combine"):
        return "combine"
    if name in ("router", "route"):
        return "router"
    if name in _EXPERTS:
        return "experts"
    if name.startswith("shared_"):
        return "shared experts"
    if name in _ATTENTION or name.startswith(("cp_", "alltoall_")):
        return "attention"
    if name.startswith(("allgather_", "reducescatter_", "allreduce_")):
        return "other comm"
    return "norms and adds"


@dataclass(frozen=True)
class MoeSplit:
    label: str  # model, layout, tokens and the profile with its provenance (every number here is analytic)
    time_s: dict[str, dict[str, float]]  # phase (forward, backward) -> part -> seconds of one layer
    memory_bytes: dict[str, float]  # dense / expert states, dispatch buffers, one layer's saved expert / other activations
    states_of: str = ""  # a pipeline's: whose GPU the states are ("stage 7, the fullest of 8"), '' for one stage
    # a pipeline whose stages' groups sit differently: whose layer the times are ("stage 0"); '' where every stage's
    # layer is priced alike
    layer_of: str = ""


def moe_split(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile) -> MoeSplit:
    """One MoE layer's time by part (each op's own seconds, alone on the GPU; a pipeline's layer on stage 0's
    shard, the one the simulation prices stage 0's layers on, `memo_sim.layout.parallel.stage_shards`: where the
    stages' groups sit differently, stage 0's own, not the worst stage's) and one GPU's memory by part."""
    priced = stage_shards(layout, profile.node_gpus)[0] if layout.pp > 1 else layout
    own = layout.pp > 1 and priced != stage_shard(layout)  # stage 0's groups sit apart from another stage's
    time_s = {}
    for phase, costs in (("forward", forward_costs(model, priced, batch, seq, profile)),
                         ("backward", backward_costs(model, priced, batch, seq, profile))):
        parts = dict.fromkeys(PARTS, 0.0)
        for c in costs:
            parts[part_of(c.name)] += c.seconds
        time_s[phase] = parts
    where = of = ""
    if layout.pp > 1:  # a pipeline: the states of its fullest stage's GPU (each stage holds its own layers)
        stage = max(range(layout.pp), key=lambda s: stage_model_state_bytes(model, layout, s))
        states = stage_model_state_bytes(model, layout, stage)
        expert_states = stage_model_state_bytes(model, layout, stage, experts_only=True)
        of = f"stage {stage}, the fullest of {layout.pp}"
        where = f"; a layer of stage 0, states of {of}" if own else f"; states of {of}"
    else:
        states = sum(model_state_parts(model, layout).values())
        expert_states = sum(model_state_parts(model, layout, experts_only=True).values())  # each part its own share
    tens = layer_tensors(model, layout.tp_mode)
    tb = {n: saved_bytes(t, model, layout, batch, seq) for n, t in tens.items()}  # as the layer keeps them
    routed = sum(tb[n] for n, t in tens.items() if t.routed and t.saved)
    other = sum(tb[n] for n, t in tens.items() if t.saved and not t.routed and t.role != "lse")
    memory = {"dense states": round(states - expert_states), "expert states": round(expert_states),
              # the dispatcher's receive buffers of one layer (dispatch and combine; `memo_sim.memplan.trace_gen`)
              "dispatch buffers": sum(dispatcher_buffer_bytes(op, model, layout, batch, seq)
                                      for op in ("dispatch", "combine")),
              # what one layer saves for its backward (its policy keeps, offloads or rebuilds them)
              "expert activations (one layer)": routed,
              "other activations (one layer)": other}
    method = (profile.provenance or {}).get("method") or "source unstated"
    prof = f"{profile.name}, " + ("calibrated" if profile.calibrated else f"not calibrated ({method})")
    return MoeSplit(f"{model.name} {layout.label()}, {seq} tokens x {batch} ({prof}{where})", time_s, memory, of,
                    "stage 0" if own else "")


def moe_split_rows(split: MoeSplit) -> list[list[str]]:
    """(part, forward, backward, share) rows of the per-layer time, for a table."""
    from memo_sim.units import fmt_time

    total = sum(sum(p.values()) for p in split.time_s.values()) or 1.0
    rows = []
    for part in PARTS:
        f, b = split.time_s["forward"][part], split.time_s["backward"][part]
        if f or b:
            rows.append([part, fmt_time(f), fmt_time(b), f"{100 * (f + b) / total:.1f}%"])
    return rows


def moe_split_figure(split: MoeSplit, path: str | Path) -> Path:
    """Two panels: one layer's time by part (forward and backward bars), one GPU's memory by part."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from memo_sim.fileio import save_png

    fig = Figure(figsize=(12, 4.6))
    ax_t, ax_m = fig.subplots(1, 2)
    colours = dict(zip(PARTS, ("#4C72B0", "#8172B2", "#C44E52", "#DD8452", "#DA8BC3", "#55A868", "#937860", "#8C8C8C")))
    for i, phase in enumerate(("forward", "backward")):
        left = 0.0
        for part in PARTS:
            w = split.time_s[phase][part] * 1e3
            if w > 0:
                ax_t.barh(i, w, left=left, color=colours[part],
                          label=part if (i == 0 or split.time_s["forward"][part] == 0) else None)
                left += w
    ax_t.set_yticks([0, 1], ["forward", "backward"])
    ax_t.invert_yaxis()
    ax_t.set_xlabel("one MoE layer on one GPU (ms, analytic: each op alone)")
    ax_t.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4, frameon=False)
    names = list(split.memory_bytes)
    vals = [split.memory_bytes[n] / 2**30 for n in names]
    ax_m.barh(range(len(names)), vals, color=["#4C72B0", "#DD8452", "#C44E52", "#F1A340", "#55A868"][:len(names)])
    ax_m.set_yticks(range(len(names)), names, fontsize=8)
    ax_m.invert_yaxis()
    ax_m.set_xlabel("GPU memory (GiB, analytic)")
    for y, v in enumerate(vals):
        ax_m.text(v, y, f" {v:.2f}", va="center", fontsize=7)
    fig.suptitle(f"where a MoE layer's time and the GPU's memory go: {split.label}", fontsize=9)
    fig.subplots_adjust(left=0.08, right=0.96, wspace=0.75, bottom=0.3, top=0.88)
    FigureCanvasAgg(fig)
    return save_png(fig, path, dpi=120)
