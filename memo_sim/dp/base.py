"""What a data-parallel flavour is: how the model states of the ranks that hold the same weights
(the DP x CP x Ulysses group, ``layout.state_shards``) are sharded and kept in step, as data and
rules the memory formulas and the gradient collectives ask for (`memo_sim.cost.memory`,
`memo_sim.cost.grad_sync`).

A flavour says over how many of those ranks the states are sharded (``shard_group``; the rest of
the group holds replicas of each shard, HSDP), whether a layer's gathered weights are dropped after
its forward and gathered again for its backward (``gathers_in_backward``), and how many layers'
gathered weights a GPU holds at its peak (``gathered_layers``), whether the output head's are gathered again for its
backward (``regathers_head``), and whether its shards keep the working weights
beside the fp32 master (``shards_working_weights``). Beside pipeline stages it says
whether it runs there at all (``pipeline_why_not``), whether a stage reduces its gradients chunk by
chunk after that chunk's last micro-batch backward instead of layer by layer during it
(``reduces_after_chunk``) and the element width of the whole gradients a stage accumulates over
its micro-batches (``pipeline_grad_bytes``). The arguments ``layout`` and
``model`` are read by attribute: this package sits below both.
"""

from __future__ import annotations


class DPFlavour:
    """One data-parallel flavour; the defaults are the ZeRO stages over the whole group."""

    name = "base"
    label_part = ""

    def shard_group(self, layout) -> int:
        """Ranks over which the sharded states are split."""
        return layout.state_shards

    def replicas(self, layout) -> int:
        """Copies of each shard (HSDP: the replicate group; 1 when the whole group shards)."""
        return layout.state_shards // self.shard_group(layout)

    def gathers_in_backward(self, layout) -> bool:
        """Whether each layer's weights are gathered again before its backward."""
        return layout.zero >= 3

    def regathers_head(self, layout) -> bool:
        """Under ZeRO-3, whether the output head's weights are dropped after its forward and gathered again for its
        backward (DeepSpeed's ZeRO-3 releases every module's parameters after its forward)."""
        return self.gathers_in_backward(layout)

    def gathered_layers(self, layout, n_layers: int) -> float:
        """Layers whose gathered (whole) weights a GPU holds at its peak, beside its shards."""
        return 2.0 if layout.zero >= 3 else 0.0

    def check(self, layout, model) -> str | None:
        """None, or why the layout cannot run this flavour."""
        return None

    # ZeRO 3: whether each rank keeps a shard of the working (model-dtype) weights beside the fp32 master shard
    # (DeepSpeed's ZeRO-3 and Megatron-FSDP do); False: the fp32 shard is the parameter and the working weights
    # exist only gathered, cast at each all-gather (FSDP2's MixedPrecisionPolicy param_dtype)
    shards_working_weights = True

    # beside pipeline stages (pp > 1)
    reduces_after_chunk = False  # True: a chunk's gradients reduced after its last micro-batch's backward

    def pipeline_why_not(self, layout) -> str | None:
        """None, or why this flavour cannot shard the states of pipeline stages (``layout.pp`` > 1):
        ZeRO's stages 2 and 3 shard what a stage keeps whole over its micro-batches (its gradients
        and the weights every micro-batch reads), which memo does not price."""
        if layout.zero > 1:
            # a way every command takes: the what-if's --dp-mode is not maxseq's (a review), --framework is
            return ("pipeline stages keep their own layers' weights and gradients: ZeRO at most 1 with pp "
                    "(or FSDP beside pipeline stages, as torchtitan runs it: --framework torchtitan)")
        return None

    def pipeline_grad_bytes(self, recipe) -> int:
        """Bytes per element of the whole gradients a pipeline stage accumulates over its micro-batches."""
        return recipe.grad_bytes
