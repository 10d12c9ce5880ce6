"""MEMO's two rounding buffers and the one dependency rule of its copies.

Both the simulator's schedule (`memo_sim.engine.schedules`) and the executor
(`memo_exec.activations.token_offload`) follow these functions; neither writes the rule again.

Buffers: layer i's skeletal tensors (x, ln1, q, k, v, attn, h1, ln2, fc1, act) live in rounding
buffer ``i % 2``. Layer i's input x is written by the last op of layer i-1's forward (the
residual add that produces y), straight into buffer ``i % 2``.

The rule: *a kernel waits on a copy only where it overwrites memory that the copy still reads;
a copy waits only for the kernel that produced its data, or the last kernel that read the
memory it overwrites.* For MEMO and full offload that gives exactly four edges:

1. ``offload(i)`` starts after ``forward(i)`` ends (it reads what forward(i) produced).
2. The op that writes layer i+1's input -- the last op of ``forward(i)`` -- waits for
   ``offload(i-1)``: it overwrites buffer (i+1) % 2 == (i-1) % 2, which that offload still reads.
   So offload(i-1) runs beside all of forward(i) but its last op. (Every later write into
   buffer (i-1) % 2 comes after this one on the compute stream.)
3. ``prefetch(j)`` starts after ``backward(j+2)`` ends: backward(j+2) is the last kernel that
   reads buffer j % 2 before the prefetch overwrites it. It then runs beside backward(j+1).
4. ``backward(j)`` (and MEMO's token-wise recompute before it, which reads the prefetched x and
   attn) waits for ``prefetch(j)``.

The last ``KEPT_LAYERS`` layers are neither offloaded nor recomputed: their forward ends right
before the classifier and their backward starts right after it, so their activations stay in
the buffers.
"""

from __future__ import annotations

KEPT_LAYERS = 2  # the last layers go straight into backward: no offload, no recompute
N_BUFFERS = 2


def rounding_buffer(layer: int) -> int:
    """Which rounding buffer holds a layer's skeletal tensors."""
    return layer % N_BUFFERS


def offloaded_layer_count(n_layers: int) -> int:
    """How many layers (0 .. count-1) an offloading policy copies to host."""
    return max(n_layers - KEPT_LAYERS, 0)


def is_offloaded(layer: int, n_layers: int) -> bool:
    return 0 <= layer < offloaded_layer_count(n_layers)


def output_write_waits_for(layer: int, n_layers: int) -> int | None:
    """Edge 2: the offload that the last op of ``forward(layer)`` must wait for, or None.

    That op writes layer+1's input into buffer (layer+1) % 2, still read by offload(layer-1).
    """
    if layer + 1 >= n_layers:
        return None  # the last layer's output goes to the classifier, not into a buffer
    prev = layer - 1
    return prev if is_offloaded(prev, n_layers) else None


def prefetch_after_backward_of(layer: int, n_layers: int) -> int:
    """Edge 3: ``prefetch(layer)`` starts once this layer's backward has ended (layer + 2)."""
    if not is_offloaded(layer, n_layers):
        raise ValueError(f"layer {layer} of {n_layers} is not offloaded, so it is never prefetched")
    return layer + N_BUFFERS


def prefetch_launched_after_backward(layer: int, n_layers: int) -> int | None:
    """Edge 3 read the other way: which layer's prefetch is launched when ``backward(layer)``
    ends (layer - 2), or None."""
    j = layer - N_BUFFERS
    return j if is_offloaded(j, n_layers) else None
