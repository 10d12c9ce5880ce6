"""A what-if question as one typed object, and its answer: what `memo-sim whatif` asks and
`memo_sim.api.whatif` asks, built the same way and answered by the same code.

`WhatifRequest` holds the question: the model, sequence, cluster and profile, the degrees and
options that fix parts of the search, and tier 2's settings. `answer_whatif` ranks it
(`memo_sim.search.whatif.rank`), adds the named framework's comparison with memo's best and the
advice when nothing fits; `WhatifAnswer.plans` builds the plans to write (`Candidate.to_plan`, memory
plan included). A new option is one field here (with its default: "not fixed") and, for the
command, one click option of the same name; an option that narrows the searched space is also
named in `FIXING` (`candidates_for`'s keywords), a setting of the search itself is passed on by
`answer_whatif`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields, replace

from memo_sim.layout.parallel import MAX_DEGREE, check_layout, with_ep_overlap
from memo_sim.layout.schedule import schedule_runs_policy
from memo_sim.policy import prices_model
from memo_sim.model.config import ModelConfig, framework_field_moves
from memo_sim.plan.schema import Plan
from memo_sim.profile.attention_kernels import ATTENTION_KERNELS
from memo_sim.profile.schema import HardwareProfile
from memo_sim.search.prune import SIMULATE_BOUND, below, parse_simulate_top
from memo_sim.search.candidate import Candidate
from memo_sim.cost.gemm_format import check_gemm_format, for_profile
from memo_sim.errors import MemoError
from memo_sim.frameworks import mechanism_changes
from memo_sim.search.frameworks import get_framework
from memo_sim.search.whatif import (NO_VALID_LAYOUT, WhatIfResult, candidates_for, not_searched, rank,
                                    simulate_variant)

# the fields that fix part of the searched space (`candidates_for`'s keywords, `not_searched`'s advice)
FIXING = ("batch", "global_batch", "micro_batch", "tp", "cp", "ulysses", "dp", "zero", "sp", "alpha", "tp_mode",
          "metp_across_nodes", "pp", "vpp", "schedules", "subseqs", "partition", "multiplex", "optimizer_offload",
          "first_stage_layers", "last_stage_layers", "chunk_layers", "ep", "etp", "moe_dispatcher", "moe_balance", "dp_mode",
          "alloc_conf", "allocator", "rank_order", "ep_overlap", "kernel_fusion", "attention", "grad_overlap")
SPPO_FLAGS = ("subseqs", "partition", "multiplex")  # SPPO's own options: with none of --policy, they plan SPPO


# `memo-sim whatif`'s options by the request's field they set (a test holds it to the command's options): an error
# the search raises in the command's words is raised through `memo_sim.api.whatif` in the request's (`in_request_words`)
FIELD_FLAGS = {
    "seq": "--seq", "gpus": "--gpus", "batch": "--batch", "global_batch": "--global-batch",
    "micro_batch": "--micro-batch", "tp": "--tp", "cp": "--cp", "ulysses": "--ulysses", "dp": "--dp", "zero": "--zero",
    "sp": "--sp", "optimizer_offload": "--optimizer-offload", "tp_mode": "--tp-mode",
    "metp_across_nodes": "--metp-across-nodes", "ep": "--ep", "etp": "--etp", "moe_dispatcher": "--moe-dispatcher",
    "moe_balance": "--moe-balance", "ep_overlap": "--ep-overlap", "dp_mode": "--dp-mode", "alloc_conf": "--alloc-conf", "allocator": "--allocator",
    "kernel_fusion": "--kernel-fusion", "attention": "--attention", "grad_overlap": "--grad-overlap",
    "rank_order": "--rank-order", "policies": "--policy", "alpha": "--alpha", "pp": "--pp", "vpp": "--vpp",
    "first_stage_layers": "--decoder-first-pipeline-num-layers",
    "last_stage_layers": "--decoder-last-pipeline-num-layers", "chunk_layers": "--pipeline-model-parallel-layout",
    "schedules": "--schedule", "subseqs": "--subseqs", "partition": "--partition", "multiplex": "--multiplex",
    "framework": "--framework", "simulate_top": "--simulate-top", "allocator_lag": "--allocator-lag", "jobs": "--jobs",
}
BOOL_FLAGS = ("sp", "optimizer_offload", "multiplex", "metp_across_nodes", "ep_overlap", "grad_overlap")  # --x is x=True, --no-x x=False
# the command's options that are not the request's fields, in the request's words (the model's own options set
# fields of the ModelConfig; the profile's is the request's profile)
_OTHER_WORDS = {
    "--layers/--hidden/...": "a ModelConfig", "--decoder-first/last-pipeline-num-layers":
    "first_stage_layers/last_stage_layers", "--model": "model", "--profile": "profile",
    **{f"--{f.replace('_', '-')}": f"model.{f}" for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn",
                                                          "vocab", "dtype", "mtp_layers")},
    "--precision": "model.precision or model.gemm_format",  # --precision RECIPE,FORMAT sets both (a review)
}


_ONE_OF = {"policies": "policy", "schedules": "schedule"}  # the list fields, by what one of their names is


def _flag_words() -> dict[str, str]:
    """Each option of the command (``--no-sp`` too) by the request's words for it."""
    words = {flag: name for name, flag in FIELD_FLAGS.items()}
    for name in BOOL_FLAGS:
        words[FIELD_FLAGS[name]] = f"{name}=True"
        words["--no-" + FIELD_FLAGS[name][2:]] = f"{name}=False"
    return {**words, **_OTHER_WORDS}


def in_request_words(message: str) -> str:
    """``message`` (an error the search raises in `memo-sim whatif`'s words) with the command's options named as the
    request's fields: ``--tp 3 does not divide the 8 GPUs of --gpus`` reads ``tp=3 does not divide the 8 GPUs of
    gpus``, ``--schedule 'bogus' unknown`` ``schedules='bogus' unknown``; a message that names an option gets the
    prefix ``WhatifRequest: ``. Other tools' flags (Megatron-LM's ``--micro-batch-size``) are left as they are, and so
    is a command the message tells the user to run (``memo-sim whatif --seq 128K ...``, or anything in backticks): a
    review found such a command rewritten into one that does not run."""
    out, pos, named = [], 0, False
    for m in _COMMAND_TEXT.finditer(message):
        text, n = _fields_for_flags(message[pos:m.start()])
        out += [text, m.group(0)]
        named, pos = named or n > 0, m.end()
    text, n = _fields_for_flags(message[pos:])
    text = "".join(out) + text
    return f"WhatifRequest: {text}" if (named or n > 0) and not text.startswith("WhatifRequest") else text


# a command line inside a message (run as written, so never rewritten): backticks, or memo-sim / memo-exec to the
# end of its clause
_COMMAND_TEXT = re.compile(r"`[^`]*`|\bmemo-(?:sim|exec)\b[^;()]*")


def _fields_for_flags(message: str) -> tuple[str, int]:
    """`in_request_words` of a stretch of text with no command line in it, and how many options it named."""
    words = _flag_words()
    pattern = re.compile(r"(?<![\w-])(" + "|".join(re.escape(f) for f in sorted(words, key=len, reverse=True))
                         + r")(?![\w-])")
    known: set[str] | None = None
    out, pos = [], 0
    for m in pattern.finditer(message):
        out.append(message[pos:m.start()])
        name, pos = words[m.group(1)], m.end()
        if name in FIELD_FLAGS:  # an option taking a value: its value follows where one does
            t = re.match(r" ('[^']*'|\"[^\"]*\"|[^\s;,()]+)", message[pos:])
            tok = t.group(1) if t else ""
            colon = tok.endswith((":", ".")) and len(tok) > 1  # a value ending a clause or a sentence
            bare = tok[:-1] if colon else tok
            if known is None:
                known = _choice_words()
            if tok[:1] in ("'", '"') or re.fullmatch(r"-?\d+(\.\d+)?[KMGkmg]?", bare):
                value = bare
            elif colon or bare in known:
                value = repr(bare)
            else:
                value = None
            if value is not None:
                out.append(f"{name}={value}" + (tok[-1] if colon else ""))
                pos += t.end()
                continue
        if name in _ONE_OF and out[-1].endswith("another "):  # "choose another --policy": one name of the list
            name = f"{_ONE_OF[name]} in {name}"
        out.append(name)
    out.append(message[pos:])
    return "".join(out), len(out) - 1


def _choice_words() -> set[str]:
    """The names an option takes (policies, schedules, frameworks, flavours, orders): ``--policy sppo`` reads
    ``policies='sppo'``."""
    from memo_sim.dp import DP_MODES  # noqa: PLC0415
    from memo_sim.layout.rank_order import RANK_ORDER_NAMES  # noqa: PLC0415
    from memo_sim.layout.schedule import SCHEDULE_NAMES  # noqa: PLC0415
    from memo_sim.policy import policy_names  # noqa: PLC0415
    from memo_sim.search.frameworks import FRAMEWORKS  # noqa: PLC0415
    from memo_sim.search.whatif import TP_MODE_CHOICES  # noqa: PLC0415

    return {*policy_names(), *SCHEDULE_NAMES, *FRAMEWORKS, *TP_MODE_CHOICES, *DP_MODES, *RANK_ORDER_NAMES, "all",
            "bound", "caching", "plan", "both", "flops", "length", "explicit"}


def _in_request_words(make, field_name: str):
    """``make()``, a `MemoError` it raises (shared with the command: ``get_model``'s, ``load_profile``'s) re-worded
    for the request (`in_request_words`) and naming ``WhatifRequest.<field_name>``."""
    try:
        return make()
    except MemoError as e:
        text = in_request_words(str(e)).removeprefix("WhatifRequest: ")
        e.args = (f"WhatifRequest.{field_name}: {text}",)
        raise


def tp_flavours_asked(tp_mode: str | None, tp: int | None) -> str:
    """The tensor-parallel flavours a command searches: as asked (``--tp-mode``), else Megatron TP
    where ``--tp`` fixes the degree (``--tp 8`` asks about Megatron TP8), else every flavour (``all``)."""
    if tp_mode is not None:
        return tp_mode
    return "megatron" if tp is not None else "all"


@dataclass(frozen=True)
class WhatifRequest:
    """One what-if question, in the command's units. ``None`` (or an empty tuple) leaves an option to the search.

    ``model``: a `ModelConfig`, a preset's name or a model file's path (a str or Path, as ``--model`` takes it);
    ``seq``: tokens per sequence, a whole number from 1 to 1024M (1G) or a string as the command writes it ("128K",
    "1M"; binary multipliers); ``gpus``: how many GPUs (a count, at most `MAX_DEGREE`); ``profile``: a
    `HardwareProfile`, a profile's name or its file. ``batch``: sequences per data-parallel replica per iteration,
    ``global_batch`` sequences per iteration over every replica, ``micro_batch`` sequences per micro-batch (all
    counts of sequences, not tokens). ``tp``, ``cp``, ``ulysses``, ``dp``, ``pp``, ``vpp``, ``ep``, ``etp``: parallel
    degrees (GPU counts); ``zero`` a ZeRO stage 0 to 3; ``alpha``: the fraction of MEMO's token-wise activations
    offloaded to host, in [0, 1]. ``policies`` and ``schedules``: names (one str or a sequence of them).
    A bad value raises one `MemoError` naming the field (``WhatifRequest.seq``) and the fix; errors raised while
    `memo_sim.api.whatif` answers name the request's fields too (`in_request_words`), where the command names its
    options."""

    model: ModelConfig
    seq: int
    gpus: int
    profile: HardwareProfile
    # the batch split: sequences per replica, or over every replica; sequences per micro-batch
    batch: int | None = None
    global_batch: int | None = None
    micro_batch: int | None = None
    # the layout
    tp: int | None = None
    cp: int | None = None
    ulysses: int | None = None
    dp: int | None = None
    zero: int | None = None
    sp: bool | None = None
    optimizer_offload: bool | None = None  # None: searched where nothing fits without it
    tp_mode: str | None = None  # None: megatron when tp is fixed, else every flavour ("all")
    metp_across_nodes: bool = False
    # mixture-of-experts layouts (`memo_sim.layout.parallel.ExpertChoice`)
    ep: int | None = None
    etp: int | None = None
    moe_dispatcher: str = "alltoall"
    moe_balance: str = "dropless"
    ep_overlap: bool = False  # Megatron-Core's EP all-to-all overlap where a candidate can run it
    dp_mode: str | None = None  # data-parallel flavours searched: zero, fsdp or all (None: the framework's first)
    alloc_conf: str | None = None  # PYTORCH_CUDA_ALLOC_CONF over the framework's (`memo_sim.layout.alloc_conf`)
    kernel_fusion: str | None = None  # fused | compiled | eager over the framework's (`memo_sim.model.kernel_fusion`)
    # the attention kernel over the framework's (`memo_sim.profile.attention_kernels`; None: the framework's)
    attention: str | None = None
    grad_overlap: bool | None = None  # data-parallel gradients reduced beside the backward, or after it (None: the framework's)
    allocator: str = "caching"  # caching | plan | both: who places the transients of policies without MEMO's plan
    rank_order: str | None = None  # rank orders a pipeline is tried in: one, or all (None: the framework's first)
    # the activation policies and schedules
    policies: tuple[str, ...] = ()
    alpha: float | None = None
    pp: int | None = None
    vpp: int | None = None
    first_stage_layers: int | None = None  # uneven pipeline stages (Megatron's --decoder-first-pipeline-num-layers)
    last_stage_layers: int | None = None  # (--decoder-last-pipeline-num-layers)
    chunk_layers: tuple[int, ...] | None = None  # each model chunk's layers (--pipeline-model-parallel-layout)
    schedules: tuple[str, ...] = ()
    subseqs: int | None = None
    partition: str | None = None
    multiplex: bool | None = None
    framework: str = "any"
    # tier 2 (the event simulator)
    simulate_top: int | str = SIMULATE_BOUND  # 'bound' (pruned with proof), 'all', or the analytic tier's best N
    allocator_lag: int = 0
    jobs: int = 1

    def __post_init__(self):
        for name in ("policies", "schedules"):  # a list from a program or click's tuple: one hashable value
            v = getattr(self, name) or ()
            object.__setattr__(self, name, (v,) if isinstance(v, str) else tuple(v))  # one name: not its letters
        self._check()

    def _check(self) -> None:
        """A request built by a program is checked as the command's options are: a `MemoError` naming the field
        and the fix (``seq=0`` raised 'math domain error' deep in the search, ``seq="128K"`` a TypeError, a profile
        name an AttributeError). A profile may be given by name, a sequence as the command writes it ("128K")."""
        from memo_sim.units import MAX_TOKENS, parse_count, tokens_cap_fix  # noqa: PLC0415

        def bad(name: str, fix: str) -> MemoError:
            return MemoError(f"WhatifRequest.{name} = {getattr(self, name)!r}: {fix}")

        if isinstance(self.model, (str, os.PathLike)):  # a preset's name or a model file, as --model takes them
            from memo_sim.model.config import get_model  # noqa: PLC0415

            object.__setattr__(self, "model", _in_request_words(lambda: get_model(self.model), "model"))
        elif not isinstance(self.model, ModelConfig):
            raise bad("model", "give a ModelConfig (memo_sim.api.get_model), a preset's name such as 'llama-3.1-8b' "
                               "or a model file's path (a str or Path)")
        if isinstance(self.profile, (str, os.PathLike)):
            from memo_sim.profile.loader import load_profile  # noqa: PLC0415

            object.__setattr__(self, "profile", _in_request_words(lambda: load_profile(self.profile), "profile"))
        elif not isinstance(self.profile, HardwareProfile):
            raise bad("profile", "give a HardwareProfile (memo_sim.api.load_profile) or a profile's name")
        if isinstance(self.seq, str):
            object.__setattr__(self, "seq", parse_count(self.seq, "WhatifRequest.seq"))
        if isinstance(self.seq, int) and not isinstance(self.seq, bool) and self.seq > MAX_TOKENS:
            raise bad("seq", tokens_cap_fix())
        for name in ("seq", "gpus", "jobs", "batch", "global_batch", "micro_batch", "tp", "cp", "ulysses", "dp",
                     "pp", "vpp", "ep", "etp", "subseqs", "first_stage_layers", "last_stage_layers"):
            v = getattr(self, name)
            if v is None and name not in ("seq", "gpus", "jobs"):
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise bad(name, "give a whole number of at least 1" + ("" if name in ("seq", "gpus", "jobs")
                                                                       else ", or None to search it"))
            if name in ("gpus", "tp", "cp", "ulysses", "dp", "pp", "vpp", "ep", "etp") and v > MAX_DEGREE:
                raise bad(name, f"give at most {MAX_DEGREE:,} (the command's limit: more is a typo, not a cluster)")
        if self.attention is not None and self.attention not in ATTENTION_KERNELS:
            raise bad("attention", f"give one of {', '.join(ATTENTION_KERNELS)}, or None for the framework's")
        for name in ("sp", "optimizer_offload", "multiplex"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise bad(name, "give True, False, or None to search it")
        if self.grad_overlap is not None and not isinstance(self.grad_overlap, bool):
            raise bad("grad_overlap", "give True, False, or None for the framework's")
        if not isinstance(self.metp_across_nodes, bool):
            raise bad("metp_across_nodes", "give True or False")
        if not isinstance(self.ep_overlap, bool):
            raise bad("ep_overlap", "give True or False")
        if isinstance(self.allocator_lag, bool) or not isinstance(self.allocator_lag, int) \
                or not 0 <= self.allocator_lag <= 64:
            raise bad("allocator_lag", "give a whole number from 0 to 64 (layers the GPU lags behind the CPU)")
        for name in ("policies", "schedules"):
            if not all(isinstance(x, str) for x in getattr(self, name)):
                raise bad(name, "give names (strings), e.g. ('memo', 'full_recompute')")
        from memo_sim.policy import policy_names  # noqa: PLC0415

        asked = (self.policies,) if isinstance(self.policies, str) else self.policies
        unknown = [x for x in asked if x not in policy_names()]
        if unknown:  # the registry's own words name no field (a review)
            raise bad("policies", f"policy {unknown[0]!r} unknown; choose from {', '.join(policy_names())}")
        if self.zero is not None and (isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3)):
            raise bad("zero", "give a ZeRO stage 0 to 3, or None to search it")
        if self.alpha is not None and (isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float))
                                       or not 0.0 <= self.alpha <= 1.0):
            raise bad("alpha", "give MEMO's offloaded share from 0 to 1, or None to search it")

    @classmethod
    def from_options(cls, model: ModelConfig, profile: HardwareProfile, options: dict) -> WhatifRequest:
        """The request of a command's options (those named as a field; the rest are ignored)."""
        names = {f.name for f in fields(cls)} - {"model", "profile"}
        return cls(model=model, profile=profile, **{k: v for k, v in options.items() if k in names})

    @property
    def flavour(self) -> str:
        """The tensor-parallel flavours searched (`tp_flavours_asked`)."""
        return tp_flavours_asked(self.tp_mode, self.tp)

    @property
    def searched_policies(self) -> tuple[str, ...] | None:
        """The policies asked for (SPPO's own options ask for sppo); None: the framework's."""
        if self.policies:
            return self.policies
        if any(getattr(self, k) is not None for k in SPPO_FLAGS):
            return ("sppo",)
        return None

    def fixed(self) -> dict:
        """What the request fixes, as `candidates_for`'s keywords."""
        out = {k: getattr(self, k) for k in FIXING}
        out["tp_mode"] = self.flavour
        out["schedules"] = self.schedules or None
        return out

    def search_kwargs(self) -> dict:
        """`candidates_for`'s keywords for the whole request (fixed options, policies, framework)."""
        return dict(self.fixed(), policies=self.searched_policies, framework=self.framework)


@dataclass
class WhatifAnswer:
    """A ranked what-if: the result, memo's own best beside a named framework's, and the advice."""

    request: WhatifRequest
    result: WhatIfResult
    memo_best: Candidate | None = None  # with --framework other than any: what memo would do
    advice: list[str] = field(default_factory=list)  # what was not searched, when nothing fits
    # with a quantised GEMM format (FP8): the same search's best with the model's GEMMs in its own dtype, what
    # FP8 buys (`answer_whatif`); ``bf16_searched`` says whether that search ran (nothing fitting is an answer too)
    bf16_best: Candidate | None = None
    bf16_searched: bool = False
    # with --framework: memo's best simulated with the framework's mechanisms (its tier-2 summary, "layout_label"),
    # which splits the gap between the two bests into mechanisms and memo's own layout and policy
    memo_on_framework: dict | None = None
    # with a pipeline split fixed (--decoder-first/last-pipeline-num-layers, the layout string): the same search's
    # best with the split left to the search, so the answer says what the fixed split costs (`split_words`)
    split_best: Candidate | None = None
    # False: the searches the answer compares its best with were not run (--no-compare; `answer_whatif`)
    compared: bool = True

    @property
    def best(self) -> Candidate | None:
        return self.result.best

    @property
    def sppo_best(self) -> Candidate | None:
        """The best SPPO plan that fits, where the best plan overall is another."""
        c = next((c for c in self.result.candidates if c.sppo is not None and c.status == "OK"), None)
        return None if c is self.best else c

    def plans(self) -> dict[str, Plan]:
        """The plans to write, by file name: plan.json (the best), plan-sppo.json (`sppo_best`)."""
        out = {}
        if self.best is not None:
            out["plan.json"] = self.best.to_plan()  # naming the framework searched for (`Candidate.framework`)
        if self.sppo_best is not None:
            out["plan-sppo.json"] = self.sppo_best.to_plan()
        return out


def plain_recipe(model) -> str:
    """The name of the model-state recipe a what-if without --framework prices ``model`` with (``any``'s; memo's
    best beside a named framework keeps that framework's, `answer_whatif`)."""
    return get_framework("any").for_model(model).recipe.name


def answer_whatif(req: WhatifRequest, progress=None, while_waiting=None, comparisons: bool = True) -> WhatifAnswer:
    """Both tiers of ``req`` (`rank`; ``while_waiting`` its); with a named framework also memo's
    best with the same cluster and fixed options; when nothing fits, what was not searched. ``comparisons`` False:
    the ranked search and its advice alone, none of the searches the answer compares its best with (memo's own
    beside a framework, bf16 beside FP8, the split searched beside a fixed one), for a caller that reads the best
    alone (`memo_sim.export.base.best_runnable`: an export's nearest plan, where memo's own search took over half its
    time, 2026-12-02)."""
    req.profile.peak(req.model.dtype)  # a clear error if the profile has no peak for the model's dtype
    check_gemm_format(req.model, req.profile)  # ... or for its GEMM format
    result = rank(req.model, req.seq, req.gpus, req.profile, simulate_top=req.simulate_top, progress=progress,
                  allocator_lag=req.allocator_lag, jobs=req.jobs, while_waiting=while_waiting, **req.search_kwargs())
    if not comparisons:
        return WhatifAnswer(req, result, advice=[] if result.best is not None else
                            not_searched(req.gpus, req.searched_policies, req.framework, req.fixed()), compared=False)
    memo_best = None
    if req.framework != "any":  # memo's own best for the same model: the framework's model-state recipe kept
        same = replace(req.model, precision=get_framework(req.framework).for_model(req.model).precision)
        fixed, anyf = req.fixed(), get_framework("any")
        if fixed.get("dp_mode") is None and fixed.get("zero") == 3 and (fixed.get("pp") or 1) > 1:
            fixed["dp_mode"] = "all"  # ZeRO 3 beside stages runs only as FSDP (`memo_sim.dp.fsdp`)
        if fixed.get("tp_mode") not in (None, "all") and fixed["tp_mode"] not in anyf.tp_modes:
            fixed["tp_mode"] = "all"  # a flavour only the framework runs (async TP): memo's own flavours
        if anyf.experts is None or not anyf.experts.ep_overlap:
            fixed["ep_overlap"] = False  # Megatron-Core's merged steps, which memo's own executor does not run
        try:
            # searched as the what-if searches (a single simulated plan named a plan the plain what-if ranks third)
            # a --policy asked for is kept as the degrees are (a review: --policy full_recompute compared with memo's
            # store_all), where memo runs it
            pols = req.policies if req.policies and set(req.policies) <= set(anyf.policies) else None
            later = _later_search(progress, "memo's own search (the gap line; --no-compare skips it)")
            seed = (_own_floor(result.best, same, req, pols) if parse_simulate_top(req.simulate_top) == SIMULATE_BOUND
                    else None)

            def own(floor):
                return rank(same, req.seq, req.gpus, req.profile, simulate_top=req.simulate_top, progress=later,
                            allocator_lag=req.allocator_lag, jobs=req.jobs, policies=pols, floor_tgs=floor,
                            **fixed).best

            memo_best = own(seed)
            if seed is not None and (memo_best is None or below(memo_best.tgs or 0.0, seed)):
                memo_best = own(None)  # the floor was not one this search reaches: the search without it
        except MemoError as e:  # memo's own search has no layout for the fixed degrees: no comparison line
            if not str(e).startswith(NO_VALID_LAYOUT):
                raise
            memo_best = None
    memo_on_framework = None  # memo's best with the framework's mechanisms: what of the gap its layout and policy give
    if memo_best is not None and memo_best.sppo is None:
        fw = get_framework(req.framework)
        from memo_sim.search.whatif import _adapter, launch_overrides  # noqa: PLC0415

        # the user's --alloc-conf on top, as the ranked plans have it (a review: "expandable_segments True -> False")
        lay = _adapter(lambda x: fw.adapt(x, req.profile), req.alloc_conf, launch_overrides(
            req.kernel_fusion, req.attention, req.grad_overlap))(memo_best.layout)
        if req.ep_overlap and memo_best.policy.ep_overlap_ok:  # the overlap asked for, where the layout runs it (a
            lay = with_ep_overlap(lay, memo_best.model)  # review: the gap it makes was put on memo's layout and policy)
        why = framework_runs_why_not(fw, lay, memo_best, req)
        try:  # the model as the framework trains it too (its FP8 library's saved inputs and gathers, ...: a review
            # blamed memo's layout and policy for 0.98x where the two plans differed only there)
            fmodel = for_profile(fw.for_model(memo_best.model), req.profile)  # (its copies on this GPU: the search's)
        except MemoError as e:
            why, fmodel = why or str(e).splitlines()[0], memo_best.model
        if why:  # the mechanisms that differ named all the same (a review: torchtitan's FlashAttention-2 against
            # memo's cuDNN kernel went unsaid behind a 1.77x "layout and mechanisms together")
            memo_on_framework = {"not_runnable": why, "layout_label": lay.label(),
                                 "mechanisms": mechanism_changes(memo_best.layout, lay, req.profile)
                                 + _model_changes(memo_best.model, fmodel, memo_best.policy)}
        elif lay == memo_best.layout and fmodel == memo_best.model:  # memo's best already runs the framework's
            memo_on_framework = {"same_mechanisms": True, "layout_label": lay.label()}  # mechanisms (`gap_line`)
        else:
            try:
                memo_on_framework = {**simulate_variant(memo_best, lay, req.allocator_lag, model=fmodel),
                                     "layout_label": lay.label(),
                                     "mechanisms": mechanism_changes(memo_best.layout, lay, req.profile)
                                     + (["ep_overlap False -> True"] if lay.ep_overlap > memo_best.layout.ep_overlap
                                        else [])
                                     + _model_changes(memo_best.model, fmodel, memo_best.policy)}
            except MemoError:  # the plan is not one the simulator builds with those mechanisms: no split
                memo_on_framework = None
    advice = [] if result.best is not None else not_searched(req.gpus, req.searched_policies, req.framework,
                                                             req.fixed())
    bf16_best, bf16_searched = None, False
    if req.model.gemm.quantised:  # what FP8 buys: the same search with the layer GEMMs in the model's dtype
        plain = replace(req.model, gemm_format="bf16")
        try:
            bf16_best = rank(plain, req.seq, req.gpus, req.profile, simulate_top=req.simulate_top,
                             progress=_later_search(progress,
                                                    "the same search in bf16 (what FP8 buys; --no-compare skips it)"),
                             allocator_lag=req.allocator_lag, jobs=req.jobs, **req.search_kwargs()).best
            bf16_searched = True
        except MemoError as e:  # no layout for the fixed degrees without FP8 either: no comparison line
            if not str(e).startswith(NO_VALID_LAYOUT):
                raise
    return WhatifAnswer(req, result, memo_best, advice, bf16_best, bf16_searched, memo_on_framework,
                        _searched_split_best(req, result, progress))


def _own_floor(best: Candidate | None, model, req: WhatifRequest, policies) -> float | None:
    """A throughput memo's own search (``model``: the framework's recipe kept) reaches: the framework's best plan
    simulated on memo's own mechanisms (`any`'s `Framework.adapt`), where memo's search offers that layout and
    policy; None where it does not, or the plan does not fit so. Memo's own search beside a framework starts from it
    (`rank`'s ``floor_tgs``), the answer the same: Llama-3.1-405B on 16,384 H100s at 128K, --global-batch 128, under
    --framework megatron (a review), whose best is a pipeline, simulated about 1,400 single-stage plans for the gap
    line before its pipelines were priced; with megatron's best on memo's mechanisms (64 tokens/GPU/s) as its floor
    the whole what-if took 228 s instead of 325 (315 against 467 s of CPU; its own search 70 s; this VM, 2026-12-05,
    one after the other, alone), and 152 s once the single-stage bound counted the data-parallel stream
    (`memo_sim.search.bound`)."""
    from memo_sim.search.whatif import simulate_variant  # noqa: PLC0415

    anyf = get_framework("any")
    if best is None or best.sppo is not None or best.policy.name not in (policies or anyf.policies):
        return None
    lay = anyf.adapt(best.layout, req.profile)
    mine = for_profile(anyf.for_model(model), req.profile)
    if anyf.why_not(lay) or check_layout(lay, mine, req.gpus, req.profile.node_gpus, req.seq, best.micro_batch,
                                          metp_across_nodes=True):
        return None
    try:
        s = simulate_variant(best, lay, req.allocator_lag, model=mine)
    except MemoError:
        return None
    return s["tgs_tokens_per_gpu_s"] if s.get("status") == "OK" and s.get("tgs_tokens_per_gpu_s") else None


def _model_changes(mine, theirs, policy) -> list[str]:
    """The model fields a framework trains otherwise (`Framework.for_model`) that move ``policy``'s plan
    (`framework_field_moves`), as 'field old -> new'."""
    offloads = bool(getattr(policy, "offload_modules", ()))
    return [f"{f.name} {getattr(mine, f.name)} -> {getattr(theirs, f.name)}" for f in fields(mine)
            if f.name != "not_modelled" and getattr(mine, f.name) != getattr(theirs, f.name)
            and framework_field_moves(theirs, f.name, offloads)]


class _LaterSearch:
    """The progress of a comparison search after the answer's (`answer_whatif`): its stages named after it, its counts
    not shown (a review: the status line said 'done' while two more searches ran silently for 11 s of 15.8 s)."""

    def __init__(self, progress, what: str):
        self._stage, self._what = progress.stage, what

    def stage(self, words: str) -> None:
        self._stage(f"{self._what}: {words}")

    def __call__(self, done: int, total: int) -> None:
        pass


def _later_search(progress, what: str):
    """``progress`` for a comparison search (`_LaterSearch`), or None where it names no stages."""
    return _LaterSearch(progress, what) if getattr(progress, "stage", None) is not None else None


def framework_runs_why_not(fw, lay, memo_best: Candidate, req: WhatifRequest) -> str | None:
    """Why the framework cannot run memo's best layout with its own mechanisms (``lay``: `Framework.adapt` of it), or
    None: its mechanisms may make the layout one it refuses (a review: megatron's whole K/V heads over tp x ulysses
    16 of Llama-3.1-405B's 8 were priced at 1.03x all the same); the gap split then says so and prices nothing."""
    # the framework as it runs this model's layouts (a sliding window: no ring CP under megatron; MoE: its ZeRO stages)
    return fw.for_layouts_of(memo_best.model).why_not(lay) or check_layout(
        lay, memo_best.model, req.gpus, req.profile.node_gpus, req.seq, memo_best.micro_batch, metp_across_nodes=True)


SPLIT_FLAGS = ("first_stage_layers", "last_stage_layers", "chunk_layers")  # the request's fixed pipeline split


def _searched_split_best(req: WhatifRequest, result: WhatIfResult, progress=None) -> Candidate | None:
    """Where the request fixes the pipeline split and a plan fits: the same search's best with the split searched
    (a user's split of 4 and 3 layers ran 9% slower than the what-if's own 6 and 7, and nothing said so)."""
    if result.best is None or not any(getattr(req, k) for k in SPLIT_FLAGS):
        return None
    try:
        return rank(req.model, req.seq, req.gpus, req.profile, simulate_top=req.simulate_top,
                    progress=_later_search(progress, "the same search with the split searched; --no-compare skips it"),
                    allocator_lag=req.allocator_lag, jobs=req.jobs,
                    **dict(req.search_kwargs(), **dict.fromkeys(SPLIT_FLAGS))).best
    except MemoError:  # the degrees need the fixed split (more stages than layers), or nothing else fits: no line
        return None


def split_words(best: Candidate | None, searched: Candidate | None) -> str:
    """The fixed split's best against the search's own split's, in words ('' where there is nothing to say: no plan,
    or a best plan without pipeline stages, which a fixed split does not reach, `Layout` counting pp 1's first / last
    stages 0). Three cases (a review: a hand split 9% faster than the search's own read "as fast as ... 0.917x"):
    within 0.5% as fast, faster (the search's own splits, `memo_sim.layout.parallel.uneven_splits`', hold not the best
    there is) or slower."""
    if best is None or searched is None or best.layout.pp == 1:
        return ""
    ratio = searched.tgs / best.tgs
    if abs(ratio - 1) <= 0.005:
        return (f"the pipeline split fixed is as fast as the search's own ({searched.layout.label()} "
                f"{searched.policy.label()}: {ratio:.3f}x)")
    if ratio < 1:
        return (f"the pipeline split fixed is {100 * (1 / ratio - 1):.1f}% faster than the search's own: "
                f"{best.tgs:,.0f} tokens/GPU/s ({best.tier}) against {searched.tgs:,.0f} ({searched.tier}) for "
                f"{searched.layout.label()} {searched.policy.label()} with the split left to the search: {ratio:.3f}x")
    return (f"the pipeline split fixed costs {100 * (1 - 1 / ratio):.1f}% of the throughput: with the split left to "
            f"the search, {searched.layout.label()} {searched.policy.label()} runs {searched.tgs:,.0f} tokens/GPU/s "
            f"({searched.tier}) against {best.tgs:,.0f} ({best.tier}): {ratio:.2f}x; drop "
            f"--decoder-first/last-pipeline-num-layers or the layout string to take it")


def sweep_candidates(req: WhatifRequest) -> WhatIfResult:
    """The analytic candidates an alpha sweep picks its layout from: MEMO's policies (no SPPO)."""
    req.profile.peak(req.model.dtype)
    check_gemm_format(req.model, req.profile)
    pols = req.searched_policies or tuple(p for p in get_framework(req.framework).policies  # those pricing the model
                                          if not schedule_runs_policy("sppo", p) and prices_model(p, req.model))
    return candidates_for(req.model, req.seq, req.gpus, req.profile, **dict(req.search_kwargs(), policies=pols))
