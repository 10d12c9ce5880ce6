"""SPPO (papers/sppo.txt sec. 5-6): subsequence pipeline with adaptive offloading.

The layout carries the pipeline degree (``Layout.pp``: stages, TP+SP inside each); this policy
object carries the subsequence plan: N, the partition (its bounds 0 = x_0 < ... < x_N = s and how
they were chosen, ``flops`` or ``length``), the per-subsequence offload ratios alpha_i and
whether the bubble-adjacent subsequences are split again (multiplexed sequence partitioning).
`memo_sim.search.sppo` solves it for a model, layout and profile; plan.json carries it whole for
the executor.

What the policy keeps, offloads and recomputes, per stage and unit of work (one piece of one
subsequence through one layer of the stage; `memo_sim.cost.sppo.stage_pieces`):

- **Two-level activation management.** K and V of every piece but the stage's last stay on the
  GPU from the piece's forward to its backward (later pieces attend to them in forward, and in
  backward every later piece adds to their gradients: dK/dV accumulators of the earlier pieces,
  in the model dtype, live from the first backward that touches them until their own). The
  other skeletal tensors (x, ln1, q, attn, h1, ln2, fc1, act; for the stage's last piece also k
  and v, which no later piece reads) are split token-wise: the first alpha_i of the rows go to
  host after the unit's forward, the rest stay on the GPU. Nothing is recomputed. lse stays.
- **Sequence-aware offloading.** alpha_i·A_i = M_threshold for every subsequence i (A_i its
  offloadable bytes per layer and GPU), so each unit's copy takes the same time, which the solver
  matches to the balanced compute time (`memo_sim.cost.sppo.sequence_aware_alphas`).
- **Copies.** Units follow MEMO's rounding-buffer rule (`memo_sim.policy.rounding_buffers`) in the
  stage's unit order: unit u's offload starts after its forward; the last op of unit u+1's
  forward waits until unit u-1's offload has read its data (at most two units' copies in flight,
  so M_u = M_{u−1} + A_u − alpha_{u−1}·A_{u−1} holds at every unit's end); the prefetch of unit u
  starts after unit u+2's backward and unit u's backward waits for it. A stage's last two units
  go straight into backward and are neither offloaded nor prefetched. With N = 1 and PP = 1 and
  alpha = 1 this is exactly the full-offload schedule.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import ClassVar

from memo_sim.cost.activations import layer_rows, row_bytes, saved_tensors, skeletal_bytes
from memo_sim.cost.sppo import PARTITIONS, Piece, kv_cache_bytes, partition_bounds, stage_gpu_shard, stage_pieces
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig, cache_hash
from memo_sim.policy.base import Policy
from memo_sim.policy.host_layout import OffloadedTensor, copy_bytes, host_block_bytes, offload_token_count
from memo_sim.policy.registry import register
from memo_sim.policy.rounding_buffers import is_offloaded
from memo_sim.profile.schema import HardwareProfile

KV_TENSORS = ("k", "v")


@dataclass(frozen=True)
class UnitBytes:
    """One unit's (piece x layer) bytes on one GPU of a stage."""

    skeletal: float  # every skeletal tensor of the piece (32·b·l·h/tp for a GPT layer), lse excluded
    kv: float  # of which K and V
    lse: float
    offload: float  # copied to host (and back): alpha_i of the offloadable rows
    host_block: float  # pinned host bytes the offload takes
    cached_kv: bool  # K and V stay on the GPU (every piece but the stage's last)


@register
@dataclass(frozen=True)
class Sppo(Policy):
    subseqs: int = 1
    bounds: tuple[int, ...] = ()  # 0 = x_0 < ... < x_N = seq; empty until solved for a sequence
    alphas: tuple[float, ...] = ()  # alpha_i per subsequence; empty until solved
    partition: str = "flops"  # how the bounds were chosen: flops | length | explicit
    multiplex: bool = False  # multiplexed sequence partitioning (Left-SP / Steady / Right-SP)
    # M_threshold the alphas were solved for: informative (two plans of the same bounds and alphas are the
    # same plan), written to plan.json as whole bytes
    threshold_bytes: float | None = field(default=None, compare=False)

    name: ClassVar[str] = "sppo"
    offloads: ClassVar[bool] = True
    # scheduled by the ``sppo`` schedule (`memo_sim.engine.schedules.sppo`), priced by `memo_sim.search.sppo`
    summary: ClassVar[str] = ("split the sequence into N subsequences and pipeline them over PP stages; keep K/V "
                              "on the GPU, offload alpha_i of the rest of subsequence i")

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self.subseqs
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise MemoError(f"sppo: the subsequence count must be a positive integer, got {n!r}")
        if self.partition not in PARTITIONS + ("explicit",):
            raise MemoError(f"sppo: partition must be one of {', '.join(PARTITIONS + ('explicit',))}, "
                            f"got {self.partition!r}")
        if self.bounds:
            b = self.bounds
            if len(b) != n + 1 or b[0] != 0 or any(not isinstance(x, int) or isinstance(x, bool) for x in b) \
                    or any(b[k + 1] <= b[k] for k in range(n)):
                raise MemoError(f"sppo: bounds must be {n + 1} increasing token offsets from 0, got {list(b)!r}")
        if self.alphas:
            if len(self.alphas) != n or any(isinstance(a, bool) or not isinstance(a, (int, float))
                                            or not 0.0 <= a <= 1.0 for a in self.alphas):
                raise MemoError(f"sppo: alphas (policy.alphas in a plan file) must be {n} "
                                f"number{'s' if n != 1 else ''} in [0, 1], one per subsequence, "
                                f"got {list(self.alphas)!r}")

    # -- the plan ------------------------------------------------------------------------------------
    @property
    def resolved(self) -> bool:
        return bool(self.bounds) and bool(self.alphas)

    def with_bounds(self, model: ModelConfig, layout: Layout, batch: int, seq: int) -> "Sppo":
        """This plan with its partition bounds computed for ``seq`` (kept where already given)."""
        if self.bounds:
            return self
        kind = "flops" if self.partition == "explicit" else self.partition
        return replace(self, bounds=partition_bounds(model, batch, seq, self.subseqs, kind, granule(layout)))

    @staticmethod
    def model_why_not(model: ModelConfig) -> str | None:
        """Why no SPPO plan can run ``model`` whatever the layout (its pieces are priced for dense layers with
        standard attention), or None."""
        if model.moe:
            return "SPPO is not searched for mixture-of-experts models (its planner is built for dense layers)"
        if model.mla or model.attention_width != model.hidden or model.sliding_layers or model.chunked_layers:
            return ("sppo's pieces are priced for dense layers with standard attention (no latent attention, "
                    "head_dim other than hidden / heads, sliding window or chunked attention)")
        if model.mtp_layers:  # a piece's head would price the module's attention over the piece, not its prefix
            return "sppo's pieces price no multi-token-prediction module (--mtp-layers 0 plans the model without)"
        return None

    def check(self, model: ModelConfig, layout: Layout, batch: int, seq: int) -> str | None:
        """Why this plan cannot run with ``layout`` at ``seq`` tokens, or None."""
        if layout.cp > 1 or layout.ulysses > 1 or layout.metp or layout.flavour.async_collectives:
            return "sppo splits a stage's tokens by Megatron TP+SP only (no ring CP, Ulysses, METP or async TP)"
        why = self.model_why_not(model)
        if why:
            return why
        if layout.tp > 1 and not layout.sp:
            return "sppo needs Megatron sequence parallelism inside a stage (sp on)"
        if model.layers % layout.pp or layout.uneven:
            return f"{model.layers} layers do not split evenly into {layout.pp} stages (sppo runs even stages)"
        if layout.zero > 1:
            return "sppo keeps each stage's weights and gradients whole: ZeRO 0 or 1"
        if not self.bounds:
            return ("the subsequence partition is not solved (policy.bounds is empty): re-create the plan with "
                    "memo-sim whatif --policy sppo, which solves it")
        if self.bounds[-1] != seq:
            return f"the subsequence bounds end at {self.bounds[-1]}, not at the sequence length {seq}"
        g = granule(layout)
        for k in range(self.subseqs):
            if (self.bounds[k + 1] - self.bounds[k]) % g:
                return (f"subsequence {k} ({self.bounds[k + 1] - self.bounds[k]} tokens) does not split into "
                        f"{g} equal SP shards")
        if len(self.alphas) != self.subseqs:
            return "the offload ratios alpha_i are not solved"
        return None

    def stage_pieces(self, model: ModelConfig, layout: Layout, batch: int) -> list[list[Piece]]:
        return stage_pieces(model, batch, self.bounds, layout.pp, self.multiplex, granule(layout))

    # -- bytes of one unit ---------------------------------------------------------------------------
    def unit_offloaded_tensors(self, model: ModelConfig, layout: Layout, batch: int, piece: Piece,
                               cached_kv: bool) -> list[OffloadedTensor]:
        """The rows of one unit's tensors that go to host: alpha_i of the rows of every skeletal
        tensor but lse (and but K and V where they stay cached)."""
        shard = stage_gpu_shard(layout)
        off = offload_token_count(self.alphas[piece.sub], layer_rows(shard, batch, piece.tokens))
        return [OffloadedTensor(name, off, rb) for name, rb in _offloaded_rows(model, shard, cached_kv)]

    def unit_bytes(self, model: ModelConfig, layout: Layout, batch: int, piece: Piece, cached_kv: bool,
                   profile: HardwareProfile, offloaded: bool = True) -> UnitBytes:
        """One unit's bytes (memoised: the planner asks for the same pieces many times)."""
        return _unit_bytes(model, stage_gpu_shard(layout), batch, piece.tokens, float(self.alphas[piece.sub]) if offloaded
                           else 0.0, cached_kv, offloaded, layout.host_pool, profile.host.pinned_rounding)

    def shard_unit_bytes(self, model: ModelConfig, shard: Layout, batch: int, piece: Piece, cached_kv: bool,
                         scheme: str, rounding: str, offloaded: bool = True) -> UnitBytes:
        """`unit_bytes` for a layout already reduced to one stage's GPU shard (pp = dp = 1, no ZeRO)."""
        return _unit_bytes(model, shard, batch, piece.tokens, float(self.alphas[piece.sub]) if offloaded else 0.0,
                           cached_kv, offloaded, scheme, rounding)

    def offload_bytes_of(self, model: ModelConfig, shard: Layout, batch: int, piece: Piece, cached_kv: bool) -> float:
        """Bytes one unit copies to host: floor(alpha_i x rows) rows of the offloadable tensors
        (what `unit_bytes` counts, without building the tensor list)."""
        rows = layer_rows(shard, batch, piece.tokens)
        return offload_token_count(self.alphas[piece.sub], rows) * _offload_row_bytes(model, shard, cached_kv)

    def offloadable_bytes(self, model: ModelConfig, layout: Layout, batch: int, tokens: int,
                          cached_kv: bool = True) -> float:
        """A_i: the bytes of a ``tokens``-long subsequence per layer and GPU that alpha splits."""
        shard = stage_gpu_shard(layout)
        sk = skeletal_bytes(model, shard, batch, tokens)
        return sk["total"] - (kv_cache_bytes(model, shard, batch, tokens) if cached_kv else 0.0)

    def subsequence_offloadable(self, model: ModelConfig, layout: Layout, batch: int) -> list[float]:
        """A_i of every subsequence, the bytes per layer and GPU its units copy to host at alpha_i = 1, which
        alpha_i·A_i = M_threshold splits (`memo_sim.search.sppo`): the offloadable bytes with K and V cached, and for
        the last subsequence also the K and V of the stage's last piece, which no later piece reads and which its
        units offload with the other rows (module docs; the executor's `memo_exec.sppo.kvcache`). Unmultiplexed, that
        piece is the whole last subsequence; multiplexed, the last of its parts (the largest of any stage)."""
        shard = stage_gpu_shard(layout)
        tokens = [self.bounds[i + 1] - self.bounds[i] for i in range(self.subseqs)]
        out = [self.offloadable_bytes(model, layout, batch, t) for t in tokens]
        if out:
            last = max(pieces[-1].tokens for pieces in self.stage_pieces(model, layout, batch))
            out[-1] += kv_cache_bytes(model, shard, batch, last)
        return out

    # -- naming and the plan file ----------------------------------------------------------------------
    def label(self) -> str:
        return f"sppo(N={self.subseqs}{',mux' if self.multiplex else ''}{',len' if self.partition == 'length' else ''})"

    def to_dict(self) -> dict:
        return {"policy": self.name, "alpha": None, "subseqs": self.subseqs, "bounds": list(self.bounds),
                "alphas": [float(a) for a in self.alphas], "partition": self.partition, "multiplex": self.multiplex,
                "threshold_bytes": None if self.threshold_bytes is None else round(self.threshold_bytes)}

    PLAN_FIELDS: ClassVar[tuple[str, ...]] = ("policy", "alpha", "subseqs", "bounds", "alphas", "partition",
                                               "multiplex", "threshold_bytes")

    @classmethod
    def from_dict(cls, d: dict) -> "Sppo":
        unknown = set(d) - set(cls.PLAN_FIELDS)
        if unknown:
            raise MemoError(f"sppo policy: unknown field {sorted(unknown)[0]!r}")
        if d.get("alpha") is not None:
            raise MemoError("sppo policy: alpha is per subsequence (alphas), not one number; give policy.alphas, one "
                            "number in [0, 1] per subsequence, and drop policy.alpha")
        if not isinstance(d.get("multiplex", False), bool):
            raise MemoError(f"sppo policy: multiplex must be true or false, got {d.get('multiplex')!r}")
        thr = d.get("threshold_bytes")
        if thr is not None and (isinstance(thr, bool) or not isinstance(thr, (int, float)) or not math.isfinite(thr)
                                or thr < 0):
            raise MemoError(f"sppo policy: threshold_bytes must be a finite number of bytes >= 0 or null, got {thr!r}")
        try:
            return cls(None, subseqs=d.get("subseqs", 1), bounds=tuple(d.get("bounds") or ()),
                       alphas=tuple(d.get("alphas") or ()), partition=d.get("partition", "flops"),
                       multiplex=d.get("multiplex", False), threshold_bytes=d.get("threshold_bytes"))
        except TypeError as e:
            raise MemoError(f"sppo policy: bad value ({e})") from None


@cache_hash
@dataclass(frozen=True)
class UnitRows:
    """What one unit's offload copies, but for its ratio: the unit's token rows and the (name, bytes per row) of
    each tensor whose first alpha_i of the rows go to host (`_offloaded_rows`); a memo key (its hash kept)."""

    rows: int
    tensors: tuple[tuple[str, float], ...]

    def copies(self, alpha: float, scheme: str, rounding: str) -> tuple[float, float]:
        """(bytes copied to host, pinned host bytes they take) at ratio ``alpha`` (memoised: SPPO's search asks for
        the same units at the same ratios many times)."""
        return _unit_copies(self, alpha, scheme, rounding)


@lru_cache(maxsize=1 << 16)
def _unit_copies(unit: UnitRows, alpha: float, scheme: str, rounding: str) -> tuple[float, float]:
    off = offload_token_count(alpha, unit.rows)
    tensors = [OffloadedTensor(name, off, rb) for name, rb in unit.tensors]
    return copy_bytes(tensors), host_block_bytes(tensors, scheme, rounding) if tensors else 0.0


@lru_cache(maxsize=1 << 12)
def unit_rows(model: ModelConfig, shard: Layout, batch: int, tokens: int, cached_kv: bool) -> UnitRows:
    """The offload rows of a ``tokens``-long piece's unit on one GPU of a stage (``shard``: `stage_gpu_shard`)."""
    return UnitRows(layer_rows(shard, batch, tokens), _offloaded_rows(model, shard, cached_kv))


@lru_cache(maxsize=1 << 16)
def _unit_bytes(model: ModelConfig, shard: Layout, batch: int, tokens: int, alpha: float, cached_kv: bool,
                offloaded: bool, scheme: str, rounding: str) -> UnitBytes:
    sk = skeletal_bytes(model, shard, batch, tokens)
    copied, host = (unit_rows(model, shard, batch, tokens, cached_kv).copies(alpha, scheme, rounding) if offloaded
                    else (copy_bytes([]), 0.0))
    return UnitBytes(sk["total"], kv_cache_bytes(model, shard, batch, tokens), sk["lse"], copied, host, cached_kv)


@lru_cache(maxsize=1024)
def _offloaded_rows(model: ModelConfig, shard: Layout, cached_kv: bool) -> tuple[tuple[str, float], ...]:
    """(name, bytes per row) of each tensor whose first alpha_i of a unit's rows go to host: every skeletal tensor
    but lse, and but K and V where they stay cached (the module docs' two-level activation management)."""
    return tuple((t.name, row_bytes(t, shard)) for t in saved_tensors(model, shard)
                 if t.role in ("input", "attn", "other") and not (cached_kv and t.name in KV_TENSORS))


@lru_cache(maxsize=1024)
def _offload_row_bytes(model: ModelConfig, shard: Layout, cached_kv: bool) -> float:
    return float(sum(rb for _name, rb in _offloaded_rows(model, shard, cached_kv)))


def granule(layout: Layout) -> int:
    """Tokens a subsequence (or piece) length must be a multiple of: the TP+SP degree."""
    return layout.tp if layout.sp else 1


def unit_is_offloaded(unit: int, n_units: int) -> bool:
    """A stage's units but its last two go to host (`memo_sim.policy.rounding_buffers`)."""
    return is_offloaded(unit, n_units)
