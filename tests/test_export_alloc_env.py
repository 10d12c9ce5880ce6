"""Every export sets the caching allocator's settings memo priced on its run line (a QA review: torchtitan's run line,
``torchrun ... -m torchtitan.train``, bypassed run_train.sh and its PYTORCH_ALLOC_CONF="expandable_segments:True",
which memo's torchtitan data prices, and set nothing, while the export said every part of the plan was expressed):
the one helper `memo_sim.export.base.alloc_env` for every exporter, torchtitan's variable as its own script names it,
PYTORCH_CUDA_ALLOC_CONF (read by every torch 2.x) for Megatron-LM and DeepSpeed; a plan on PyTorch's defaults sets
none, a memory fraction (no variable sets it) is a gap, and the nearest plan is priced with the plan's settings."""

from __future__ import annotations

import shlex
from dataclasses import replace

import pytest

from memo_sim.export import export_plan
from memo_sim.export.base import alloc_env
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.plan.schema import Plan
from memo_sim.policy import get_policy

VARIABLE = {"torchtitan": "PYTORCH_ALLOC_CONF", "megatron": "PYTORCH_CUDA_ALLOC_CONF",
            "deepspeed": "PYTORCH_CUDA_ALLOC_CONF"}
FILES = {"torchtitan": "memo_torchtitan.py", "megatron": "megatron.sh", "deepspeed": "deepspeed.sh"}


def _plan(layout: Layout, model=None, policy=("full_recompute",), seq=32768) -> Plan:
    return Plan(model=model or get_model("llama-3.1-8b"), batch=1, seq_tokens=seq, gpus=layout.gpus, layout=layout,
                policy=get_policy(*policy), profile="h100-sxm5-80gb",
                predicted={"status": "OK", "iteration_s": 10.0, "mfu": 0.5},
                layer_timings_s={"forward": 0.1, "backward": 0.2})


BASE = Layout(tp=8, sp=True)
EXPANDABLE = _plan(replace(BASE, expandable_segments=True))
DEFAULTS = _plan(BASE)


def _run_words(ex, to: str) -> list[str]:
    """The run line's words: torchtitan's launch, a script's torchrun line (and its continuation lines)."""
    if to == "torchtitan":
        return shlex.split(ex.launch)
    lines = ex.files[FILES[to]].splitlines()
    start = next(i for i, ln in enumerate(lines) if "torchrun " in ln and not ln.startswith("#"))
    cmd = []
    for ln in lines[start:]:
        cmd.append(ln.rstrip("\\").strip())
        if not ln.endswith("\\"):
            break
    return shlex.split(" ".join(cmd))


def _env(words: list[str]) -> dict[str, str]:
    """The assignments before the command."""
    out = {}
    for w in words:
        name, eq, value = w.partition("=")
        if not eq or not name.isidentifier():
            break
        out[name] = value
    return out


@pytest.mark.parametrize("to", ["torchtitan", "megatron", "deepspeed"])
def test_an_expandable_plans_run_line_sets_it(to):
    ex = export_plan(EXPANDABLE, to, price=False, nearest=True)
    env = _env(_run_words(ex, to))
    assert env.get(VARIABLE[to]) == "expandable_segments:True", (to, env)
    assert [k for k in env if "ALLOC_CONF" in k] == [VARIABLE[to]], env


@pytest.mark.parametrize("to", ["torchtitan", "megatron", "deepspeed"])
def test_a_plan_on_the_defaults_sets_none(to):
    ex = export_plan(DEFAULTS, to, price=False, nearest=True)
    assert not any("ALLOC_CONF" in k for k in _env(_run_words(ex, to))), to
    assert "ALLOC_CONF=" not in ex.launch and all("ALLOC_CONF=" not in text for text in ex.files.values()), to


def test_the_rest_of_the_setting_string_goes_with_it_quoted():
    """A layout's alloc_conf (the rest of the string, canonical) is written too; brackets quoted for the shell."""
    rest = "max_split_size_mb:256,roundup_power2_divisions:[1:1,2:1,4:1,8:1,16:1,32:1,64:1,128:1,256:1,512:2," \
           "1024:4,2048:8,4096:8,8192:8,16384:8,32768:8]"
    lay = replace(BASE, expandable_segments=True, alloc_conf=rest)
    text = alloc_env(lay)
    assert text.startswith("PYTORCH_CUDA_ALLOC_CONF='") and text.endswith("' "), text
    assert shlex.split(text) == [f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,{rest}"]
    ex = export_plan(_plan(lay), "megatron", price=False, nearest=True)
    assert _env(_run_words(ex, "megatron"))["PYTORCH_CUDA_ALLOC_CONF"] == f"expandable_segments:True,{rest}"
    assert alloc_env(replace(BASE, alloc_conf="max_split_size_mb:256")) == (
        "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:256 ")


@pytest.mark.parametrize("to", ["torchtitan", "megatron", "deepspeed"])
def test_a_memory_fraction_is_a_gap_and_not_in_the_variable(to):
    """per_process_memory_fraction is torch.cuda.set_per_process_memory_fraction's, not a key of the variable (PyTorch
    stops on an unrecognised option): the export names it as a gap and writes the rest."""
    lay = replace(BASE, expandable_segments=True,
                  alloc_conf="garbage_collection_threshold:0.6,per_process_memory_fraction:0.9")
    ex = export_plan(_plan(lay), to, price=False, nearest=True)
    assert any("per_process_memory_fraction" in g.what and "set_per_process_memory_fraction(0.9)" in g.nearest
               for g in ex.gaps), ex.gaps
    assert _env(_run_words(ex, to))[VARIABLE[to]] == "expandable_segments:True", to


def test_the_nearest_plan_is_priced_with_the_plans_allocator_settings():
    """The run line sets the plan's settings, so the price keeps them rather than the framework data's (torchtitan's
    expandable segments, Megatron-LM's none): no "expandable_segments" mechanism, the priced label as the plan's."""
    model = replace(get_model("llama-3.1-8b"), layers=2)
    for lay, to in ((BASE, "torchtitan"), (replace(BASE, expandable_segments=True), "megatron")):
        ex = export_plan(_plan(lay, model=model, seq=8192), to, price=True, nearest=True)
        assert ex.nearest is None or not ex.nearest.get("error"), ex.nearest
        if ex.nearest is not None:
            assert not any(m.startswith("expandable_segments") for m in ex.nearest["mechanisms"]), ex.nearest
            assert ("-expandable" in ex.nearest["label"]) == lay.expandable_segments, ex.nearest["label"]
