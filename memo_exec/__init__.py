"""memo executor: runs a plan.json written by memo-sim with plain PyTorch and measures it.

- `memo_exec.model` / `memo_exec.layer`: GPT with one hand-written autograd Function per layer
- `memo_exec.attention`: flash-attn, torch SDPA kernels (flash, efficient, cuDNN), plain math
- `memo_exec.activations`: one executor policy per simulator policy (store all, full recompute,
  full offload, MEMO token-wise offload), registered by name
- `memo_exec.streams`: compute / offload / prefetch streams (CUDA, or threads on CPU)
- `memo_exec.happens_before`: the race detector every stream feeds (vector clocks, issue order)
- `memo_exec.wait_switch`: the executor's wait primitives, and the test-only switch that removes
  one call of them (issue 47's wait-removal test)
- `tests.exec_op_order`: copy <-> compute dependency edges, executor and simulator alike
- `memo_exec.arena`: scratch tensors at memory-plan offsets in one arena (one layer's peak)
- `memo_exec.memory_estimate`: sizes before allocating, in the simulator's memory terms
- `memo_exec.measure` / `memo_exec.compare` / `memo_exec.report`: timeline, measured vs
  re-simulated prediction per stream and per op, Chrome trace, report.md
- `memo_exec.runner` / `memo_exec.cli`: ``memo-exec run`` and ``memo-exec trace``
"""
