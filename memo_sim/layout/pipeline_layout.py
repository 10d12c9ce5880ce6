"""A pipeline's layers per model chunk, written as Megatron-LM's ``--pipeline-model-parallel-layout``
string (``Layout.chunk_layers``: one count per virtual stage; model chunk c of pipeline rank s is
virtual stage ``c x pp + s``, as everywhere in memo).

The string (Megatron-Core's ``PipelineParallelLayerLayout``, docs/api-guide/pipeline_parallel_layout.md):
virtual stages in order, split by ``|``; ``E`` the embedding, ``t`` a transformer layer, ``m`` a
multi-token-prediction layer, ``L`` the loss; ``X*n`` repeats a symbol and ``(...)*n`` a group (which
may hold ``|``); commas are cosmetic. ``"Et*3|(tt|)*29,m|L"`` is DeepSeek-V3 on PP 16 x VPP 2. The
number of stages over ``pp`` is the virtual stages per rank.

What memo takes from it: the transformer layers of each stage. The first stage may hold the
embedding alone (``E|...``) and the last the loss alone (``...|L``): model chunks of one slot, as
Megatron's docs write DeepSeek-V3's last stage (``m|L``) and as its
--account-for-embedding/loss-in-pipeline-split make where the slots split one a chunk. It refuses,
naming the option, what it does not model: multi-token-prediction layers (``m``) anywhere but beside the loss
on the last stage, or other than the model's count (memo prices them with the loss: `memo_sim.cost.boundary`;
a model with them needs them written, as Megatron builds none a layout leaves out), an embedding anywhere but the
first stage or a loss anywhere but the last (memo prices them there), and any other stage without a
transformer layer (Megatron allows an empty stage; memo's chunks between the ends each run at least
one layer).

The same counts come from other frameworks' own rules (torchtitan's generated split over virtual
stages, `torchtitan_split`), so a plan states its split once, as counts, whatever wrote it.
"""

from __future__ import annotations

import re

from memo_sim.errors import MemoError

OPTION = "--pipeline-model-parallel-layout"
_SYMBOLS = frozenset("EtmL")
_MAX_EXPANDED = 1 << 16  # symbols after expansion: a typo like (t|)*99999999 is refused, not built


def _bad(text: str, why: str) -> MemoError:
    return MemoError(f"{OPTION} {text!r}: {why}")


def _expand(text: str) -> str:
    """The layout with every repetition written out: symbols and ``|`` only."""
    src = re.sub(r"[\s,]", "", text)
    pos = 0

    def seq(depth: int) -> str:
        nonlocal pos
        out = []
        while pos < len(src):
            ch = src[pos]
            if ch == ")":
                if depth == 0:
                    raise _bad(text, "a ')' closes no '('")
                return "".join(out)
            if ch == "(":
                pos += 1
                inner = seq(depth + 1)
                if pos >= len(src) or src[pos] != ")":
                    raise _bad(text, "a '(' is never closed")
                pos += 1
                item = inner
            elif ch in _SYMBOLS or ch == "|":
                item = ch
                pos += 1
            else:
                raise _bad(text, f"{ch!r} is not a layout symbol (E, t, m, L, |, parentheses, *n, commas)")
            if pos < len(src) and src[pos] == "*":
                m = re.match(r"\*(\d+)", src[pos:])
                if not m:
                    raise _bad(text, "a '*' takes a count")
                if item == "|":
                    raise _bad(text, "'|*n' repeats a separator: write (...|)*n")
                pos += len(m.group(0))
                if len(item) * int(m.group(1)) > _MAX_EXPANDED:  # checked before it is built
                    raise _bad(text, f"expands to more than {_MAX_EXPANDED} symbols")
                item = item * int(m.group(1))
            out.append(item)
            if sum(map(len, out)) > _MAX_EXPANDED:
                raise _bad(text, f"expands to more than {_MAX_EXPANDED} symbols")
        if depth:
            raise _bad(text, "a '(' is never closed")
        return "".join(out)

    return seq(0)


def parse_layout(text: str, n_layers: int, pp: int, mtp_layers: int = 0) -> tuple[int, ...]:
    """The transformer layers of each virtual stage of ``text`` (module docs), checked against the
    model's ``n_layers`` and ``mtp_layers`` and the pipeline's ``pp`` ranks; a `MemoError` naming the option
    otherwise."""
    if not text or not text.strip():
        raise _bad(text, "empty; write the stages split by '|', e.g. Et*4|t*4|t*4|t*4L")
    stages = _expand(text).split("|")
    if len(stages) % pp:
        raise _bad(text, f"{len(stages)} stages do not divide over --pp {pp} pipeline ranks (each rank holds "
                         "stages / pp model chunks)")
    written = sum(st.count("m") for st in stages)
    if written != mtp_layers:
        raise _bad(text, f"{written} multi-token-prediction layers (m), the model has {mtp_layers}: "
                         + ("write them before the loss on the last stage (...mL)" if mtp_layers else
                            "plan the model with them (--mtp-layers) or drop them"))
    for i, st in enumerate(stages):
        if "m" in st and i != len(stages) - 1:
            raise _bad(text, f"stage {i} holds a multi-token-prediction layer (m): memo prices them with the loss on "
                             "the last stage (a stage of their own, Megatron's standalone placement, is not modelled); "
                             "write them there (...mL)")
        if "m" in st and not st.endswith("m" * written + "L"):
            raise _bad(text, f"stage {i} places its multi-token-prediction layers (m) elsewhere than after its "
                             "transformer layers and right before the loss; write ...mL")
        if "E" in st and i:
            raise _bad(text, f"stage {i} holds the embedding: memo prices it on the first stage only")
        if "L" in st and i != len(stages) - 1:
            raise _bad(text, f"stage {i} holds the loss: memo prices it on the last stage only")
        if st.count("E") > 1 or st.count("L") > 1:
            raise _bad(text, f"stage {i} holds the embedding or the loss twice")
        if "t" not in st and st.replace("m", "") not in ("E", "L"):
            raise _bad(text, f"stage {i} has no transformer layer: a model chunk runs at least one in memo, but for a "
                             "first stage of the embedding alone (E|...) and a last of the loss alone (...|L)")
    if "E" not in stages[0] or "L" not in stages[-1]:
        raise _bad(text, "the first stage must hold the embedding (E) and the last the loss (L)")
    counts = tuple(st.count("t") for st in stages)
    if sum(counts) != n_layers:
        raise _bad(text, f"{sum(counts)} transformer layers (t), the model has {n_layers}")
    return counts


def format_layout(counts: tuple[int, ...], mtp_layers: int = 0) -> str:
    """Megatron-LM's layout string of ``counts`` (one per virtual stage, the embedding on the first, the
    loss on the last, ``mtp_layers`` multi-token-prediction layers before it), runs of equal middle stages
    written as a group: ``Et*7|(t*8|)*14,t*7L``."""
    if not counts:
        raise MemoError("format_layout: no stages")

    def t(k: int) -> str:  # a chunk of no layer holds the embedding or the loss alone
        return "" if k == 0 else "t" if k == 1 else f"t*{k}"

    tail = "m" * mtp_layers + "L"
    if len(counts) == 1:
        return f"E{t(counts[0])}{tail}"
    parts = [f"E{t(counts[0])}|"]
    mid = counts[1:-1]
    i = 0
    while i < len(mid):
        j = i
        while j < len(mid) and mid[j] == mid[i]:
            j += 1
        run = j - i
        parts.append(f"({t(mid[i])}|)*{run}," if run > 1 else f"{t(mid[i])}|")
        i = j
    parts.append(f"{t(counts[-1])}{tail}")
    return "".join(parts)


def counts_label(counts: tuple[int, ...]) -> str:
    """Run-length counts for a layout label: ``7-8x14-7``."""
    out, i = [], 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        out.append(f"{counts[i]}x{j - i}" if j - i > 1 else str(counts[i]))
        i = j
    return "-".join(out)


def torchtitan_split(n_layers: int, stages: int) -> tuple[int, ...]:
    """torchtitan's generated split over ``stages`` virtual stages (torchtitan@9dec370
    ``pipelining_utils.generate_split_points``): the first stage ``n_layers // stages`` layers, each middle
    one a layer more while the remainder lasts, the last the rest."""
    if stages < 1 or n_layers < stages:
        raise MemoError(f"{n_layers} layers cannot split into {stages} pipeline stages")
    base, extra = divmod(n_layers, stages)
    middle = [base + 1 if i < extra else base for i in range(stages - 2)]
    if stages == 1:
        return (n_layers,)
    return (base, *middle, n_layers - base - sum(middle))
