"""memo executor: runs a plan.json written by memo-sim with plain PyTorch and measures it.

- `memo_exec.model` / `memo_exec.layer`: GPT with one hand-written autograd Function per layer
- `memo_exec.attention`: flash-attn, torch SDPA kernels (flash, efficient, cuDNN), plain math
- `memo_exec.activations`: store-all, full recompute, full offload, MEMO token-wise offload
- `memo_exec.streams`: compute / offload / prefetch streams (CUDA, or threads on CPU)
- `memo_exec.arena`: scratch tensors at memory-plan offsets in one arena
- `memo_exec.measure` / `memo_exec.report`: timeline, Chrome trace, report.md
- `memo_exec.runner` / `memo_exec.cli`: ``memo-exec run`` and ``memo-exec trace``
"""
