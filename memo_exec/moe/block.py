"""The MoE FFN block of one layer (one rank's part of it), called by `memo_exec.layer.LayerCompute`
in place of fc1 / act / fc2 on a MoE layer: it reads the layer's ln2 and returns the block's output.

Math (plain PyTorch, autograd inside the block): gate GEMM ``ln2 @ router_w^T (+ router_b)``, the
model's router (`memo_exec.moe.routers`: scores, deterministic top-k, weights normalised where the model says so;
under a forced or random balance the experts are the routing's, `memo_exec.moe.balance`, from each row's position
in its sequence, `set_balance`, and the layer's index, and the router weighs them), the
dispatcher (`memo_exec.moe.dispatchers`: ``local``, or ``alltoall``, ``allgather`` or ``deepep`` over the
expert-parallel group; under a capacity factor each expert's copies, `memo_exec.moe.capacity`),
the local experts' GEMMs (`memo_exec.moe.experts`; under etp > 1 over the ETP group's gathered copies on this
rank's slice of each expert, `memo_exec.moe.etp`) with each copy's router weight applied inside
their activation (the weights travel with the copies: `Dispatcher.route_probs`), combine (back to the
token's rank, the sum of its k outputs), plus the shared experts (a dense FFN of the shared
width, Megatron TP-split with SP: all-gather in, reduce-scatter out; times ``sigmoid(ln2 @
shared_gate^T)`` with ``shared_gate``). Each rank routes its own local rows (its sequence shard).

What it keeps between forward and backward (the layer's activation policy decides through the
storage, `LayerStorage.keep_moe_internals`):

- always the routing, ``idx`` [T, top_k] int64 per layer (kept on the device like the attention
  lse), so the backward sends every token where the forward did, whatever the input's last bits (but a
  multi-token-prediction module's layer re-run whole, which routes its bit-identical ln2 again: `memo_exec.mtp`);
- store all: also the block's autograd graph (its internal activations, `memo_exec.moe.memory` counts
  them; not the block's output, whose storage is freed once the layer has it) from the forward, under
  every ZeRO stage. Under ZeRO 3 the graph's saved weights are views of the layer's flat buffer,
  whose storage `memo_exec.distributed.zero.GradSync` frees after the forward
  (``untyped_storage().resize_(0)``) and re-gathers in place before the backward (resized back, then
  all-gathered into the same storage), as FSDP's unshard does: the saved graph reads the re-gathered
  weights and nothing is re-run (the simulator prices no recompute there). The weights' version
  counters are their own (``.data`` set once to the views), so the in-place gather trips no
  saved-tensor check; `backward` refuses a kept graph whose weights are still freed;
- recompute_norm_act (Megatron's ``layernorm moe_act``): store all's graph but the routed experts' activation
  output, which their second GEMM rebuilds from fc1's output when its backward reads it
  (`memo_exec.moe.experts.rebuilt_act`), over ln2 in the policy's shared norm buffer, rebuilt before this layer's
  backward (the graph's leaf a second tensor over it with its own version counter, `_graph_leaf`);
- full recompute, recompute_moe and MEMO's offloaded layers: no internals: the backward re-runs the
  block's forward (all-to-alls included) from ln2 -- which the policy has restored by then, kept,
  reloaded or recomputed -- with the kept routing, then its backward (span ``moe_recompute``, phase
  ``recompute``).

The backward accumulates every block parameter's gradient into its ``.grad`` in place (autograd's
accumulation into an existing gradient) and returns d ln2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from memo_exec.moe.balance import routing_for
from memo_exec.moe.capacity import capacity_factor, padded_copies, sum_copies
from memo_exec.moe.comm import sp_gather_linear, sp_reduce_scatter
from memo_exec.moe.dispatchers import Dispatcher, LocalDispatcher
from memo_exec.moe.etp import ExpertTP
from memo_exec.moe.experts import act, run_experts
from memo_exec.moe.routers import router_for
from memo_sim.layout.moe_balance import Balance
from memo_sim.model.config import ModelConfig


@dataclass
class MoESaved:
    # [T, top_k] routing of the forward; None: routed again by the backward's re-run (a multi-token-prediction
    # module re-run whole keeps no routing, `memo_exec.mtp.ModuleRecompute`)
    idx: torch.Tensor | None
    graph: tuple | None = None  # (ln2 leaf, block output: its graph, storage freed) under store all
    route_layer: int = 0  # the model layer a routing keyed by layer drew from (the re-run without idx draws it again)
    copies: tuple | None = None  # under a capacity: (src, exp) [N] each, the copies the experts computed


def _graph_leaf(ln2: torch.Tensor, rebuilt: bool) -> torch.Tensor:
    """The block's input as its kept graph's leaf. Where the policy keeps ln2 in a buffer the next layers overwrite
    and rebuilds it there before this layer's backward (``recompute_norm_act``, `memo_exec.layer.LayerStorage`), the
    leaf is a second tensor over the same memory with a version counter of its own: the graph reads the rebuilt
    values, which the other layers' in-place writes in between would otherwise flag as modified (a ``detach`` shares
    the counter)."""
    if not rebuilt:
        return ln2.detach().requires_grad_(True)
    leaf = torch.empty(0, dtype=ln2.dtype, device=ln2.device)
    return leaf.set_(ln2.untyped_storage(), ln2.storage_offset(), ln2.shape, ln2.stride()).requires_grad_(True)


class MoEBlock:
    def __init__(self, model: ModelConfig, dispatcher: Dispatcher | None = None, tp_size: int = 1,
                 tp_group=None, etp: ExpertTP | None = None) -> None:
        self.model = model
        self.k, self.h = model.top_k, model.hidden
        # SwiGLU (True), GPT-OSS's clamped one (its limit, a float: `memo_exec.moe.experts`) or GELU (False)
        self.swiglu = (float(model.swiglu_limit) or True) if model.ffn_type == "swiglu" else False
        self.router = router_for(model)
        self.dispatcher = dispatcher or LocalDispatcher(model.experts)
        self.tp_size, self.tp_group = tp_size, tp_group
        # expert tensor parallelism around the experts (`memo_exec.moe.etp`), unless the dispatcher's gather covers it
        self.etp = None if etp is None or etp.size == 1 or self.dispatcher.gathers_etp else etp
        self.routing, self.positions = None, None  # the router picks (`set_balance`)
        self.capacity, self.groups = None, None  # no capacity factor: every routed copy computed
        # the model layer of the compute's layer 0: a pipeline chunk's first (`memo_exec.pipeline.schedules`), a
        # routing keyed by layer draws from ``layer_base + layer``
        self.layer_base = 0

    def set_balance(self, balance: Balance, positions: torch.Tensor, groups: torch.Tensor | None = None) -> None:
        """Route by the layout's ``balance`` (`memo_exec.moe.balance`, `memo_exec.moe.capacity`): ``positions`` [T]
        the position in its sequence of each row the block runs on (this rank's rows, in their order); ``groups``
        [T]: under a capacity, the rank each row stands for (default: the rows of a call are one rank's)."""
        self.routing = routing_for(balance.kind)
        self.positions = positions.to(torch.int64)
        self.capacity = capacity_factor(balance)
        self.groups = None if groups is None else groups.to(torch.int64)

    def route_layer(self, layer: int | None) -> int:
        """The model layer of the compute's ``layer`` (a routing keyed by layer draws from it)."""
        return self.layer_base + (0 if layer is None else layer)

    def _choose(self, T: int, device, route_layer: int) -> torch.Tensor | None:
        if self.routing is None:
            return None
        if self.positions.numel() != T:
            raise RuntimeError(f"the MoE block's balance routes {self.positions.numel()} rows, it was given {T}")
        self.positions = self.positions.to(device)
        return self.routing(self.positions, self.k, self.model.experts, route_layer)

    def math(self, w, ln2: torch.Tensor, idx: torch.Tensor | None = None, layer: int | None = None,
             phase: str = "fwd", route_layer: int | None = None, copies: tuple | None = None,
             recompute_act: bool = False):
        """(block output [T, h], routing idx, capacity copies or None) with autograd where grad mode is on;
        ``layer`` and ``phase`` name the dispatcher's timed collectives (`memo_exec.moe.dispatchers`);
        ``route_layer`` the model layer a routing keyed by layer draws from (default: ``layer``'s); ``copies``
        a forward's capacity selection, kept for the backward's re-run like ``idx``; ``recompute_act``: the routed
        experts' activation output rebuilt for the backward, not kept (`memo_exec.moe.experts.rebuilt_act`)."""
        T = ln2.shape[0]
        logits = F.linear(ln2, w.router_w, w.router_b)
        if idx is None:
            idx = self._choose(T, ln2.device, self.route_layer(layer) if route_layer is None else route_layer)
        idx, weights = self.router(logits, self.k, idx)
        if self.capacity is None:
            xe, counts, state = self.dispatcher.dispatch(ln2, idx, layer, phase)
            ye = self._experts(w, xe, counts, self.dispatcher.route_probs(weights, state), layer, phase, recompute_act)
            y = self.dispatcher.combine_tokens(ye, state, T, self.k)
        else:  # each expert's C copies sent as tokens of one choice, summed back per token (`memo_exec.moe.capacity`)
            if copies is None:
                if self.groups is not None and self.groups.numel() != T:
                    raise RuntimeError(f"the MoE block's capacity groups cover {self.groups.numel()} rows, it was "
                                       f"given {T}")
                copies = padded_copies(idx, weights, self.model.experts, self.capacity,
                                       None if self.groups is None else self.groups.to(ln2.device))
            src, exp = copies
            probs = weights.new_zeros(T, self.model.experts).scatter(1, idx, weights)[src, exp]  # padding: zero
            xe, counts, state = self.dispatcher.dispatch(ln2.index_select(0, src), exp.unsqueeze(1), layer, phase)
            ye = self._experts(w, xe, counts, self.dispatcher.route_probs(probs.unsqueeze(1), state), layer, phase,
                               recompute_act)
            y = sum_copies(self.dispatcher.combine_tokens(ye, state, src.numel(), 1), src, T)
        if w.shared_w1 is not None:  # a dense FFN on the TP group's rows: ln2 gathered in, reduce-scattered out
            a = sp_gather_linear(ln2, w.shared_w1, self.tp_size, self.tp_group)
            s = sp_reduce_scatter(F.linear(act(a, self.swiglu), w.shared_w2), self.tp_size, self.tp_group)
            if w.shared_gate is not None:
                s = s * torch.sigmoid(F.linear(ln2, w.shared_gate))
            y = y + s
        return y, idx, copies

    def _experts(self, w, xe: torch.Tensor, counts: list[int], probs: torch.Tensor, layer: int | None,
                 phase: str, recompute_act: bool = False) -> torch.Tensor:
        """The local experts' outputs for the copies ``xe`` (grouped by local expert, ``counts``), weighted by
        ``probs`` (inside the activation, or, Llama 4's router, on the input: ``x * p`` into the experts, as
        Megatron-LM's --moe-apply-probs-on-input multiplies the permuted tokens); under etp > 1 through the ETP
        group's gather and reduce-scatter (`memo_exec.moe.etp`)."""
        if self.etp is None:
            xe, probs = self._weighted_input(xe, probs)
            return run_experts(xe, counts, w, self.swiglu, probs=probs, recompute_act=recompute_act)
        xg, cg, pg, st = self.etp.gather(xe, counts, probs, layer, phase)
        xg, pg = self._weighted_input(xg, pg)  # the ETP group's copies, as Megatron-Core's experts weight them
        return self.etp.scatter(run_experts(xg, cg, w, self.swiglu, probs=pg, recompute_act=recompute_act), st)

    def _weighted_input(self, xe: torch.Tensor, probs: torch.Tensor) -> tuple:
        """(the experts' input, the weights their activation applies): ``xe`` and ``probs`` as they are, or under a
        router weighting the input (Llama 4's) ``xe`` times each copy's weight and no weights after (the multiply
        keeps ``xe`` and the weights; the experts' first GEMM keeps the product: `memo_exec.moe.memory`)."""
        if not self.router.on_input:
            return xe, probs
        return xe * probs.view(-1, 1).to(xe.dtype), None

    def forward(self, w, S, out: torch.Tensor, layer: int | None = None, phase: str = "fwd") -> None:
        """Write the block's output for every local row into ``out`` [T, h]; keep what the storage says."""
        if getattr(S, "keep_moe_internals", False):
            with torch.enable_grad():
                leaf = _graph_leaf(S.ln2, getattr(S, "ln2_rebuilt", False))
                y, idx, copies = self.math(w, leaf, None, layer, phase,
                                           recompute_act=getattr(S, "moe_recompute_act", False))
            S.moe = MoESaved(idx, (leaf, y), self.route_layer(layer), copies)
            out.copy_(y.detach())
            # the backward needs y's graph and shape, not its values: the sum and add that made it keep no
            # output, so its storage goes back now (`memo_exec.moe.memory`: [T, h] a layer the simulator never keeps)
            y.untyped_storage().resize_(0)
            return
        with torch.no_grad():
            y, idx, copies = self.math(w, S.ln2, None, layer, phase)
        S.moe = MoESaved(idx, route_layer=self.route_layer(layer), copies=copies)
        out.copy_(y)

    def backward(self, w, S, dy: torch.Tensor, layer: int, timer) -> torch.Tensor:
        """Accumulate the block's parameter gradients for output gradient ``dy`` [T, h]; return d ln2."""
        saved = S.moe
        if saved is None:
            raise RuntimeError(f"layer {layer}: the MoE block has no saved routing (backward without forward)")
        if saved.graph is None:
            with timer.span("moe_recompute", layer, "recompute"), torch.enable_grad():
                leaf = S.ln2.detach().requires_grad_(True)
                y, _, _ = self.math(w, leaf, saved.idx, layer, "recompute", saved.route_layer, saved.copies)
        else:
            freed = [n for n, p in w.named_parameters() if p.untyped_storage().nbytes() == 0]
            if freed:
                raise RuntimeError(f"layer {layer}: the MoE block's kept graph reads weights whose storage is freed "
                                   f"({', '.join(freed)}); gather them back in place before the backward")
            leaf, y = saved.graph
        S.moe = None
        torch.autograd.backward(y, dy)  # accumulates into the parameters' existing .grad in place
        return leaf.grad
