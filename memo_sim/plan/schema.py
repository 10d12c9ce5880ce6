"""plan.json, schema ``memo-plan/1``: what the executor reads, validated on read.

Top-level fields (units in the key names)::

    schema            "memo-plan/1"
    created           ISO-8601 time the plan was written
    memo_version      version of memo that wrote it
    model             ModelConfig fields (name, layers, hidden, heads, ffn, vocab, kv_heads, ffn_type, dtype)
    batch, seq_tokens, gpus
    layout            Layout fields (tp, sp, tp_mode, cp, ulysses, dp, zero; pp where a pipeline has stages)
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
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memo_sim import __version__
from memo_sim.errors import MemoError, PlanError
from memo_sim.fileio import atomic_write_json, read_json
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS
from memo_sim.plan.contract import MemoryPlan, Prediction
from memo_sim.policy import Policy, get_policy, policy_class

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
            "seq_tokens": self.seq_tokens,
            "gpus": self.gpus,
            "layout": self.layout.to_dict(),
            "policy": self.policy.to_dict(),
            "profile": self.profile,
            "attention_backend": self.attention_backend,
            "classifier_chunk_tokens": self.classifier_chunk_tokens,
            "predicted": self.predicted.to_dict(),
            "layer_timings_s": self.layer_timings_s,
            "memory_plan": self.memory_plan.to_dict() if self.memory_plan is not None else None,
            "timeline": self.timeline,
        }

    @classmethod
    def from_dict(cls, d: Any, source: str = "plan") -> "Plan":
        def fail(fieldname: str, msg: str) -> PlanError:
            return PlanError(f"{source}: {fieldname}: {msg}")

        if not isinstance(d, dict):
            raise fail("(top)", "a plan is a JSON object")
        if d.get("schema") != PLAN_SCHEMA:
            raise fail("schema", f"is {d.get('schema')!r}; this memo reads {PLAN_SCHEMA!r} "
                                 f"(re-create the plan with this version's memo-sim)")
        known = {"schema", "created", "memo_version", "model", "batch", "seq_tokens", "gpus", "layout", "policy",
                 "profile", "attention_backend", "classifier_chunk_tokens", "predicted", "layer_timings_s",
                 "memory_plan", "timeline"}
        unknown = set(d) - known
        if unknown:
            raise fail(sorted(unknown)[0], "unknown field")
        for k in ("model", "batch", "seq_tokens", "gpus", "layout", "policy", "profile", "predicted",
                  "layer_timings_s"):
            if k not in d:
                raise fail(k, "missing field")
        for k in ("batch", "seq_tokens", "gpus", "classifier_chunk_tokens"):
            v = d.get(k, 1)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise fail(k, f"must be a positive integer, got {v!r}")
        try:
            model = ModelConfig.from_dict(d["model"], source=f"{source}: model") if isinstance(d["model"], dict) \
                else None
            if model is None:
                raise fail("model", "must be an object")
            layout = Layout.from_dict(d["layout"], source=f"{source}: layout") if isinstance(d["layout"], dict) \
                else None
            if layout is None:
                raise fail("layout", "must be an object")
            pol = d["policy"]
            if not isinstance(pol, dict) or "policy" not in pol:
                raise fail("policy", 'must be {"policy": ..., "alpha": ...}')
            pcls = policy_class(pol["policy"])
            if hasattr(pcls, "from_dict"):  # a policy with its own plan fields (SPPO's subsequence plan)
                policy = pcls.from_dict(pol)
            elif set(pol) - {"policy", "alpha"}:
                raise fail("policy", 'must be {"policy": ..., "alpha": ...}')
            else:
                policy = get_policy(pol["policy"], pol.get("alpha"))
        except PlanError:
            raise
        except MemoError as e:
            raise PlanError(str(e) if str(e).startswith(source) else f"{source}: {e}") from None
        except TypeError as e:
            raise fail("model/layout", f"bad value ({e})") from None
        if layout.gpus != d["gpus"]:
            raise fail("layout", f"degrees multiply to {layout.gpus} GPUs but gpus is {d['gpus']}")
        backend = d.get("attention_backend", "auto")
        if backend not in ATTENTION_BACKENDS:
            raise fail("attention_backend", f"must be one of {', '.join(ATTENTION_BACKENDS)}, got {backend!r}")
        try:
            pred = Prediction.from_dict(d["predicted"])
            mp = MemoryPlan.from_dict(d["memory_plan"]) if d.get("memory_plan") is not None else None
        except PlanError as e:
            raise PlanError(f"{source}: {e}") from None
        lt = d["layer_timings_s"]
        if not isinstance(lt, dict) or set(lt) - set(LAYER_TIMING_KEYS):
            raise fail("layer_timings_s", f"keys must be among {', '.join(LAYER_TIMING_KEYS)}")
        for k, v in lt.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise fail(f"layer_timings_s.{k}", f"must be a non-negative number of seconds, got {v!r}")
        if not isinstance(d["profile"], str) or not d["profile"]:
            raise fail("profile", "must name a hardware profile")
        return cls(model=model, batch=d["batch"], seq_tokens=d["seq_tokens"], gpus=d["gpus"], layout=layout,
                   policy=policy, profile=d["profile"], predicted=pred, layer_timings_s=dict(lt),
                   attention_backend=backend, classifier_chunk_tokens=d.get("classifier_chunk_tokens", CLASSIFIER_CHUNK_TOKENS),
                   memory_plan=mp, timeline=d.get("timeline"), created=str(d.get("created", "")),
                   memo_version=str(d.get("memo_version", "")))


def write_plan(plan: Plan, path: str | Path) -> Path:
    return atomic_write_json(path, plan.to_dict())


def read_plan(path: str | Path) -> Plan:
    raw = read_json(path, PlanError, "plan file")
    return Plan.from_dict(raw, source=str(path))
