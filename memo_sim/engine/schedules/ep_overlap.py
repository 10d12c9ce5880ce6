"""Megatron-Core's expert-parallel all-to-all overlap in the micro-batch pipelines (`Layout.ep_overlap`:
``--overlap-moe-expert-parallel-comm`` with ``--delay-wgrad-compute``): the order, and each merged step's layers
cut where the token dispatcher's collectives run.

What Megatron-LM runs (read at d98e8a64):

- **Order.** One more warm-up forward than the schedule's own (megatron/core/pipeline_parallel/schedules.py
  ``get_pp_rank_microbatches``: 'we schedule one extra micro-batch forward step before the 1f1b stages ... to
  ensure the forward and backward computations are independent in all 1f1b steps'; beside pipeline stages it
  needs virtual ones, transformer_config.py asserts it); without pipeline stages
  ``combined_1f1b_schedule_for_no_pipelining`` runs the first micro-batch's forward, then each next forward beside
  the backward of the one before, then the last backward. `with_extra_warmup` makes either from a schedule's own
  order: every rank's forwards and backwards keep their sequence, the steady state starts one forward later.
- **Merged step.** Each steady-state forward step and the backward step after it in the order run as one
  (pipeline_parallel/combined_1f1b.py, models/common/model_chunk_schedule_plan.py
  ``TransformerModelChunkSchedulePlan.run``): the forward's layer i beside the backward's layer n-1-i, each pair
  (``TransformerLayerSchedulePlan.run``) issued as::

      comm stream:  combine bwd       | dispatch fwd -> dispatch bwd        | combine fwd
      comp stream:  attention... fwd  | experts bwd -> experts dW -> experts fwd | attention... bwd

  so one micro-batch's dispatch and combine all-to-alls run beside the other's compute, on two CUDA streams
  (CUDA_DEVICE_MAX_CONNECTIONS 32). The expert GEMMs' weight gradients wait until the dispatch's backward has
  been issued (``delay_wgrad_compute``: ``mlp.backward_dw`` after the data gradients), so that all-to-all leaves
  after the data gradients alone.

In memo each layer's op chain (`memo_sim.cost.layer_time`) is cut at its dispatcher's collectives (`split_layer`:
``pre`` up to the dispatch, the norms, attention, router, shared experts and permute; ``dispatch``; ``mlp``, the
routed experts; ``combine``; ``post``, unpermute and the residual; the backward's chain holds the same segments in
reverse), and the builder (`memo_sim.engine.schedules.microbatch`) issues the two layers' segments in the order
above (`PAIR_ORDER`); every stream runs its ops in issue order, so nothing else is needed for the overlap to happen
where the dependencies let it. The backward's expert GEMMs are split into their data- and weight-gradient halves
(`delay_weight_grads`: the backward of a GEMM is two kernels of the forward's size, `memo_sim.cost.moe`). The
forward's ``post`` segment runs on the compute stream as the next pair starts (Megatron runs unpermute and the
residual add inside its combine node, on the communication stream: a few element-wise kernels); the backward's
``post`` before its combine.

The SMs the all-to-all kernels hold while the other micro-batch computes beside them slow its kernels
(`memo_sim.cost.comm_sms`: DeepEP's ``moe_flex_dispatcher_num_sms``, 20 by default; NCCL's channels for
alltoall). Not modelled: their wave quantisation and HBM traffic; the first backward layer's attention and shared-expert weight gradients, which
Megatron-LM delays past the step's pipeline send (model_chunk_schedule_plan.py; memo sends after them); what
CUDA_DEVICE_MAX_CONNECTIONS 32 (the overlap's) does to TP's and CP's own overlaps, which Megatron-LM warns of on
Hopper (training/arguments.py); CUDA graphs of the merged steps.
"""

from __future__ import annotations

from typing import Callable

from memo_sim.cost.opcost import OpCost
from memo_sim.cost.layer_time import backward_kernels

FWD_SEGMENTS = ("pre", "dispatch", "mlp", "combine", "post")  # a forward chain's segments, in chain order
BWD_SEGMENTS = ("post", "combine", "mlp", "dispatch", "pre")  # a backward chain's, in chain order
# the issue order of one layer pair (module docs): (which step, segment); the backward's "mlp_dw" is its expert
# GEMMs' weight gradients, the forward's "post" is issued as the next pair starts (or after the last pair)
PAIR_ORDER = (("B", "post"), ("B", "combine"), ("F", "pre"), ("B", "mlp"), ("F", "dispatch"), ("B", "mlp_dw"),
              ("B", "dispatch"), ("F", "mlp"), ("F", "combine"), ("B", "pre"))
DISPATCH, COMBINE = "moe_dispatch", "moe_combine"  # the dispatcher's collectives' names start so (`memo_sim.cost.moe`)


def _run(costs: list[OpCost], prefix: str) -> tuple[int, int] | None:
    """(start, end) of the first run of ops whose names start with ``prefix``; None where there is none."""
    start = next((i for i, c in enumerate(costs) if c.name.startswith(prefix)), None)
    if start is None:
        return None
    end = start
    while end < len(costs) and costs[end].name.startswith(prefix):
        end += 1
    return start, end


def split_layer(costs: list[OpCost], backward: bool) -> dict[str, list[OpCost]] | None:
    """A MoE layer's forward (or ``backward``) chain cut into its segments (module docs); None where the chain has
    no dispatch and combine collective (a layer the dispatcher moves nothing for: one expert rank)."""
    first, second = (COMBINE, DISPATCH) if backward else (DISPATCH, COMBINE)
    a = _run(costs, first)
    b = _run(costs, second)
    if a is None or b is None or b[0] < a[1]:
        return None
    names = BWD_SEGMENTS if backward else FWD_SEGMENTS
    parts = (costs[:a[0]], costs[a[0]:a[1]], costs[a[1]:b[0]], costs[b[0]:b[1]], costs[b[1]:])
    return dict(zip(names, parts))


def delay_weight_grads(mlp: list[OpCost]) -> tuple[list[OpCost], list[OpCost]]:
    """(data-gradient chain, weight-gradient chain) of a backward ``mlp`` segment: each GEMM's backward as its two
    kernels' halves (module docs), the other ops with the data gradients."""
    dgrad, wgrad = [], []
    for c in mlp:
        if c.kind == "gemm" and c.stream == "compute":
            d, w = backward_kernels(c, "_dgrad")
            dgrad.append(d)
            wgrad.append(w)
        else:
            dgrad.append(c)
    return dgrad, wgrad


def _split(order: Callable, pp: int, micro_batches: int, vpp: int, rank: int) -> tuple[list, list, int]:
    """A rank's forwards and backwards under ``order``, each in their own sequence, and its warm-up forwards with
    the overlap's one more (at most every forward): the schedule's warm-up is the forwards before its first
    1F1B pair, so with one more the forwards before its first backward (a review: memo had counted the pair's
    forward as warm-up too, one micro-batch more in flight and one merged step less than Megatron-LM)."""
    steps = order(pp, micro_batches, vpp, rank)
    fwd = [st for st in steps if st.kind == "F"]
    bwd = [st for st in steps if st.kind == "B"]
    before_b = next((i for i, st in enumerate(steps) if st.kind == "B"), len(steps))  # the warm-up and one more
    return fwd, bwd, min(before_b, len(fwd))


def with_extra_warmup(order: Callable) -> Callable:
    """The order ``order`` gives, with one more warm-up forward on every rank (module docs): each rank's forwards and
    backwards in their own sequence, the first ``w + 1`` forwards (``w`` the schedule's warm-up, at most every
    forward) first, then one forward and one backward in turn (the steady state, `merged_pairs`), then the remaining
    backwards."""
    def extra(pp: int, micro_batches: int, vpp: int, rank: int) -> list:
        fwd, bwd, w = _split(order, pp, micro_batches, vpp, rank)
        out = fwd[:w]
        for i, f in enumerate(fwd[w:]):
            out += [f, bwd[i]]
        return out + bwd[len(fwd) - w:]

    extra.__name__ = f"{getattr(order, '__name__', 'order')}_ep_overlap"
    extra.__qualname__ = extra.__name__
    extra.base = order  # `merged_pairs` reads the schedule's own warm-up off it
    return extra


_EXTRA: dict[Callable, Callable] = {}
_MADE: set[Callable] = set()


def overlapped_order(order: Callable) -> Callable:
    """`with_extra_warmup` of ``order``, one function per order (the in-flight counts are memoised by it); an order
    it made already is returned as it is (the runner and the builder both ask)."""
    if order in _MADE:
        return order
    hit = _EXTRA.get(order)
    if hit is None:
        hit = _EXTRA[order] = with_extra_warmup(order)
        _MADE.add(hit)
    return hit


def merged_pairs(order: Callable, pp: int, micro_batches: int, vpp: int, rank: int) -> set[int]:
    """The positions ``i`` of rank ``rank``'s steps under ``order`` (an `overlapped_order`) whose forward step runs
    merged with the backward step at ``i + 1``: the steady state's, after the warm-up (Megatron-Core merges the 1F1B
    loop's steps alone, ``forward_k = k + num_warmup_microbatches`` beside backward k: where the warm-up holds every
    forward there is none, and the last warm-up forward before the first cool-down backward is not one)."""
    base = getattr(order, "base", None)
    if base is None:
        return set()
    fwd, _bwd, w = _split(base, pp, micro_batches, vpp, rank)
    return {w + 2 * i for i in range(len(fwd) - w)}


def pair_seconds(fwd: dict[str, float], bwd: dict[str, float], wgrad: float) -> float:
    """Seconds of one merged layer pair where every segment takes the seconds given (the critical times of the
    forward's and the backward's segments, ``wgrad`` the backward's delayed weight gradients), the two streams
    running the `PAIR_ORDER` issue order: the analytic tier's price of a merged pair (`memo_sim.search.estimate`)."""
    comp = comm = 0.0  # when each stream is free
    f = b = 0.0  # when each chain's last segment ended
    w_end = 0.0
    for step, seg in PAIR_ORDER:
        on_comm = seg in ("dispatch", "combine")
        if step == "F" and seg == "post":
            continue
        t = (fwd if step == "F" else bwd).get(seg, 0.0) if seg != "mlp_dw" else wgrad
        ready = f if step == "F" else b
        start = max(ready, comm if on_comm else comp)
        if seg == "mlp_dw":
            w_end = start + t
            comp = w_end
            continue
        end = start + t
        if on_comm:
            comm = end
        else:
            comp = end
        if step == "F":
            f = end
        else:
            b = max(end, w_end) if seg == "pre" else end
    post = fwd.get("post", 0.0)  # issued at the next pair's start, on the compute stream
    return max(comp, f, b) + post
