"""How evenly routed tokens fall on the expert-parallel ranks (``Layout.moe_balance``): a named
input, because the step waits for the busiest rank (its expert GEMMs, and the all-to-all that
waits for it) and no simulator can know a router's loads in advance.

- ``forced``: every expert gets the same number of tokens: load factor 1. torchtitan's
  ``debug.moe_force_load_balance`` routes so (round-robin: copy i of a rank's tokens to expert i mod E,
  ``_debug_force_load_balance_routing`` in torchtitan/models/common/moe.py at b5bcd76c, since 99fee810b,
  2025-10-03). Megatron-Core's ``--moe-router-force-load-balancing`` does not: that is ``random``.
- ``random``: Megatron-Core's ``--moe-router-force-load-balancing`` (RandomSTE in
  megatron/core/transformer/moe/moe_utils.py from its first commit 022bcb5afe, 2025-05-24, to d98e8a64):
  the gate's logits replaced by normal random numbers drawn per token on each rank (their gradient passed
  straight through), so each token's k experts are a uniform draw and the loads those of uniform random
  routing: balanced on average, the busiest rank as ``dropless`` prices it (below), not 1.
- ``dropless`` (default): every routed token is computed, none dropped; the loads are those of a
  router that sends each token copy to an expert uniformly at random (what balancing aims at):
  the busiest of ``ep`` ranks receiving N copies in all holds the binomial's expected maximum,
  about N/ep + sqrt(2 ln ep · N/ep · (1 - 1/ep)) (the Gaussian tail bound on the maximum of ep
  near-independent counts). Real routers are less even than uniform, above all early in training:
  where the loads are known, ``capacity:F`` bounds them.
- ``capacity:F``: each expert processes exactly F times its even share (GShard's capacity factor,
  Megatron-Core's ``--moe-expert-capacity-factor F --moe-pad-expert-input-to-capacity``): tokens
  over capacity are dropped, experts under it padded, so the load factor is F on every rank.
- ``measured:eE:1=f1,2=f2,...``: dropless with a router's measured loads (`measured_balance` from a
  file of per-expert token counts, one row per MoE layer, as a router log records them): for each EP
  degree dividing the E experts, the mean over the layers of the busiest rank's load over the mean,
  the ranks holding contiguous experts (Megatron-Core's local experts of EP rank r are r x E/ep ..
  (r + 1) x E/ep - 1). Every layer's experts wait for their own busiest rank, so the mean of the
  layers' factors is the factor of their summed time. Kept in the plan as numbers (no file needed to
  read it back), for E experts only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

MAX_CAPACITY = 64.0
SIMPLE = ("forced", "random", "dropless")  # the settings without a parameter
KINDS = SIMPLE + ("capacity", "measured")


@dataclass(frozen=True)
class Balance:
    kind: str  # forced | random | dropless | capacity | measured
    capacity: float = 1.0
    experts: int = 0  # measured: the expert count the loads were measured for
    factors: tuple[tuple[int, float], ...] = ()  # measured: (EP degree, load factor)

    @property
    def words(self) -> str:
        """How the loads are priced, in a phrase (the what-if's header line)."""
        return {"forced": "forced: every expert the same tokens (load factor 1)",
                "random": "random router logits (Megatron-Core's --moe-router-force-load-balancing): the busiest EP "
                          "rank of uniform random routing",
                "dropless": "dropless at a uniform router's loads (the busiest EP rank of top-k multinomial routing)",
                "capacity": f"capacity factor {self.capacity:g}: every expert padded or dropped to {self.capacity:g} "
                            f"x its share",
                "measured": f"dropless at the router's measured loads ({self.experts} experts)"}[self.kind]

    def load_factor(self, copies: float, ep: int, experts: int = 0, top_k: int = 1) -> float:
        """The busiest EP rank's routed tokens over the mean, for ``copies`` token copies routed in
        the EP group. ``experts``, ``top_k``: the model's (0: not given), which cap a capacity factor at E/k
        (`capacity_load`; the layout check refuses more, `capacity_why_not`)."""
        if self.kind == "measured":  # every EP degree dividing the experts has its factor (`parse_balance`)
            return dict(self.factors)[ep]
        if self.kind == "capacity":
            return capacity_load(self.capacity, experts, top_k) if experts else self.capacity
        if self.kind == "forced" or ep <= 1:
            return 1.0
        return uniform_busiest(copies, ep)


def uniform_busiest(copies: float, ep: int) -> float:
    """The busiest of ``ep`` ranks' expected share of ``copies`` token copies routed uniformly at random, over
    the mean (module docs: ``dropless``, ``random``)."""
    mean = copies / ep
    if ep <= 1 or mean <= 0:
        return 1.0
    return 1.0 + math.sqrt(2.0 * math.log(ep) * (1.0 - 1.0 / ep) / mean)


def balance_why_not(text: str) -> str | None:
    """Why ``text`` is not a balance setting, or None."""
    try:
        parse_balance(text)
    except ValueError as e:
        return str(e)
    return None


def capacity_ceiling(experts: int, top_k: int) -> float:
    """The largest capacity factor that means something for ``experts`` routed experts, each token routed to
    ``top_k``: E/k. An expert's capacity ceil(T x k / E x F) cannot exceed the T tokens of the group routed (no expert
    gets more than every token): memo_exec/moe/capacity.py's ``capacity`` is min(T, ceil(T k / E F)), and
    Megatron-Core's ``apply_router_token_dropping`` (megatron/core/transformer/moe/moe_utils.py at NVIDIA/Megatron-LM
    00611e6e) keeps every token where the capacity exceeds them (earlier versions ran ``torch.topk(routing_probs,
    k=expert_capacity, dim=0)`` unguarded, which raises when k > T). So the load factor of ``capacity:F`` is
    min(F, E/k) (`capacity_load`)."""
    return experts / top_k


def capacity_load(factor: float, experts: int, top_k: int) -> float:
    """The busiest rank's load factor under ``capacity:factor`` (every expert padded or dropped to its capacity):
    min(F, E/k), the executor's rule (`capacity_ceiling`)."""
    return min(factor, capacity_ceiling(experts, top_k))


def capacity_why_not(balance: Balance, experts: int, top_k: int) -> str | None:
    """Why ``capacity:F`` is not a setting for a model of ``experts`` experts routed ``top_k`` each, or None: an F
    above E/k (`capacity_ceiling`) asks for more than every token at each expert, so its load factor is E/k and the
    F above it is a typo or a misread of the capacity (a review: capacity:8 on Mixtral, E/k = 4, was priced at 8,
    twice the work and dispatch buffers the executor and Megatron-Core run, and exported as
    --moe-expert-capacity-factor 8)."""
    if balance.kind != "capacity":
        return None
    top = capacity_ceiling(experts, top_k)
    if balance.capacity > top * (1 + 1e-9):
        return (f"moe balance capacity:{balance.capacity:g}: a capacity factor caps at experts / top-k = "
                f"{experts}/{top_k} = {top:g} (an expert's capacity cannot exceed every token, so capacity:{top:g} "
                f"runs the same); give --moe-balance capacity:{top:g} or less")
    return None


def measured_why_not(balance: Balance, experts: int, top_k: int = 1) -> str | None:
    """Why ``balance`` cannot price a model of ``experts`` routed experts, each token routed to ``top_k`` distinct
    ones, or None: a capacity factor above E/k (`capacity_why_not`), or measured loads of another model or above what
    top-k routing sends one expert. Top-k routing gives no expert more than 1/k of a layer's copies, so the
    one-expert-a-rank factor (the mean over the layers of the busiest expert's count over the mean count) is at most
    E/k (a review: a file with one expert holding every copy of a top-8 model was taken as measured loads). The
    name is kept for its callers (the what-if's request check and `memo_sim.layout.parallel.expert_why_not`, the
    layout/model check of a plan read from anywhere)."""
    if balance.kind == "capacity":
        return capacity_why_not(balance, experts, top_k)
    if balance.kind != "measured":
        return None
    if balance.experts != experts:
        return (f"moe balance measured: the loads are of {balance.experts} experts, the model has {experts}; "
                f"measure the model's own router")
    alone = dict(balance.factors).get(experts, 1.0)
    if alone > experts / top_k * (1 + 1e-3):
        return (f"moe balance measured: the busiest expert holds {alone / experts:.1%} of a layer's routed copies on "
                f"average, more than the 1/{top_k} a top-{top_k} router can send one expert (each token goes to "
                f"{top_k} distinct experts); give per-expert counts of routed token copies, every layer's summing "
                f"to top-k x its tokens")
    return None


def measured_balance(loads: list[list[float]]) -> str:
    """The ``measured:`` setting of per-expert token counts (one row per MoE layer, every row the
    same length E): for each EP degree dividing E, the mean over the rows of the busiest contiguous
    block of E/ep experts' share over the mean (module docs). ValueError naming what is wrong."""
    rows = [list(r) for r in loads]
    if not rows or not all(rows):
        raise ValueError("measured loads: no layer's expert counts given")
    e = len(rows[0])
    if any(len(r) != e for r in rows):
        raise ValueError(f"measured loads: every layer needs {e} expert counts (the first layer's), got "
                         f"{sorted({len(r) for r in rows})}")
    if e < 2 or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0
                    for r in rows for x in r):
        raise ValueError("measured loads: at least 2 experts, each count a finite number >= 0")
    if any(not 0 < sum(r) < math.inf for r in rows):
        raise ValueError("measured loads: a layer's counts must sum to a finite number above 0")
    out = []
    for ep in (d for d in range(1, e + 1) if e % d == 0):
        k = e // ep
        f = sum(max(sum(r[i * k:(i + 1) * k]) for i in range(ep)) * ep / sum(r) for r in rows) / len(rows)
        out.append(f"{ep}={f:.4f}")
    return f"measured:e{e}:" + ",".join(out)


def parse_balance(text: str) -> Balance:
    """``forced``, ``random``, ``dropless``, ``capacity:F`` (F a number in (0, 64]) or ``measured:eE:ep=f,...``;
    ValueError naming the forms. A text is parsed once (`Layout.balance` reads it at every check and cost of a MoE
    layout; a query has a few texts); anything else (a value read from a file) each time, to be refused."""
    return _parse_balance(text) if isinstance(text, str) else _parse_balance.__wrapped__(text)


@lru_cache(maxsize=256)
def _parse_balance(text: str) -> Balance:
    if text in SIMPLE:
        return Balance(text)
    if isinstance(text, str) and text.startswith("measured:"):
        try:
            _m, e, table = text.split(":", 2)
            experts = int(e.removeprefix("e"))
            factors = tuple((int(a), float(b)) for a, b in (kv.split("=") for kv in table.split(",")))
        except ValueError:
            raise ValueError(f"moe balance measured must read measured:eE:1=f,2=f,... (from a loads file), got "
                             f"{text!r}") from None
        divisors = [d for d in range(1, experts + 1) if experts % d == 0] if 2 <= experts <= 1 << 20 else []
        if not divisors or sorted(d for d, _f in factors) != divisors or any(not 1.0 <= f <= d for d, f in factors):
            raise ValueError(f"moe balance {text!r}: one load factor for each EP degree dividing the experts (1 .. "
                             f"{experts}), each between 1 and its degree")
        return Balance("measured", experts=experts, factors=factors)
    if isinstance(text, str) and text.startswith("capacity:"):
        try:
            f = float(text.split(":", 1)[1])
        except ValueError:
            f = float("nan")
        if 0 < f <= MAX_CAPACITY:
            return Balance("capacity", f)
    raise ValueError(f"moe balance must be forced, random, dropless, capacity:F (F a capacity factor in "
                     f"(0, {MAX_CAPACITY:g}]) "
                     f"or loads:FILE (measured per-expert token counts), got {text!r}")
