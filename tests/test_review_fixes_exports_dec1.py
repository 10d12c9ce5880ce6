"""A review of `memo-sim export` (2026-12-01): DeepSpeed's optimizer on the host without --cpu-optimizer, torchtitan's
micro-batches below the priced batch, Megatron-LM's attention backend beside the priced kernel, its gap note's
--cpu-offloading (no such option), and torchrun lines that launched more processes than the plan's GPUs. Each test
failed on the code before the fixes."""

import json
import re
import subprocess
from pathlib import Path

from memo_sim.export import export_plan
from memo_sim.export.base import Gap, PlanChange
from memo_sim.export import megatron as meg
from memo_sim.frameworks import mechanism_changes
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.plan.schema import Plan
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.search.frameworks import get_framework
from tests.test_export import _names  # name -> kind of a checked-in option list

DATA = Path(__file__).parent / "data" / "export"
PROFILE = "h100-sxm5-80gb"


def _plan(layout: Layout, model="llama-3.1-8b", batch=1, seq=16384, policy=("full_recompute",), sched="",
          framework="megatron", profile=PROFILE) -> Plan:
    return Plan(model=get_model(model), batch=batch, seq_tokens=seq, gpus=layout.gpus, layout=layout,
                policy=get_policy(*policy), profile=profile, predicted={"status": "OK", "iteration_s": 1.0, "mfu": 0.5},
                layer_timings_s={"forward": 0.1, "backward": 0.2}, micro_batch=1, schedule=sched, framework=framework)


def _launch_words(script: str) -> list[str]:
    return [w for ln in script.splitlines() if ln.startswith("    ") for w in ln.rstrip(" \\").split()]


# 1. DeepSpeed: the optimizer on the host


def test_deepspeed_optimizer_offload_writes_cpu_optimizer():
    """ds_config's offload_optimizer with Megatron-DeepSpeed's own GPU Adam stops in deepspeed.initialize
    (ZeRORuntimeException: a client optimizer under ZeRO-Offload): the launch line asks for DeepSpeedCPUAdam."""
    plan = _plan(Layout(ulysses=8, zero=1, optimizer_offload=True), framework="deepspeed")
    ex = export_plan(plan, "deepspeed", price=False, nearest=True)
    cfg = json.loads(ex.files["ds_config.json"])
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "--cpu-optimizer" in _launch_words(ex.files["deepspeed.sh"])
    on_gpu = export_plan(_plan(Layout(ulysses=8, zero=1), framework="deepspeed"), "deepspeed", price=False)
    assert "--cpu-optimizer" not in _launch_words(on_gpu.files["deepspeed.sh"])


# 2. torchtitan (and Megatron-LM): the batch priced, not the plan's


def test_torchtitan_writes_the_raised_batch_it_prices():
    """2 micro-batches over 4 stages: the gap raises the replica's batch to 4 (Schedule1F1B raises below one a
    stage) and memo prices 4; the file wrote num_pp_microbatches 2 and two sequences' tokens."""
    plan = _plan(Layout(tp=2, sp=True, pp=4), batch=2, sched="1f1b")
    ex = export_plan(plan, "torchtitan", price=False, nearest=True)
    assert any(g.change.batch == 4 for g in ex.gaps)
    src = ex.files["memo_torchtitan.py"]
    assert "config.parallelism.num_pp_microbatches = 4" in src, src
    assert f"config.training.num_tokens_per_train_step = {4 * plan.seq_tokens}" in src, src


def test_megatron_writes_a_gaps_batch():
    """Megatron-LM's global batch is the nearest plan's (`nearest_batch`), as DeepSpeed's and torchtitan's are."""
    plan = _plan(Layout(tp=2, pp=2, dp=2), batch=2, sched="1f1b")
    args = dict((k, v) for k, v in meg.arguments(plan, [Gap("x", "y", PlanChange(batch=4))]))
    assert args["--global-batch-size"] == "8"


# 3. Megatron-LM: the attention backend priced


def test_megatron_writes_the_attention_backend_of_the_adapted_layout():
    """A torchtitan plan (FlashAttention-2) with ring CP exported to Megatron-LM is priced on TransformerEngine's
    cuDNN attention (an H100 profile with its curves): the script wrote --attention-backend flash."""
    lay = Layout(tp=4, sp=True, cp=2, attention="flash")
    plan = _plan(lay, seq=16384, framework="torchtitan")
    words = _launch_words(export_plan(plan, "megatron", price=False, nearest=True).files["megatron.sh"])
    assert words[words.index("--attention-backend") + 1] == "fused"


def test_mechanism_changes_name_a_ring_block_kernel_change():
    """The ring's blocks on the layer kernel ("" in both layouts) move from FlashAttention-2 to cuDNN under
    Megatron-LM's mechanisms: the nearest plan's mechanisms named no kernel change (the layer kernel's entry is moot
    under CP, and the block fields read equal)."""
    lay = Layout(tp=4, sp=True, cp=2, attention="flash")
    prof = load_profile(PROFILE)
    changes = mechanism_changes(lay, get_framework("megatron").adapt(lay, prof), prof)
    assert "block_attention flash -> cudnn" in changes, changes


# 4. Megatron-LM: no --cpu-offloading


def test_megatron_offload_note_names_only_megatron_options():
    """At d98e8a64 cpu_offloading is excluded from the generated options (set by --cpu-offloading-num-layers > 0):
    the gap note and the checked-in option list named a --cpu-offloading flag."""
    allowed = _names("megatron_options.txt")
    assert "--cpu-offloading" not in allowed and allowed["--cpu-offloading-num-layers"] == "int"
    named = re.findall(r"--[a-z0-9-]+", meg._OFFLOAD_NOTE)
    assert named and all(o in allowed for o in named), named
    plan = _plan(Layout(tp=8), policy=("memo", 0.5))
    note = next(g.nearest for g in export_plan(plan, "megatron", price=False, nearest=True).gaps if "MEMO" in g.what)
    assert "--cpu-offloading-num-layers" in note and "--cpu-offloading " not in note


# 5. torchrun: the plan's GPU count on hosts it does not fill


def _ranks(line: str) -> list[int]:
    """The processes each host's torchrun line starts, the line run by bash with NODE_RANK set (torchrun echoed)."""
    nodes = int(re.search(r"--nnodes (\d+)", line).group(1))
    cmd = line[line.index("torchrun"):].replace("torchrun", "echo", 1)
    out = []
    for r in range(nodes):
        res = subprocess.run(["bash", "-euc", cmd], capture_output=True, text=True, check=True,
                             env={"NODE_RANK": str(r), "MASTER_ADDR": "host0", "PATH": "/usr/bin:/bin"})
        out.append(int(re.search(r"--nproc-per-node (\d+)", res.stdout).group(1)))
        assert f"--node-rank {r} " in res.stdout, res.stdout
    return out


def test_torchrun_launches_the_plans_gpus_on_a_partly_filled_host():
    """6 GPUs on GB200 NVL72 trays of 4 (cp2-dp3) were launched as 2 x 4 = 8 ranks, 12 on 8-GPU B200 hosts (cp2-dp6)
    as 16: the frameworks take the data-parallel size from the world size. The last host runs the rest."""
    six = _plan(Layout(cp=2, dp=3), batch=1, seq=49152, profile="gb200-nvl72")
    for fw, name in (("megatron", "megatron.sh"), ("deepspeed", "deepspeed.sh"), ("torchtitan", None)):
        ex = export_plan(six, fw, price=False, nearest=True)
        line = ex.launch if name is None else next(ln for ln in ex.files[name].splitlines() if "torchrun" in ln)
        assert _ranks(line) == [4, 2], (fw, line)
    twelve = _plan(Layout(cp=2, dp=6), batch=1, seq=49152, profile="b200-180gb", framework="torchtitan")
    assert _ranks(export_plan(twelve, "torchtitan", price=False, nearest=True).launch) == [8, 4]
    full = _plan(Layout(tp=8, dp=2), profile=PROFILE)  # whole hosts: the line as before
    assert _ranks(next(ln for ln in export_plan(full, "megatron", price=False).files["megatron.sh"].splitlines()
                       if "torchrun" in ln)) == [8, 8]
