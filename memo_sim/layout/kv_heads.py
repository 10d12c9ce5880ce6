"""K/V heads over TP x Ulysses: split whole, or one head repeated per rank (the one place for that rule).

Tensor parallelism splits a GQA layer's K/V heads like its query heads: each TP rank holds
n_kv / tp whole heads (Megatron-LM asserts num_query_groups % tensor_model_parallel_size == 0).
Ulysses' head-scatter all-to-all then gives each of the u ranks of its group 1/u of those heads.
When the TP rank's n_kv / tp heads are fewer than u, Ulysses implementations repeat every K/V head
r = tp·u / n_kv times before the all-to-all (torch ``repeat_interleave`` on the head dimension, so
query head j still meets K/V head j // (heads / n_kv)), and each rank receives one (repeated) head:

- XTuner's Ulysses attention, xtuner/v1/module/attention/mha.py at InternLM/xtuner b934f46209
  (``if sp_size > num_kv_heads: assert sp_size % num_kv_heads == 0; key_states =
  repeat_kv(key_states, sp_size // num_kv_heads)`` and the same for the values, then
  ``ulysses_all_to_all``);
- DeepSpeed's Ulysses for Hugging Face models, deepspeed/runtime/sequence_parallel/ulysses_sp.py at
  deepspeedai/DeepSpeed edaa722126 (``kv_replication_factor = world_size // kv_head_count``,
  ``input.repeat_interleave(kv_replication_factor, dim=2)`` on K and V before ``_DimZeroAllToAll``,
  one local K/V head; refused unless one count divides the other).

So tp·u must divide n_kv (no repeat) or be a multiple of it (repeat r); everything else is
refused. The repeated heads cost what they are: the all-to-all of K and V moves r times the
bytes, the head-sharded K and V each rank holds after it (and that ring CP passes on, and whose
gradients come back) are r times the un-repeated ones (`memo_sim.cost.layer_time`'s all-to-all and
ring-CP bytes, `memo_sim.memplan.trace_gen.attention_buffers`). The K and V a layer keeps for its
backward are the un-repeated, sequence-sharded ones (memo's executor repeats them again in the
backward), and the attention kernel is priced by its FLOPs, which the repeat leaves as they are
(every query head reads one K/V head either way). Where the gradient returns, the repeats are
summed (autograd's repeat_interleave backward; memo's executor sums them explicitly).
That is the ``minimal`` rule (``Layout.ulysses_kv``, framework data). The other, ``query_heads``:
XTuner's older dispatch, xtuner/model/modules/dispatch/llama.py at 7575f2c91 (2024-07), calls HF's
``repeat_kv`` on the key and value states before ``flash_attn_wo_mask`` / ``flash_attn_w_mask`` and
their ``sequence_parallel_wrapper`` (xtuner/parallel/sequence/attention.py) run the all-to-all, so
every K/V head goes out repeated to the query heads, r = heads / n_kv, whatever the Ulysses degree
(also with ulysses 1, where no all-to-all runs and r costs nothing memo prices). Under it each rank
receives as many K/V heads as query heads; only TP's whole-head rule applies. The third, ``whole``:
TransformerEngine's all-to-all context parallelism (Megatron-LM's ``--cp-comm-type a2a``, and the a2a
level of ``a2a+p2p``) never repeats them: ``attn_forward_func_with_cp``'s all-to-all path asserts
``q.shape[-2] % cp_size == 0 and k.shape[-2] % cp_size == 0`` ("The number of attention heads needs to
be divisible by CP size!", transformer_engine/pytorch/attention context parallelism), so a TP rank's
K/V heads must split whole over the all-to-all's ranks; everything else is refused.
"""

from __future__ import annotations

# how K/V heads are repeated before Ulysses' all-to-all (``Layout.ulysses_kv``; module docs)
ULYSSES_KV_RULES = ("minimal", "query_heads", "whole")


def kv_heads_why_not(tp: int, ulysses: int, n_kv_heads: int, rule: str = "minimal") -> str | None:
    """Why ``n_kv_heads`` K/V heads cannot be spread over ``tp`` x ``ulysses`` ranks under ``rule``
    (None when they can)."""
    split = tp * ulysses
    if n_kv_heads % tp:
        return (f"kv heads ({n_kv_heads}) not divisible by tp ({tp}): each TP rank holds whole K/V heads; "
                f"use a tp that divides {n_kv_heads}")
    if rule == "query_heads":  # repeated to the query heads, which tp x ulysses divides (`check_layout`)
        return None
    if rule == "whole" and n_kv_heads % split:
        return (f"kv heads ({n_kv_heads}) not divisible by tp x ulysses ({split}): TransformerEngine's all-to-all "
                f"context parallelism (--cp-comm-type a2a) splits each TP rank's K/V heads whole, never repeated; "
                f"use tp x ulysses dividing {n_kv_heads}")
    if n_kv_heads % split and split % n_kv_heads:
        return (f"kv heads ({n_kv_heads}) and tp x ulysses ({split}): neither divides the other, so the ranks "
                f"can get neither whole nor repeated K/V heads; use tp x ulysses dividing {n_kv_heads} or a "
                f"multiple of it")
    return None


def kv_repeat_factor(tp: int, ulysses: int, n_kv_heads: int, heads: int | None = None,
                     rule: str = "minimal") -> int:
    """r: how many times each K/V head is repeated before Ulysses' all-to-all (1: none) under ``rule``
    (``query_heads`` needs ``heads``, the query heads); a layout's is ``Layout.kv_repeat``."""
    if rule == "query_heads":
        if heads is None:
            raise ValueError("kv_repeat_factor: the query_heads rule needs the query heads")
        return heads // n_kv_heads if ulysses > 1 else 1
    split = tp * ulysses
    if rule == "whole":  # never repeated (`kv_heads_why_not` refuses what does not split whole)
        return 1
    return split // n_kv_heads if ulysses > 1 and split > n_kv_heads else 1

