"""plan.json, schema ``memo-plan/1``: what the executor reads, validated on read.

Top-level fields (units in the key names)::

    schema            "memo-plan/1"
    created           ISO-8601 time the plan was written
    memo_version      version of memo that wrote it
    model             ModelConfig fields (name, layers, hidden, heads, ffn, vocab, kv_heads, ffn_type, dtype)
    batch, seq_tokens, gpus   batch: sequences per data-parallel replica per iteration
    micro_batch       sequences per micro-batch (divides batch; batch / micro_batch micro-batches per
                      iteration, gradients accumulated over them); absent in older plans: = batch
    schedule          single_stage | 1f1b | interleaved_1f1b | sppo (`memo_sim.layout.schedule`); absent in
                      older plans: sppo for the SPPO policy, else single_stage
    layout            Layout fields (tp, sp, tp_mode, cp, ulysses, dp, zero; pp where a pipeline has stages,
                      vpp where each pipeline rank holds several virtual stages)
    policy            {"policy": store_all|full_recompute|full_offload|memo, "alpha": float|null}, or for SPPO
                      {"policy": "sppo", "alpha": null, "subseqs": N, "bounds": [0, x_1, ..., seq]
                       (subsequence i is tokens bounds[i]..bounds[i+1]), "alphas": [alpha_0, ..., alpha_N-1],
                       "partition": flops|length|explicit, "multiplex": bool, "threshold_bytes": M_threshold}
    profile           hardware profile name
    attention_backend auto | flash_attn | sdpa_flash | sdpa_efficient | sdpa_cudnn | math
    classifier_chunk_tokens  tokens per chunk of the chunked classifier + loss
    predicted         {"source": analytic|simulated, "status": OK|OOM|OOHM, "iteration_s", "mfu",
                       "tgs_tokens_per_gpu_s", "peak_gpu_bytes", "peak_host_bytes_per_node", ...}
    layer_timings_s   {"forward", "backward", "recompute", "offload", "prefetch"} for one layer
    memory_plan       null, or {"arena_bytes", "phases": {phase: {"peak_bytes", "offsets": {tensor: bytes}}}, ...}
    timeline          null, or {"file": path of a saved Timeline, ...}
    framework         the framework (and version) the plan was searched for (`memo-sim frameworks`):
                      any (memo's own search) unless the what-if named one; absent in older plans: any
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from memo_sim import __version__
from memo_sim.errors import MemoError, PlanError, validated
from memo_sim.fileio import atomic_write_json, read_json
from memo_sim.layout.parallel import MAX_DEGREE, Layout, structure_why_not
from memo_sim.layout.schedule import SCHEDULE_NAMES, check_schedule, default_schedule
from memo_sim.model.config import ModelConfig
from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS
from memo_sim.plan.contract import MemoryPlan, Prediction
from memo_sim.policy import Policy, get_policy, policy_class, policy_names
from memo_sim.units import MAX_TOKENS

PLAN_SCHEMA = "memo-plan/1"
ATTENTION_BACKENDS = ("auto", "flash_attn", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "math")
LAYER_TIMING_KEYS = ("forward", "backward", "recompute", "offload", "prefetch")


@dataclass
class Plan:
    model: ModelConfig
    batch: int
    seq_tokens: int
    gpus: int
    layout: Layout
    policy: Policy
    profile: str
    predicted: Prediction
    layer_timings_s: dict[str, float]
    attention_backend: str = "auto"
    classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS
    memory_plan: MemoryPlan | None = None
    timeline: dict | None = None
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    memo_version: str = __version__
    schedule: str = ""  # "" = `default_schedule` for the layout and policy
    micro_batch: int = 0  # 0 = the whole batch in one micro-batch
    framework: str = "any"  # what the what-if searched for (`memo_sim.frameworks`): what sweep-seq re-runs

    def __post_init__(self) -> None:
        if not self.schedule:
            self.schedule = default_schedule(self.layout.pp, self.policy.name, self.layout.vpp)
        if not self.micro_batch:
            self.micro_batch = self.batch

    @property
    def micro_batches(self) -> int:
        """Micro-batches per iteration (gradient accumulation steps)."""
        return self.batch // self.micro_batch

    def priced_attention_kernel(self, kernel: str | None = None) -> str:
        """The attention kernel whose curves priced this plan (`memo_sim.profile.attention_kernels`):
        the layout's (`attention_kernel`; ``kernel``: another of its kernels, an export's layout's), with ``cudnn``
        priced as ``flash`` where the plan's profile has no cuDNN curves
        (`memo_sim.profile.schema.Efficiency.priced_attention_kernel`). The executor's ``auto`` backend runs
        this kernel first where the device has it. A profile that does not load here (a file written on
        another machine) leaves the kernel as it is."""
        from memo_sim.profile.loader import load_profile  # noqa: PLC0415 - only plans that ask read a profile

        kernel = self.attention_kernel if kernel is None else kernel
        try:
            return load_profile(self.profile).efficiency.priced_attention_kernel(kernel)
        except MemoError:
            return kernel

    @property
    def attention_kernel(self) -> str:
        """The attention kernel the plan's layout runs (`Layout.attention_kernel`: its blocks' where its attention
        runs as blocks, ring CP, full METP or SPPO's pieces)."""
        return self.layout.attention_kernel(self.policy.name == "sppo")

    def check_schedule(self) -> str | None:
        """None if the plan's schedule can run its layout and batch split, else the reason."""
        return check_schedule(self.schedule, pp=self.layout.pp, vpp=self.layout.vpp, layers=self.model.layers,
                              batch=self.batch, micro_batch=self.micro_batch, policy_name=self.policy.name,
                              uneven=self.layout.uneven)

    def __setattr__(self, name: str, value: Any) -> None:
        # the JSON shapes are accepted too (plans built in code) and parsed, checked, once
        if name == "memory_plan" and isinstance(value, dict):
            value = MemoryPlan.from_dict(value)
        elif name == "predicted" and isinstance(value, dict):
            value = Prediction.from_dict(value)
        super().__setattr__(name, value)

    def to_dict(self) -> dict:
        return {
            "schema": PLAN_SCHEMA,
            "created": self.created,
            "memo_version": self.memo_version,
            "model": self.model.to_dict(),
            "batch": self.batch,
            "micro_batch": self.micro_batch,
            "seq_tokens": self.seq_tokens,
            "gpus": self.gpus,
            "schedule": self.schedule,
            "layout": self.layout.to_dict(),
            "policy": self.policy.to_dict(),
            "profile": self.profile,
            "attention_backend": self.attention_backend,
            "classifier_chunk_tokens": self.classifier_chunk_tokens,
            "predicted": self.predicted.to_dict(),
            "layer_timings_s": self.layer_timings_s,
            "memory_plan": self.memory_plan.to_dict() if self.memory_plan is not None else None,
            "timeline": self.timeline,
            "framework": self.framework,
        }

    @classmethod
    def from_dict(cls, d: Any, source: str = "plan") -> "Plan":
        """Parse and check a plan (pydantic, once): every field typed and range-checked, the first
        problem a `PlanError` of one line naming the file, the field and the fix."""
        def fail(fieldname: str, msg: str) -> PlanError:
            return PlanError(f"{source}: {fieldname}: {msg}")

        if not isinstance(d, dict):
            raise PlanError(f"{source}: not a memo plan (a JSON {type(d).__name__}, not a mapping); a plan is the "
                            f"plan.json `memo-sim whatif` writes")
        if d.get("schema") != PLAN_SCHEMA:
            if not str(d.get("schema", "")).startswith("memo-plan/"):
                what = (f"schema {d['schema']!r}" if "schema" in d else "no 'schema' field")
                raise PlanError(f"{source}: not a memo plan ({what}); a plan is the plan.json `memo-sim whatif` "
                                f"writes, with 'schema': {PLAN_SCHEMA!r}")
            raise fail("schema", f"is {d.get('schema')!r}; this memo reads {PLAN_SCHEMA!r} "
                                 f"(re-create the plan with this version's memo-sim)")
        raw = validated(_PlanIn, d, source, PlanError)
        try:
            model = ModelConfig.from_dict(raw.model, source=f"{source}: model")
            layout = Layout.from_dict(raw.layout, source=f"{source}: layout")
            if model.moe:  # the label says where the experts are (`Layout.moe`)
                layout = replace(layout, moe=True)
            pol = raw.policy
            pcls = policy_class(pol["policy"])
            if hasattr(pcls, "from_dict"):  # a policy with its own plan fields (SPPO's subsequence plan)
                policy = pcls.from_dict(pol)
            elif set(pol) - {"policy", "alpha"}:
                raise fail("policy", f"unknown field {sorted(set(pol) - {'policy', 'alpha'})[0]!r}; "
                                     f'a policy is {{"policy": ..., "alpha": ...}}')
            else:
                alpha = pol.get("alpha")
                if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))
                                          or not 0.0 <= alpha <= 1.0):
                    raise fail("policy.alpha", f"must be a number in [0, 1] (null for a policy without one), got "
                                               f"{alpha!r}; re-create the plan with memo-sim whatif, or set it in "
                                               f"[0, 1]")
                policy = get_policy(pol["policy"], alpha)
        except PlanError:
            raise
        except MemoError as e:
            raise PlanError(str(e) if str(e).startswith(source) else f"{source}: {e}") from None
        except (TypeError, ValueError, KeyError, IndexError, OverflowError) as e:
            raise fail("policy", f"bad value ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                                 f"re-create the plan with memo-sim whatif") from None
        if layout.gpus != raw.gpus:
            raise fail("layout", f"degrees multiply to {layout.gpus} GPU{'s' if layout.gpus != 1 else ''} but gpus "
                                 f"is {raw.gpus}; make them agree")
        try:
            pred = Prediction.from_dict(raw.predicted)
            mp = MemoryPlan.from_dict(raw.memory_plan) if raw.memory_plan is not None else None
        except PlanError as e:
            raise PlanError(f"{source}: {e}") from None
        plan = cls(model=model, batch=raw.batch, seq_tokens=raw.seq_tokens, gpus=raw.gpus, layout=layout,
                   policy=policy, profile=raw.profile, predicted=pred, layer_timings_s=dict(raw.layer_timings_s),
                   attention_backend=raw.attention_backend, classifier_chunk_tokens=raw.classifier_chunk_tokens,
                   memory_plan=mp, timeline=raw.timeline, created=raw.created, memo_version=raw.memo_version,
                   schedule=raw.schedule or "", micro_batch=raw.micro_batch or 0, framework=raw.framework)
        why = plan.check_schedule()
        if why:
            field_ = "micro_batch" if why.startswith("micro_batch") else "schedule"
            raise fail(field_, f"{why}; re-create the plan with memo-sim whatif")
        why = structure_why_not(layout, model)
        if why:
            raise fail("layout", f"{why}; re-create the plan with memo-sim whatif")
        return plan


MAX_BATCH = 1 << 16  # sequences per replica per iteration
MAX_SEQ_TOKENS = MAX_TOKENS  # one sequence (the count flags' cap, `memo_sim.units.MAX_TOKENS`)
_Positive = Annotated[int, Field(strict=True, ge=1)]
_Seconds = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=1e9)]


class _PlanIn(BaseModel):
    """plan.json's top level; the nested parts are checked by their own types (`ModelConfig`,
    `Layout`, the policy registry, `Prediction`, `MemoryPlan`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_: Literal[PLAN_SCHEMA] = Field(alias="schema")
    created: str = Field("", strict=True, max_length=100)
    memo_version: str = Field("", strict=True, max_length=100)
    model: dict[str, Any]
    batch: Annotated[int, Field(strict=True, ge=1, le=MAX_BATCH)]
    micro_batch: Annotated[int, Field(strict=True, ge=1, le=MAX_BATCH)] | None = None
    schedule: Literal[SCHEDULE_NAMES] | None = None
    seq_tokens: Annotated[int, Field(strict=True, ge=1, le=MAX_SEQ_TOKENS)]
    gpus: Annotated[int, Field(strict=True, ge=1, le=MAX_DEGREE)]
    layout: dict[str, Any]
    policy: dict[str, Any]
    profile: str = Field(strict=True, min_length=1, max_length=4096)
    attention_backend: Literal[ATTENTION_BACKENDS] = "auto"
    classifier_chunk_tokens: Annotated[int, Field(strict=True, ge=1, le=MAX_SEQ_TOKENS)] = CLASSIFIER_CHUNK_TOKENS
    predicted: dict[str, Any]
    layer_timings_s: dict[Literal[LAYER_TIMING_KEYS], _Seconds]
    memory_plan: dict[str, Any] | None = None
    timeline: dict[str, Any] | None = None
    framework: str = Field("any", strict=True, min_length=1, max_length=100)

    @field_validator("policy")
    @classmethod
    def _names_a_policy(cls, v: dict) -> dict:
        if "policy" not in v:
            raise ValueError('missing "policy"; write {"policy": "memo", "alpha": 0.5}')
        if v["policy"] not in policy_names():
            raise ValueError(f"unknown policy {v['policy']!r}; use one of {', '.join(policy_names())}")
        return v


def with_profile_reference(plan: Plan, given: str) -> Plan:
    """``plan`` recording its profile as the user gave it (``given``, what `memo_sim.profile.loader.load_profile`
    was called with): one read from a file (``--profile cpu.yaml``, what `memo-exec calibrate` writes) by the
    file's absolute path, so check-plan, simulate and memo-exec find it again (its bare name resolves only inside a
    profile folder); one named by its name by that name, the one looked up, not the ``name:`` the file declares
    (a review: my-b200.yaml declaring ``name: b200-180gb`` wrote plans that re-priced on the stock B200; the loader
    now refuses that mismatch too, `memo_sim.profile.loader._named`). The test for a file is the loader's."""
    import dataclasses

    p = Path(given)
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        return dataclasses.replace(plan, profile=str(p.resolve()))
    # the name in another case is the same profile (`load_profile`): the plan keeps its own spelling
    return plan if str(given).lower() == plan.profile.lower() else dataclasses.replace(plan, profile=str(given))


def write_plan(plan: Plan, path: str | Path) -> Path:
    """Write ``plan`` (a `Plan`: ``WhatifAnswer.plans()``'s, ``Candidate.to_plan()``'s or `read_plan`'s) to the file
    ``path`` (a str or Path; its folders are created) as plan.json, atomically (a new file renamed over the old);
    returns the path. A plan that is not a `Plan`, or a path that is a folder or not a regular file, raises one
    `MemoError` naming the argument and the fix, before anything is written."""
    from memo_sim.fileio import write_target  # noqa: PLC0415

    if not isinstance(plan, Plan):
        raise MemoError(f"write_plan: plan is a {type(plan).__name__}, not a Plan; pass a Plan (WhatifAnswer.plans()"
                        f"['plan.json'], Candidate.to_plan() or read_plan(path)), or Plan.from_dict(d) of a mapping")
    path = _plan_path(path, "write_plan")
    target, why = write_target(path)
    if why:
        hint = f" such as {Path(path) / 'plan.json'}" if target.is_dir() else ""
        raise MemoError(f"write_plan: path {str(path)!r} {why}{hint}")
    return atomic_write_json(path, plan.to_dict())


def read_plan(path: str | Path) -> Plan:
    """The plan in the plan.json file ``path`` (a str or Path), validated (`Plan.from_dict`); a profile file the plan
    names that lies beside the plan rather than where it was written is taken from there (`beside_the_plan`). A
    missing, unreadable-as-JSON or malformed file, or a path that is a folder, raises `PlanError` (a `MemoError`) in
    one line naming the file and the fix."""
    path = _plan_path(path, "read_plan")
    p = Path(path)
    if p.is_dir():
        inside = p / "plan.json"
        fix = f"give {inside}" if inside.is_file() else "give the path of a plan.json file"
        raise PlanError(f"{path}: a folder, not a plan file; {fix}")
    raw = read_json(path, PlanError, "plan file")
    return beside_the_plan(Plan.from_dict(raw, source=str(path)), p)


def _plan_path(path: Any, who: str) -> str | Path:
    """``path`` when it is a str or a path object, else a `MemoError` naming ``who``'s argument."""
    import os  # noqa: PLC0415

    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path.strip():
        raise MemoError(f"{who}: path {path!r}: give a file's path (a str or Path)")
    return path


def beside_the_plan(plan: Plan, path: Path) -> Plan:
    """``plan`` whose profile file (recorded by its absolute path, `with_profile_reference`) is not where the
    plan was written but lies beside the plan file, as a folder copied to another machine carries it: that copy.
    A profile named by its name, or a file still where it was, is kept as recorded."""
    import dataclasses

    rec = Path(plan.profile)
    if rec.suffix not in (".yaml", ".yml", ".json") or rec.exists():
        return plan
    near = path.parent / rec.name
    return dataclasses.replace(plan, profile=str(near.resolve())) if near.is_file() else plan
