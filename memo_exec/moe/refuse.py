"""What the executor cannot run of a mixture-of-experts plan or of the newer attention variants:
one line naming the field (`memo_exec.runner.run_model` raises it as an `ExecError`, exit 2,
before anything is allocated). The simulator prices all of these; the executor builds:

- routed experts with expert parallelism ``ep`` over the ``alltoall`` dispatcher, ``etp`` = 1
  (each expert's FFN whole on one rank), dropless routing over every expert (no router groups, no
  output scaling);
- multi-head / grouped-query attention, with any head size (``head_dim``) and QK norms (Qwen3's RMSNorm
  over each query and key head, `memo_exec.layer.HeadNorms`; full METP's head-group rings refuse both,
  `memo_exec.metp.flavour.FULL_METP_ARCHITECTURE`).
"""

from __future__ import annotations

from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig

EXEC_DISPATCHERS = ("alltoall",)


def attention_why_not(model: ModelConfig) -> str | None:
    m = model
    for field_, on, what in (("kv_lora_rank", m.kv_lora_rank, "multi-head latent attention"),
                             ("attention_sinks", m.attention_sinks, "attention sinks"),
                             ("sliding_window", m.sliding_window, "sliding-window attention")):
        if on:
            return (f"plan model {m.name}: {field_} = {on!r}: the executor does not build {what} yet (the simulator "
                    f"prices it); plan a model without it to run")
    return None


def moe_why_not(model: ModelConfig, layout: Layout) -> str | None:
    """Why the executor cannot run this MoE model under ``layout`` (None: it can, or it is dense)."""
    why = attention_why_not(model)
    if why or not model.moe:
        return why
    lab = layout.label()
    if model.router_groups:
        return (f"plan model {model.name}: router_groups = {model.router_groups}: the executor routes over every "
                f"expert (group-limited routing not built; the simulator prices it); plan a model without router "
                f"groups to run")
    if model.router_scaling != 1.0:
        return (f"plan model {model.name}: router_scaling = {model.router_scaling}: the executor does not scale the "
                f"routed experts' output; plan a model with router_scaling 1 to run")
    if layout.etp > 1:
        return (f"plan layout {lab}: etp = {layout.etp}: the executor keeps each expert's FFN whole on one rank "
                f"(expert tensor parallelism not built); plan with etp 1")
    if layout.moe_dispatcher not in EXEC_DISPATCHERS:
        return (f"plan layout {lab}: moe_dispatcher = {layout.moe_dispatcher!r}: the executor runs "
                f"{', '.join(EXEC_DISPATCHERS)} only; plan with moe_dispatcher alltoall")
    if not layout.balance.drops_none:  # measured loads are a dropless router's
        return (f"plan layout {lab}: moe_balance = {layout.moe_balance!r}: the executor routes dropless only (no forced "
                f"balancing, no capacity dropping); plan with moe_balance dropless")
    if layout.tp_mode != "megatron" and layout.tp > 1:
        return f"plan layout {lab}: tp_mode = {layout.tp_mode!r}: MoE layers run Megatron TP only; plan with tp_mode megatron"
    if layout.tp > 1 and not layout.sp:
        return (f"plan layout {lab}: sp = False: a MoE layer with tp > 1 routes each rank's sequence shard; "
                f"plan with sequence parallelism")
    if layout.ulysses > 1:
        return f"plan layout {lab}: ulysses = {layout.ulysses}: MoE layers with Ulysses are not built; plan with ring CP"
    if model.experts % layout.ep:
        return f"plan layout {lab}: ep = {layout.ep} does not divide the {model.experts} experts"
    stage = layout.tp * layout.cp * layout.ulysses * layout.dp
    if stage % (layout.ep * layout.etp):
        return f"plan layout {lab}: ep x etp = {layout.ep * layout.etp} does not divide the {stage} GPUs of a stage"
    if model.shared_width % layout.tp:
        return f"plan layout {lab}: tp = {layout.tp} does not divide the shared-expert width {model.shared_width}"
    return None
