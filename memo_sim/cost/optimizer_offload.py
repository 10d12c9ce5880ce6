"""Optimizer offload: the optimizer's states and step on the host (Megatron-Core's
``--optimizer-cpu-offload``, its HybridDeviceOptimizer with the whole shard offloaded; DeepSpeed's
ZeRO-Offload, ``zero_optimization.offload_optimizer``), written once.

With ``Layout.optimizer_offload`` an fp32 copy of the weights and Adam's two moments of the shard a GPU
updates (``HOST_MASTER_BYTES + optimizer_bytes`` per parameter, sharded as ZeRO says) live in the host's
memory, beside an fp32 copy of the shard's gradients; the GPU keeps the working weights and the gradient
buffer. The host's weight copy is there whatever the precision recipe: with the fp32 recipe (no master copy on
the GPU, ``master_bytes`` 0) the host still needs weights of its own to run Adam on, as Megatron-Core's
HybridDeviceOptimizer clones every offloaded GPU parameter to the host whatever its dtype
(``megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py`` ``_get_sub_optimizer_param_groups``,
``param.detach().clone().cpu().pin_memory()``, line 274 at d98e8a64) and keeps a host gradient of the same
dtype beside it (``_set_sub_optimizer_grads``, lines 109-112); memo-exec's `memo_exec.optim_offload.HostAdamW`
holds the same 16 bytes per parameter. Each step then:

1. copies the shard's gradients to the host (the recipe's ``grad_bytes`` per parameter) over the
   GPU's host link, every GPU of the node the job uses at once (`memo_sim.cost.transfer.host_copy_time` with
   the node's GPUs active);
2. runs Adam on the host: it reads the master weights, both moments and the fp32 gradients and
   writes the weights and moments back (``CPU_ADAM_BYTES_PER_PARAM`` bytes), over the node's host-
   memory bandwidth shared by its GPUs' shards. A memory-bound estimate: the CPU's arithmetic and
   thread count are not priced, so it is a lower bound on the step on the host;
3. copies the updated working weights back (the recipe's ``weight_bytes`` per parameter).

The three run one after the other (``--overlap-cpu-optimizer-d2h-h2d``, which pipelines them over
parameter groups, is not modelled), while the GPU waits. The executor runs the same three phases
(`memo_exec.optim_offload`).
"""

from __future__ import annotations

from memo_sim.cost.param_split import GpuParams
from memo_sim.cost.transfer import host_copy_time
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.profile.schema import HardwareProfile

FP32 = 4
# Adam on the host per parameter: read master, m, v and the fp32 gradient (4 x 4), write master, m, v (3 x 4)
CPU_ADAM_BYTES_PER_PARAM = 7 * FP32
# the host's fp32 weights Adam updates: the recipe's master copy moved off the GPU, or (fp32 recipe, whose GPU
# weights are the master) a copy of the GPU's weights (module docs)
HOST_MASTER_BYTES = FP32


def shard_params(params: GpuParams, layout: Layout) -> float:
    """Parameters of the shard one GPU updates (``params``: what it holds before and after ZeRO,
    `memo_sim.cost.param_split`): ZeRO >= 1 splits the optimizer over the replicas."""
    return params.sharded if layout.zero >= 1 else params.local


def host_state_bytes(model: ModelConfig, layout: Layout, params: GpuParams) -> float:
    """Host bytes one GPU's offloaded optimizer holds: fp32 master weights (``HOST_MASTER_BYTES``, whatever
    the recipe's ``master_bytes``: module docs), Adam's moments and the fp32 gradient copy of its shard
    (0 without offload)."""
    if not layout.optimizer_offload:
        return 0.0
    r = model.recipe
    return (HOST_MASTER_BYTES + r.optimizer_bytes + FP32) * shard_params(params, layout)


def offloaded_step_seconds(model: ModelConfig, layout: Layout, params: GpuParams, profile: HardwareProfile) -> float:
    """The optimizer step of one GPU with its states on the host: gradients down, Adam on the host,
    weights up (module docs)."""
    n = shard_params(params, layout)
    r = model.recipe
    gpus = min(layout.gpus, profile.node_gpus)  # the node's GPUs stepping at once
    down = host_copy_time(r.grad_bytes * n, profile, "d2h", gpus)
    host = CPU_ADAM_BYTES_PER_PARAM * n / (profile.host_memory_bandwidth(gpus) / gpus)
    up = host_copy_time(r.weight_bytes * n, profile, "h2d", gpus)
    return down + host + up
