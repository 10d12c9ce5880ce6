"""What one MoE block (`memo_exec.moe.block`) keeps on its rank's device from its forward to its backward,
in bytes, known before anything runs: the activation policies add it to their ``skeletal_resident``
(`memo_exec.activations.base.ActivationPolicy.moe_kept_bytes`), which the memory estimate
(`memo_exec.memory_estimate`, the distributed runner's) and the fit check read.

Every policy keeps each MoE layer's routing (`routing_bytes`: ``idx`` [T, k] int64; under a capacity factor
also the copies the experts computed, ``src`` and ``exp`` [N] int64 each, `memo_exec.moe.capacity`). A layer whose
block keeps
its autograd graph (store all, selective recompute, MEMO's kept layers, recompute_norm_act but its ``eact``:
``LayerStorage.keep_moe_internals``) also keeps what the graph saved (`graph_bytes`), with T the rank's own rows (its sequence shard), k the top-k, e
the model dtype's bytes, R the copies its local experts received (T*k on average over the EP group: each rank
sends T*k and receives its share of the group's; the estimate takes the average, where the simulator prices the
busiest rank, `memo_sim.cost.activations.routed_load`; under a capacity factor every rank sends and receives
exactly N = E x its capacity, its copies taking the place of the T*k routed ones below, each sent as a token of one
choice) and p the TP size (the shared experts run on the TP group's T*p gathered rows at 1/p of their width):

- ``probs``: the router's scores [T, E] (softmax or sigmoid output, model dtype; the simulator: fp32);
- ``route_weights``: the chosen scores [T, k] and their sum [T, 1] (the normalisation's operands; a router that
  does not normalise, Llama 4's, keeps none);
- ``copy_probs``: each received copy's router weight [R] (the experts' weighted activation keeps it, or the
  multiply of a router weighting the experts' input, Llama 4's);
- ``moe_in``: the received copies [R, h]; ``efc1``: [R, expert fc1]; ``eact``: [R, expert width];
- ``moe_in_w``: under a router weighting the experts' input, the weighted copies [R, h] the first GEMM keeps
  (``moe_in`` then kept by the multiply, for its weight's gradient; the simulator's names);
- ``copy_order``: the row permutations the gathers' backwards read, int64: the sort of the copies and its
  inverse [T*k] each, and the all-to-all dispatcher's regrouping by local expert and its inverse [R] each
  (one process's local dispatcher has no regrouping: 16 bytes per copy fewer than counted; the all-gather
  dispatcher keeps its selection of the copies and their token rows, [R] each, and no sort: 16 T k bytes fewer;
  the deepep dispatcher keeps its pairs' token index [P] and slot mask [P, k] (P the (token, rank) pairs it
  sends, at most T k) and its copies' received rows and slots [R] each, in place of the sort's permutations:
  not counted exactly);
- under expert tensor parallelism (etp q > 1, `memo_exec.moe.etp`) the experts run the ETP group's copies, q R
  of them, on a 1/q slice of their width: ``copy_probs`` [q R], ``moe_in`` [q R, h] (and ``moe_in_w``, weighted
  after the gather), ``efc1`` [q R, expert fc1 / q],
  ``eact`` [q R, expert width / q], and ``copy_order`` adds the gather's selection [q R] int64 (the allgather
  dispatcher's selection over the ETP x EP group is [q R] already: counted once, 8 q R bytes more than it keeps);
- ``sfc1`` [T*p, shared fc1 / p], ``sact`` [T*p, shared / p]; with a shared-expert gate also ``sfc2`` (the
  shared output [T, h]) and the gate's sigmoid [T, 1].

Not kept: the block's output (the layer copies it out and the block frees its storage; the ops that made it, a
sum and an add, save no output), ln2 (the policy's own tensor; with p > 1 the shared experts' first GEMM keeps
it and not its all-gathered rows, which its backward gathers again, `memo_exec.moe.comm.sp_gather_linear`), the
weights (model states), a grouped GEMM's offsets (El int32) and the all-to-alls' split sizes (host lists).
"""

from __future__ import annotations

from memo_exec.moe.capacity import copies_of
from memo_sim.model.config import ModelConfig

INDEX_BYTES = 8  # int64 routing and permutations


def routing_bytes(model: ModelConfig, tokens: int, capacity: float | None = None) -> int:
    """The routing every policy keeps for one MoE layer (``idx`` [T, k] int64; under ``capacity`` also the copies'
    ``src`` and ``exp``)."""
    kept = 0 if capacity is None else 2 * copies_of(tokens, model.top_k, model.experts, capacity)
    return (tokens * model.top_k + kept) * INDEX_BYTES


def graph_bytes(model: ModelConfig, tokens: int, esize: int, tp: int = 1, routed: int | None = None,
                capacity: float | None = None, etp: int = 1) -> dict[str, int]:
    """The tensors one MoE layer's kept autograd graph holds on one rank, by name (module docs), besides the
    routing: ``tokens`` the rank's own rows, ``esize`` the model dtype's bytes, ``tp`` the TP size, ``routed``
    the copies the rank's experts received (default: the EP group's average, the copies a rank sends), ``capacity``
    the layout's capacity factor (None: none), ``etp`` the expert tensor-parallel size."""
    T, k, h = tokens, model.top_k, model.hidden
    sent = copies_of(T, k, model.experts, capacity)
    R = sent if routed is None else routed
    G = R * etp  # the copies the experts run: the ETP group's
    router = model.moe_router
    out = {"probs": T * model.experts * esize, "copy_probs": G * esize,
           "moe_in": G * h * esize, "efc1": G * (model.expert_fc1_width // etp) * esize,
           "eact": G * (model.expert_width // etp) * esize,
           "copy_order": (2 * sent + 2 * R + (G if etp > 1 else 0)) * INDEX_BYTES}
    if router.normalised:
        out["route_weights"] = (T * k + T) * esize
    if router.weights_input:
        out["moe_in_w"] = G * h * esize
    sw = model.shared_width
    if sw:
        rows = T * tp
        out["sfc1"] = rows * (model.fc1_of(sw) // tp) * esize
        out["sact"] = rows * (sw // tp) * esize
        if model.shared_gate:
            out["sfc2"] = T * h * esize
            out["shared_gate"] = T * esize
    return out


def layer_kept_bytes(model: ModelConfig, tokens: int, esize: int, tp: int, keeps_graph: bool,
                     capacity: float | None = None, etp: int = 1, rebuilt: tuple[str, ...] = ()) -> int:
    """One MoE layer's kept bytes on one rank: the routing, plus the graph's tensors where ``keeps_graph`` but those
    ``rebuilt`` for the backward instead (``eact`` under recompute_norm_act)."""
    graph = sum(v for n, v in graph_bytes(model, tokens, esize, tp, capacity=capacity, etp=etp).items()
                if n not in rebuilt) if keeps_graph else 0
    return routing_bytes(model, tokens, capacity) + graph
