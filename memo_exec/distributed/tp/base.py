"""What a tensor-parallel flavour receives and provides (`memo_exec.distributed.tp`).

The distributed executor (`memo_exec.distributed.runner.DistExecutor`) builds one flavour per
rank: ``cls(ctx, model)`` with the rank's `memo_exec.distributed.context.DistContext` (its TP
group ``ctx.group("tp")``, size ``ctx.size("tp")``, rank ``ctx.coord("tp")``, ``ctx.layout``)
and the (possibly layer-reduced) `ModelConfig`. Then, in this order:

1. ``check()`` -> None or the one-line reason the layout cannot run (refused before allocation).
2. ``row_mult`` (int): rows of the TP-split tensors per local token (tp with sequence
   parallelism, else 1); ``local_tokens(shard_tokens)``: rows of the layer input x on this rank
   when the rank's CP/Ulysses shard holds ``shard_tokens`` tokens (batch x shard sequence).
3. ``storage_shapes()`` -> {skeletal name: (rows per local token, width)}: what the activation
   policy allocates for every layer (`memo_exec.layer.storage_shapes` for Megatron). A flavour
   whose layer saves fewer tensors still returns every name of `memo_exec.layer.SKELETAL`
   (width 0 for a tensor it never saves).
4. ``make_weights(layers, device, dtype, layer=None, experts=None, moe=None, expert_tp=(1, 0))`` -> an
   ``nn.Module`` with this rank's shard of one layer (for Megatron `memo_exec.layer.LayerWeights` with ``tp=size``;
   ``layer``: its index in the model, which decides its kind; a MoE layer holds routed experts ``experts`` = (first,
   count), slice ``expert_tp`` = (etp, ETP rank) of each; ``moe``: the kind given, a multi-token-prediction
   module's), and
   ``shard_(local, full)``: copy this rank's shard out of a whole layer's weights (the runner
   initialises the whole layer from the seed, so every layout starts from the same weights), and
   ``unshard_grads(grads: {name: local gradient}) -> {name: whole gradient}`` (collective over
   the TP group; tests and checks). ``replicated(param_name) -> bool``: the parameter is whole on every TP rank (its
   gradient is summed over the TP group when the tokens are split over it, ``row_mult > 1``).
5. ``make_compute(batch, seq, dtype, device, backend, scratch, timer)`` -> the layer compute: an
   object with the `memo_exec.layer.LayerCompute` methods ``forward(p, S, y_out, layer,
   before_output)``, ``backward(p, S, dy, layer) -> dx``, ``recompute_full(p, S, layer)``,
   ``recompute_tokens(p, S, start, layer)`` and the attributes ``T`` (local rows) and ``h``.
   ``S`` is the `memo_exec.layer.LayerStorage` the activation policy hands out (shapes from
   step 3): the compute fills it in forward and reads it in backward, so what is saved is
   decided there and only there; ``recompute_tokens`` rebuilds local rows ``[start, T)``
   (``[start*row_mult, T*row_mult)`` of the split tensors). ``backend`` is the attention (ring
   CP / Ulysses already wrapped around the plan's kernel), ``seq`` the sequence length that
   attention sees. Weight gradients are accumulated into the preallocated ``.grad`` tensors.
6. Optional, for the plan's static memory plan (level 1, `memo_sim.memplan`): ``sizes_only_compute(batch, seq,
   dtype, backend, scratch)`` -> the same layer compute on the meta device whose collectives do not communicate
   but ask ``scratch`` for exactly the buffers the real ones ask for (its requests are recorded to check the plan
   against them, `memo_exec.distributed.runner.DistExecutor`), or None where the flavour has none (then the rank's
   scratch comes from the caching allocator and the run says so); ``plans_memory()`` says which, before any
   instance exists; ``plan_names()`` maps the simulator's names of this rank's tensors to the executor's,
   {phase: {plan name: executor name}}.
"""

from __future__ import annotations

from memo_sim.model.config import ModelConfig


class TPFlavour:
    name = "base"

    def __init__(self, ctx, model: ModelConfig) -> None:
        self.ctx, self.model = ctx, model
        self.size = ctx.size("tp")
        self.rank = ctx.coord("tp")
        self.group = ctx.group("tp")

    def check(self) -> str | None:
        return None

    @property
    def row_mult(self) -> int:
        return 1

    def local_tokens(self, shard_tokens: int) -> int:
        return shard_tokens // self.row_mult

    def storage_shapes(self) -> dict[str, tuple[int, int]]:
        raise NotImplementedError

    def make_weights(self, layers: int, device, dtype, layer: int | None = None,
                     experts: tuple[int, int] | None = None, moe: bool | None = None,
                     expert_tp: tuple[int, int] = (1, 0)):
        raise NotImplementedError

    def shard_(self, local, full) -> None:
        raise NotImplementedError

    def unshard_grads(self, grads: dict) -> dict:
        raise NotImplementedError

    def replicated(self, param_name: str) -> bool:
        raise NotImplementedError

    def make_compute(self, batch: int, seq: int, dtype, device, backend, scratch, timer):
        raise NotImplementedError

    @classmethod
    def plans_memory(cls) -> bool:
        """Whether ``sizes_only_compute`` records this flavour's layer (the rank can follow a memory plan)."""
        return False

    def sizes_only_compute(self, batch: int, seq: int, dtype, backend, scratch):
        return None

    def plan_names(self) -> dict[str, dict[str, str]]:
        return {}
