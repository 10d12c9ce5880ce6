"""Parallel layouts and the rules that make one valid.

Rank order, innermost first: TP, Ulysses, CP, DP. So a TP group is ``tp`` consecutive GPUs (kept
inside a node), and a group of degree g whose ranks are ``stride`` apart spans nodes when
``g * stride > gpus_per_node``.

Model states (weights, gradients, optimizer states) are replicated across every rank that holds
the same weights, i.e. the DP x CP x Ulysses group; ZeRO stage z shards them over that group:
stage 1 the optimizer states, 2 also the gradients, 3 also the weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import product

from memo_sim.errors import MemoError
from memo_sim.model.config import ModelConfig


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    sp: bool = True  # Megatron sequence parallelism (only meaningful with tp > 1)
    cp: int = 1  # ring context parallelism (zigzag, load-balanced causal)
    ulysses: int = 1  # DeepSpeed-Ulysses sequence parallelism (all-to-all over heads)
    dp: int = 1
    zero: int = 0

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.ulysses * self.dp

    @property
    def seq_split(self) -> int:
        """How many ways one sequence's tokens are split outside TP."""
        return self.cp * self.ulysses

    @property
    def state_shards(self) -> int:
        """Size of the group that holds identical weights (DP x CP x Ulysses)."""
        return self.dp * self.cp * self.ulysses

    def label(self) -> str:
        parts = [f"tp{self.tp}{'+sp' if self.sp and self.tp > 1 else ''}"]
        if self.ulysses > 1:
            parts.append(f"uly{self.ulysses}")
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.dp > 1:
            parts.append(f"dp{self.dp}")
        if self.zero:
            parts.append(f"z{self.zero}")
        return "-".join(parts)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, source: str = "layout") -> "Layout":
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise MemoError(f"{source}: unknown layout field {sorted(unknown)[0]!r}")
        return cls(**d)


def group_spans_nodes(size: int, stride: int, gpus_per_node: int) -> bool:
    return size > 1 and size * stride > gpus_per_node


def check_layout(layout: Layout, model: ModelConfig, gpus: int, gpus_per_node: int,
                 seq: int, batch: int = 1) -> str | None:
    """Return None if the layout is valid, else the reason it is rejected."""
    for f in ("tp", "cp", "ulysses", "dp"):
        v = getattr(layout, f)
        if not isinstance(v, int) or v < 1:
            return f"{f} must be a positive integer"
    if layout.zero not in (0, 1, 2, 3):
        return "zero must be 0, 1, 2 or 3"
    if layout.gpus != gpus:
        return f"tp x ulysses x cp x dp = {layout.gpus}, not the {gpus} GPUs asked for"
    if layout.tp > gpus_per_node or gpus_per_node % layout.tp:
        return f"tp={layout.tp} must divide the {gpus_per_node} GPUs of a node (TP stays inside a node)"
    if model.heads % (layout.tp * layout.ulysses):
        return f"heads ({model.heads}) not divisible by tp x ulysses ({layout.tp * layout.ulysses})"
    if model.n_kv_heads % layout.tp and layout.tp % model.n_kv_heads:
        return f"kv heads ({model.n_kv_heads}) and tp ({layout.tp}) do not divide each other"
    if model.ffn % layout.tp:
        return f"ffn ({model.ffn}) not divisible by tp ({layout.tp})"
    chunks = layout.ulysses * layout.cp * (2 if layout.cp > 1 else 1) * (layout.tp if layout.sp else 1)
    if seq % chunks:
        return f"sequence length {seq} not divisible into {chunks} equal chunks (ulysses x 2cp x tp)"
    if layout.zero and layout.state_shards == 1:
        return "ZeRO needs a data/context-parallel group larger than 1"
    if batch < 1:
        return "batch must be at least 1"
    return None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(model: ModelConfig, gpus: int, gpus_per_node: int, seq: int, *,
                      tp: int | None = None, cp: int | None = None, ulysses: int | None = None,
                      dp: int | None = None, zero: int | None = None, sp: bool | None = None,
                      ) -> tuple[list[Layout], list[tuple[Layout, str]]]:
    """All layouts for ``gpus`` GPUs matching the fixed degrees; (valid, [(rejected, reason)])."""
    valid: list[Layout] = []
    rejected: list[tuple[Layout, str]] = []
    choices = lambda fixed: [fixed] if fixed is not None else _divisors(gpus)  # noqa: E731
    for t, c, u in product(choices(tp), choices(cp), choices(ulysses)):
        if gpus % (t * c * u):
            continue
        d = gpus // (t * c * u)
        if dp is not None and d != dp:
            continue
        sps = [sp] if sp is not None else ([True, False] if t > 1 else [True])
        zs = [zero] if zero is not None else ([0, 1, 2, 3] if d * c * u > 1 else [0])
        for s, z in product(sps, zs):
            lay = Layout(tp=t, sp=s if t > 1 else True, cp=c, ulysses=u, dp=d, zero=z)
            why = check_layout(lay, model, gpus, gpus_per_node, seq)
            (rejected.append((lay, why)) if why else valid.append(lay))
    if dp is not None and tp is not None and cp is not None and ulysses is not None and not valid and not rejected:
        lay = Layout(tp=tp, cp=cp, ulysses=ulysses, dp=dp, zero=zero or 0, sp=True if sp is None else sp)
        rejected.append((lay, check_layout(lay, model, gpus, gpus_per_node, seq) or "inconsistent degrees"))
    return valid, rejected
