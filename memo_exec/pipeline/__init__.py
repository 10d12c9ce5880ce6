"""Micro-batch pipelines in the distributed executor: Megatron-LM's 1F1B and interleaved 1F1B for
every activation policy.

- `order`: which forward or backward a rank runs when (pure functions), the activation slots
  that follow from it and the order of the messages each neighbour sends;
- `schedules`: the ``1f1b`` and ``interleaved_1f1b`` schedules registered with
  `memo_exec.distributed.schedule` (one activation-policy instance per micro-batch in flight, P2P
  over `memo_exec.distributed.p2p`, and why not ``torch.distributed.pipelining``);
- `report`: per-stage rows (bubble, busy time, peak memory, beside the plan's simulated values
  where it carries them) and the measured pipeline Gantt chart.
"""
