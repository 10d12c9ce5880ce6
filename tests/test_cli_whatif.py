"""memo-sim whatif / profiles / models through the CLI."""

import json

from click.testing import CliRunner

from memo_sim.cli import cli


def run(args, **kw):
    return CliRunner().invoke(cli, args, catch_exceptions=False, **kw)


def test_default_whatif_writes_plan(tmp_path):
    r = run(["whatif", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "best:" in r.output and (tmp_path / "plan.json").exists()
    from memo_sim.plan import read_plan
    assert read_plan(tmp_path / "plan.json").seq_tokens == 256 * 1024


def test_7b_1m_json_statuses(tmp_path):
    r = run(["whatif", "--model", "gpt-7b", "--gpus", "8", "--seq", "1M", "--profile", "a800-80gb", "--json",
             "--out", str(tmp_path)])
    assert r.exit_code == 0
    obj = json.loads(r.output)
    cands = obj["candidates"]
    by_policy = {}
    for c in cands:
        by_policy.setdefault(c["policy"], []).append(c)
    assert all(c["status"] in ("OOM", "OOHM") for c in by_policy["store_all"])
    for c in by_policy["full_recompute"] + by_policy["store_all"]:
        if c["status"] == "OOM":
            assert c["peak_gpu_bytes"] > c["gpu_capacity_bytes"]
    assert any(c["status"] == "OK" for c in by_policy["memo"])
    assert cands[0]["status"] == "OK" and cands[0]["policy"] == "memo"
    # every number carries its unit in the key name
    units = ("_s", "_bytes", "_mfu", "_per_gpu_s", "_per_node")
    for k, v in cands[0].items():
        if isinstance(v, float) and k != "alpha":
            assert k.endswith(units) or "_bytes" in k, k


def test_4k_ranks_no_offload_first(tmp_path):
    r = run(["whatif", "--seq", "4K", "--json", "--out", str(tmp_path)])
    top = json.loads(r.output)["candidates"][0]
    assert top["policy"] in ("store_all", "full_recompute")


def test_toy_model_flags_and_fixed_layout(tmp_path):
    r = run(["whatif", "--layers", "4", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "1000",
             "--seq", "2K", "--gpus", "2", "--tp", "2", "--policy", "memo", "--alpha", "0.3", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "tp2" in r.output and "0.300" in r.output


def test_bad_input_is_one_line_exit_2(tmp_path):
    for args in (["whatif", "--seq", "lots"], ["whatif", "--profile", "nope"], ["whatif", "--model", "gpt-1t"],
                 ["whatif", "--gpus", "8", "--tp", "3"], ["whatif", "--hidden", "1000", "--heads", "7"]):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 2, (args, r.output)
        assert "Traceback" not in r.output


def test_check_plan_bad_file(tmp_path):
    f = tmp_path / "plan.json"
    f.write_text('{"schema": "memo-plan/0"}')
    r = CliRunner().invoke(cli, ["check-plan", str(f)])
    assert r.exit_code == 2 and "schema" in r.output


def test_profiles_and_models_list():
    assert "a800-80gb" in run(["profiles"]).output
    out = run(["models"]).output
    assert "gpt-65b" in out and "llama-70b" in out
