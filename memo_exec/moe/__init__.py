"""Mixture-of-experts layers in the executor (plain PyTorch + torch.distributed), one job per module:

- `weights`: one MoE layer's parameters (router, this rank's routed experts, shared experts, gate),
  the per-expert seeded initialisation and the experts' slices under expert tensor parallelism;
- `routers`: score function + deterministic top-k by ``ModelConfig.router`` (registered by name);
- `balance`: routings that pick the experts in the router's place by ``Layout.moe_balance`` (``forced``:
  round-robin, equal counts; ``random``: a uniform draw; registered by name);
- `capacity`: a capacity factor's dropping and padding of the router's choice (``capacity:F``);
- `dispatchers`: ``local`` (ep 1), ``alltoall``, ``allgather`` and ``deepep`` token dispatch / combine (registered
  by name);
- `experts`: the per-expert GEMM loop; `comm`: the differentiable collectives;
- `block`: the block `memo_exec.layer.LayerCompute` runs in place of the FFN on a MoE layer, and
  what it keeps for the backward under each activation policy;
- `etp`: expert tensor parallelism around the experts (the ETP group's copies all-gathered, the partial outputs
  reduce-scattered);
- `groups`: the expert-parallel, expert-tensor-parallel and expert-data-parallel groups (Megatron-Core's folding);
- `sync`: the routed experts' gradient reduction and optimizer under ep or etp > 1;
- what the executor cannot run yet is `memo_sim.plan.executor_scope` (the contract): one line each.
"""
