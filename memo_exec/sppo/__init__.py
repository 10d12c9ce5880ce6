"""SPPO in the executor (papers/sppo.txt; the simulator's side: `memo_sim.cost.sppo`,
`memo_sim.policy.sppo`, `memo_sim.engine.pipeline`, `memo_sim.search.sppo`).

One module per job:

- `attention`: causal attention of a piece's queries against the keys of every token before it
  (two blocks of `memo_exec.block_attention`, merged);
- `kvcache`: the stage's K/V cache and `PrefixAttention`, the autograd function that attends
  through it and routes the earlier pieces' dK/dV into their accumulators;
- `stage`: one stage's math per piece on the executor's weights (`memo_exec.model.GPT`);
- `schedule`: which piece's forward/backward a stage runs when and which transfers it waits for;
- `offload`: per-subsequence offload ratios alpha_i on the executor's copy streams;
- `clock`: the step clock (CUDA events on the compute stream, perf_counter on CPU) whose marks
  time the pieces and the waits, read once at the step's end;
- `pipeline`: `StageRunner`, one stage's step over point-to-point transfers (multiplexed pieces
  included), with its spans and copy log;
- `plugin`: the distributed executor's ``sppo`` step schedule and activation policy
  (``memo-exec run --nproc`` of a plan whose ``schedule`` is ``sppo``);
- `report`: the measured pipeline against the simulator's (Gantt charts, bubbles, offload
  exposure, memory per stage).
"""
