"""METP, memory-efficient tensor parallelism (papers/metp.txt), in the executor.

One job per module:

- `ledger`: the one accounting point: every tensor the rings allocate goes through it (named,
  with a kind), so a test can read the peak of any set of kinds.
- `lane`: where the transfers are issued and waited (a CUDA side stream with events, or the
  calling thread with gloo's workers on CPU), with a measured span per transfer; every P2P
  transfer goes through `memo_exec.distributed.p2p`.
- `blocks`: how a layer's weights split into the ranks' METP blocks, and the packed layout in
  which one block travels (one buffer, one transfer).
- `ffn`: the ring FFN O_i = sum_j f(A_i B_j) C_j (Algorithms 1 and 2) as plain forward,
  token-wise recompute and backward functions (the tests wrap them in autograd: tests/metp_autograd.py).
- `ring_attention`: the inner ring of the MHA (Algorithms 3 and 4): a sequence-block K/V ring
  with an online-softmax merge, causal across blocks.
- `mha`: the two-level MHA (Algorithms 5 and 6): the outer loop over head groups, whose weight
  blocks are broadcast from their owner one step ahead and whose gradients are reduced to it;
  MEMO's recompute of the projection rows by a ring of the W_proj blocks.
- `flavour`: the distributed executor's ``tp_mode`` flavours ``metp_ffn`` and ``metp``
  (registered with `memo_exec.distributed.tp.registry.register_tp`, imported by `memo_exec.distributed.tp`).
"""
