"""The distributed executor's building blocks over torch.distributed (NCCL on GPUs, gloo on CPU).

- `p2p`: the one point-to-point primitive everything that passes tensors between ranks uses
  (ring context parallelism, METP's weight ring, SPPO's pipeline stages).
- `collectives`: the flat-tensor all-gather / reduce-scatter under their current names.
- `context`: the DeviceMesh and process groups from the plan's layout, and which tokens a rank holds.
- `tp`: registered tensor-parallel flavours (``megatron``; METP plugs in from `memo_exec.metp`).
- `attention`: ring CP and Ulysses around the attention core.
- `zero`: gradient reduction and ZeRO 0-3 over the data group.
- `schedule`: step schedules registered by the plan's ``schedule`` name (``single_stage`` here;
  ``1f1b`` and ``interleaved_1f1b`` from `memo_exec.pipeline`, ``sppo`` from `memo_exec.sppo`).
- `runner`: `DistExecutor`, one rank of a multi-device plan.
- `launch`: torchrun ranks and ``memo-exec run --nproc N``.
"""
