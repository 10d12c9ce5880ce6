"""A review of the framework data (2026-12-01): each fix in the data where it is a fact of the framework, checked
against the framework's source at the commit the data cites."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.export import export_plan
from memo_sim.frameworks import _ExpertsIn, _FrameworkIn, _LayoutsIn, _MechanismsIn, _PrecisionIn, load_frameworks
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.search.frameworks import get_framework
from tests.test_review_fixes_deepspeed_gqa import _plan as _ds_plan

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
FLAT_README = " ".join(README.split())




def test_deepspeed_ulysses_repeats_gqa_kv_heads_to_the_query_heads():
    """Bug 1: Megatron-DeepSpeed (transformer.py at 4efb479d) asserts equal q and k/v widths under Ulysses, so a GQA
    model runs only with its K/V heads repeated to the query heads: the what-if priced them unrepeated (minimal)."""
    ds = get_framework("deepspeed")
    assert ds.mechanism("ulysses_kv") == "query_heads"
    assert ds.adapt(Layout(ulysses=8, dp=8, zero=3)).ulysses_kv == "query_heads"
    assert any("4efb479d" in s and "ulysses_kv: query_heads" in s for s in ds.sources)
    gaps = export_plan(_ds_plan(Layout(ulysses=8, dp=8, zero=3), "llama-3.1-70b"), "deepspeed", price=False).gaps
    hit = [g for g in gaps if "(grouped-query)" in g.what]
    assert len(hit) == 1 and "ulysses_kv query_heads" in hit[0].nearest, hit


def test_torchtitan_cpu_offload_is_named_not_granted():
    """Bug 2: torchtitan's FSDP2 CPUOffloadPolicy (training.enable_cpu_offload) puts parameters and gradients on the
    host too, which memo's optimizer offload does not price: named in both versions, not granted; README said
    torchtitan does not offer it."""
    for name in ("torchtitan", "torchtitan@2024-12"):
        f = get_framework(name)
        assert not f.optimizer_offload
        assert any("enable_cpu_offload" in x and "CPUOffloadPolicy" in x for x in f.not_modelled), name
    assert "torchtitan does not; the exports write" not in FLAT_README
    assert "torchtitan's FSDP2 CPU offload (`--training.enable_cpu_offload`)" in FLAT_README


def test_torchtitan_deepep_dispatch_is_named():
    """Bug 3: torchtitan at b5bcd76c has DeepEP / HybridEP dispatch (moe_comm_backend); its export writes the
    all-to-all only, so it is named under not_modelled and the dispatcher stays refused."""
    f = get_framework("torchtitan").for_layouts_of(get_model("qwen3-30b-a3b"))
    assert any("'deepep'" in x and "'hybridep'" in x and "36a4b6942" in x for x in f.not_modelled)
    assert "deepep token dispatcher" in f.why_not(Layout(dp=8, zero=3, dp_mode="fsdp", ep=8, moe_dispatcher="deepep"))


def test_megatron_2023_states_its_window():
    """Bug 4: megatron@2023 cited 'context parallelism arrived with Megatron-Core 0.5 (2024)' though
    --context-parallel-size was merged 2023-10-05; it now names the main-branch window it describes, same grants."""
    f = get_framework("megatron@2023")
    text = " ".join((f.summary,) + f.sources)
    assert "Megatron-Core 0.5 (2024)" not in text and "5e7a8243e0" in f.summary and "4c0daab17a" in text
    assert not f.context_parallel and f.experts is None and f.zero == (0, 1) and f.mechanism("grad_overlap")
    assert any("virtual_pipeline_model_parallel_size" in x for x in f.not_modelled)


def test_megatron_offers_tp_without_sp_for_dense_models_only():
    """Bug 5: Megatron-LM at d98e8a64 runs TP without SP (validate_args turns SP off only at tp 1), but its MoE layer
    raises in training with TP and without SP."""
    meg = get_framework("megatron")
    dense = Layout(tp=4, sp=False, dp=2, zero=1)
    assert meg.allows(dense), meg.why_not(dense)
    assert meg.fixed_why_not(tp=4, sp=False) is None
    moe = meg.for_layouts_of(get_model("qwen3-30b-a3b"))
    assert "without sequence parallelism beside MoE layers" in moe.why_not(dense)
    assert moe.allows(Layout(tp=4, sp=True, dp=2, zero=1))


def test_optimizer_offload_needs_a_zero_optimizer():
    """Bug 6: Megatron's --optimizer-cpu-offload needs the distributed optimizer (ZeRO 1); DeepSpeed's
    offload_optimizer is a ZeRO optimizer's (stage 0 builds CPUAdam over GPU parameters, which asserts)."""
    meg = get_framework("megatron")
    assert not meg.offloads_optimizer(0) and meg.offloads_optimizer(1) and not meg.offloads_optimizer(3)
    assert "ZeRO stage 0" in meg.why_not(Layout(tp=4, dp=2, zero=0, optimizer_offload=True))
    # over a ZeRO group of one rank the stages are one setting (the distributed optimizer over dp 1): kept
    assert meg.allows(Layout(tp=8, zero=0, optimizer_offload=True))
    assert "no offload" not in meg.summary
    for name in ("deepspeed", "xtuner"):
        f = get_framework(name)
        assert not f.offloads_optimizer(0) and all(f.offloads_optimizer(z) for z in (1, 2, 3)), name


def _fields(model) -> dict:
    return {k: (_fields(t) if t is not None else None) for k, t in (
        (k, {"layouts": _LayoutsIn, "mechanisms": _MechanismsIn, "precision": _PrecisionIn,
             "experts": _ExpertsIn}.get(k)) for k in model.model_fields)}


def _missing(schema: dict, got: dict, where: str) -> list[str]:
    out = []
    for k, sub in schema.items():
        if k not in got:
            out.append(f"{where}{k}")
        elif sub is not None and got[k] is not None:
            out += _missing(sub, got[k], f"{where}{k}.")
    return out


def test_frameworks_json_has_every_field_and_the_text_says_them():
    """Bug 7: --json dropped ten fields (experts.balances, multi_token_prediction, shards_over_cp, ...); the text
    view dropped deepspeed's MoE ZeRO limit and torchtitan's FSDP-over-CP, EP-within-shards and MTP-off, and said
    'ZeRO 0, 3 (fsdp)' and 'TP no (SP on; megatron)'."""
    r = CliRunner().invoke(cli, ["frameworks", "--json"])
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    schema = _fields(_FrameworkIn)
    for name in load_frameworks():
        assert _missing(schema, j[name], "") == [], (name, _missing(schema, j[name], ""))
        assert j[name]["file"].endswith(f"{name}.yaml")
    assert j["torchtitan"]["layouts"]["experts"]["balances"] == ["forced", "dropless", "measured"]
    assert j["torchtitan"]["layouts"]["shards_over_cp"] is True and j["megatron"]["layouts"]["mapping_equal_groups"]
    assert j["megatron"]["layouts"]["embedding_loss_slots"] is True  # resolved from uneven_stages
    ds = CliRunner().invoke(cli, ["frameworks", "deepspeed"]).output
    assert "TP no, ring CP no" in ds and "beside ZeRO 0, 1, 2 only" in ds
    tt = CliRunner().invoke(cli, ["frameworks", "torchtitan"]).output
    assert "ZeRO 0 as FSDP2 over a shard group of one, FSDP2 (ZeRO 3)" in tt and "ZeRO 0, 3 (fsdp)" not in tt
    assert "shards over the CP ranks" in tt and "TP x CP x the FSDP shard group" in tt
    assert "multi-token prediction no" in tt and "at least as many micro-batches as stages" in tt


def test_deepspeed_names_what_it_has_beyond_the_data():
    """Bug 8: DeepSpeed at edaa7221 has AutoTP, ALST's TiledMLP / TiledFusedLogitsLoss and a pipeline engine;
    none was in the data; README's "no TP/CP" said neither which TP nor the pipeline."""
    nm = " ".join(get_framework("deepspeed").not_modelled)
    for word in ("autotp_size", "TiledMLP", "TiledFusedLogitsLoss", "pipeline engine"):
        assert word in nm, word
    assert "no TP/CP" not in README
    assert "no TP (Megatron-DeepSpeed's or AutoTP), ring CP or pipeline engine" in FLAT_README


def test_readme_megatron_2022_is_not_the_2023_version():
    """Bug 9: README ran megatron@2022 and megatron@2023 together as having the distributed optimizer and
    FlashAttention, while megatron@2022 has ZeRO 0 and materialised attention."""
    assert "`megatron@2022`, `megatron@2023` (TP with or without SP, distributed optimizer" not in FLAT_README
    old = get_framework("megatron@2022")
    assert old.zero == (0,) and old.mechanism("attention") == "materialised"
    assert ("`megatron@2022` (Korthikanti et al.'s: TP with or without SP, no sharded optimizer, materialised "
            "softmax attention") in FLAT_README
