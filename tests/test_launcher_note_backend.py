"""The launcher's note on a plan's static memory plan (`memo_exec.distributed.runner.memory_plan_not_followed`)
checks the rank's layer with the attention kernel the rank itself picks for ``auto``
(`memo_exec.attention.auto_backend_for`, the meta-device twin of `select_backend`), not a kernel of its own choice.

Found 2026-12-02: for ``auto`` on CUDA the note assumed torch's flash kernel, which masks no sliding window, so a
CUDA run of a model with sliding-window layers (GPT-OSS's alternation) stopped on "attention backend sdpa_flash runs
no sliding windows" before a rank started, although the rank itself picks a kernel that runs them (flash-attn where
it imports, else math)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from memo_sim.plan.schema import read_plan  # noqa: E402

WINDOWED = """name: toy-window
layers: 4
hidden: 256
heads: 8
ffn: 1024
vocab: 512
dtype: fp32
sliding_window: 128
sliding_layers: 2
sliding_period: 2
"""


@pytest.fixture(scope="module")
def windowed_tp2_plan(tmp_path_factory):
    from memo_sim.cli import cli as sim

    out = tmp_path_factory.mktemp("win")
    (out / "m.yaml").write_text(WINDOWED)
    r = CliRunner().invoke(sim, ["whatif", "--model", str(out / "m.yaml"), "--seq", "512", "--gpus", "2", "--tp", "2",
                                 "--sp", "--policy", "memo", "--out", str(out)])
    assert r.exit_code == 0, r.output
    plan = read_plan(out / "plan.json")
    assert plan.attention_backend == "auto" and plan.memory_plan is not None and plan.layout.tp == 2
    return plan


def test_cuda_auto_on_a_windowed_model_checks_the_kernel_the_rank_picks(windowed_tp2_plan):
    from memo_exec.attention import auto_backend_for, preferred_backends
    from memo_exec.device import DTYPES
    from memo_exec.distributed.runner import memory_plan_not_followed

    plan = windowed_tp2_plan
    line = memory_plan_not_followed(plan, device="cuda")  # before: BackendError "sdpa_flash runs no sliding windows"
    from memo_exec.attention import rank_attention_dims

    dims = rank_attention_dims(plan.layout, plan.model, plan.micro_batch or plan.batch, plan.seq_tokens, 2)
    assert dims.window == 128 and dims.heads == 4  # the rank's half of the 8 heads, the model's window
    picked = auto_backend_for("cuda", DTYPES[plan.model.dtype], dims, preferred_backends(plan.priced_attention_kernel()))
    assert picked in ("math", "flash_attn")  # the kernels that mask a window (flash-attn only where it imports)
    assert line == memory_plan_not_followed(plan, device="cuda", attention_backend=picked)
    assert memory_plan_not_followed(plan, device="cpu") == memory_plan_not_followed(plan, device="cpu",
                                                                                    attention_backend="math")
