"""A fresh-user review of 2026-12-05: what it found, each fixed here, each with the test that fails without it."""

from __future__ import annotations

from click.testing import CliRunner

from memo_sim.cli import cli


def test_a_quantised_tables_mfu_column_names_its_peak():
    """An NVFP4 what-if's table showed 'MFU 91.2%' bare (its answer line alone said 'of the bf16 peak'): the column
    head says which peak it counts against; a bf16 table's head stays 'MFU'."""
    base = ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "8K", "--profile", "h100-sxm5-80gb",
            "--no-plan", "--jobs", "1", "--simulate-top", "1", "--tp", "1", "--cp", "1", "--ulysses", "1", "--pp", "1"]
    fp8 = CliRunner().invoke(cli, [*base, "--precision", "fp8-tensorwise"])
    assert fp8.exit_code == 0, fp8.output
    head = next(ln for ln in fp8.output.splitlines() if ln.startswith("#   layout"))
    assert "MFU (bf16 peak)" in head, head
    plain = CliRunner().invoke(cli, base)
    assert plain.exit_code == 0, plain.output
    head = next(ln for ln in plain.output.splitlines() if ln.startswith("#   layout"))
    assert " MFU " in head and "peak)" not in head.split("TGS")[0], head


def test_a_global_batch_nobody_chose_is_named_where_every_row_trains_the_same():
    """Without --global-batch each layout trains a batch per data-parallel replica; where every row shown has the
    same replicas the step's size went unsaid (a review: Llama-3.1-405B on 16,384 GPUs answered 1,024 sequences of
    128K a step without a word). One replica's single sequence is not worth a line."""
    args = ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "128K", "--no-plan", "--jobs", "1",
            "--simulate-top", "1", "--tp", "1", "--cp", "1", "--pp", "1"]
    r = CliRunner().invoke(cli, [*args, "--ulysses", "4"])
    assert r.exit_code == 0, r.output
    assert ("global batch not fixed: every row shown trains 2 sequences (256K tokens) a step, a batch per "
            "data-parallel replica; give --global-batch N") in r.output, r.output
    for extra in (["--ulysses", "8"], ["--ulysses", "4", "--global-batch", "2"]):
        r = CliRunner().invoke(cli, [*args, *extra])
        assert r.exit_code == 0 and "global batch not fixed" not in r.output, (extra, r.output)


def test_no_compare_answers_with_the_ranked_search_alone(monkeypatch):
    """Llama-3.1-405B on 16,384 GPUs at 128K with --framework megatron answered its own search in 71 s, then spent
    minutes on memo's own search for the gap line, with no way to skip it (a review): --no-compare runs the ranked
    search alone and says what it left out, in the text and in the JSON."""
    import json

    import memo_sim.search.request as request

    calls = []
    real = request.rank
    monkeypatch.setattr(request, "rank", lambda *a, **k: calls.append(1) or real(*a, **k))
    args = ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "8K", "--profile", "h100-sxm5-80gb",
            "--framework", "megatron", "--precision", "fp8-tensorwise", "--no-plan", "--jobs", "1",
            "--simulate-top", "1", "--tp", "1", "--cp", "1", "--ulysses", "1", "--pp", "1"]
    r = CliRunner().invoke(cli, [*args, "--no-compare"])
    assert r.exit_code == 0, r.output
    assert len(calls) == 1  # neither memo's own search nor the bf16 one
    assert "memo's own best beside megatron's: not searched (--no-compare)" in r.output
    assert "without fp8-tensorwise GEMMs" not in r.output
    d = json.loads(CliRunner().invoke(cli, [*args, "--no-compare", "--json"]).output)
    assert d["compared"] is False and d["memo_best"] is None and d["bf16_searched"] is False
    calls.clear()
    r = CliRunner().invoke(cli, [*args, "--json"])
    assert r.exit_code == 0 and len(calls) == 3, r.output  # the answer's, memo's own, the bf16 one
    assert json.loads(r.output)["compared"] is True


def test_headroom_leaves_memory_free_in_every_fit():
    """The default answers ran at 97-100% of the GPU while memo's own words put the caching allocator's measured
    reserved peak up to 17.7% above its replay (a review): --headroom keeps a margin a user chooses, in the what-if's
    fits (the answer's capacity, its peak under it, the header saying so) and in maxseq's; bad values are one line."""
    import json

    from memo_sim.profile import load_profile

    usable = load_profile("h100-sxm5-80gb").usable_gpu_memory
    args = ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "128K", "--profile", "h100-sxm5-80gb",
            "--no-plan", "--jobs", "1", "--simulate-top", "1", "--tp", "1", "--cp", "1", "--ulysses", "8",
            "--pp", "1", "--policy", "store_all", "--policy", "full_recompute", "--json"]
    d0 = json.loads(CliRunner().invoke(cli, args).output)
    peak0 = d0["candidates"][0]["peak_gpu_bytes"]
    margin = usable - 0.8 * peak0  # leaves less than the best plan's peak: another plan (or nothing) must answer
    r = CliRunner().invoke(cli, [*args, "--headroom", f"{margin / 2**30:.3f}GiB"])
    assert r.exit_code in (0, 3), r.output
    d = json.loads(r.output)
    assert "of each GPU left free (--headroom): plans fit in" in d["profile_provenance"]["line"]
    fits = [c for c in d["candidates"] if c["status"] == "OK"]
    assert all(c["peak_gpu_bytes"] <= usable - margin + 1 for c in fits)
    assert not fits or fits[0]["peak_gpu_bytes"] < peak0
    for bad, needle in (("100%", "--headroom 100%: a share"), ("90GiB", "leaves nothing of the"),
                        ("8", "expected a size like 8GiB or a share like 10%")):
        r = CliRunner().invoke(cli, ["whatif", "--headroom", bad, "--no-plan"])
        assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output, r.output
    m = ["maxseq", "--model", "gpt-7b", "--gpus", "8", "--policy", "full_recompute", "--json", "--jobs", "1"]
    lengths = [json.loads(CliRunner().invoke(cli, [*m, *extra]).output) for extra in ([], ["--headroom", "20%"])]
    longest = [x["answers"][0]["max_seq_tokens"] for x in lengths]
    assert longest[1] < longest[0], longest


def _memo_best(monkeypatch, floor):
    """memo's own best beside megatron's on the README's 512K what-if, with ``floor`` as `_own_floor`'s answer
    ('real': the function itself), and the floors `rank` was given."""
    import memo_sim.search.request as request
    from memo_sim.model.config import get_model
    from memo_sim.profile import load_profile

    from memo_sim.search.whatif import rank as real_rank

    given = []
    real_floor = request._own_floor
    monkeypatch.setattr(request, "rank", lambda *a, **k: given.append(k.get("floor_tgs")) or real_rank(*a, **k))
    if floor != "real":
        monkeypatch.setattr(request, "_own_floor", lambda *a: floor)
    req = request.WhatifRequest(model=get_model("gpt-7b"), seq=512 * 1024, gpus=8, profile=load_profile("a800-80gb"),
                                framework="megatron", jobs=1)
    ans = request.answer_whatif(req)
    monkeypatch.setattr(request, "_own_floor", real_floor)
    return ans.memo_best, given


def test_memo_own_search_from_the_frameworks_best_gives_the_same_answer(monkeypatch):
    """memo's own search beside a framework's starts from the framework's best simulated on memo's mechanisms
    (`_own_floor`, `rank`'s floor_tgs): the same memo_best as without the floor, and a floor the search does not reach
    (as if the variant were faster than any plan memo builds) falls back to the search without one."""
    plain, g0 = _memo_best(monkeypatch, None)
    seeded, g1 = _memo_best(monkeypatch, "real")
    assert g0 == [None, None] and g1[0] is None and g1[1] is not None and g1[1] <= plain.tgs * (1 + 1e-9), g1
    assert (seeded.layout, seeded.policy.label(), seeded.tgs) == (plain.layout, plain.policy.label(), plain.tgs)
    high, g2 = _memo_best(monkeypatch, 10 * plain.tgs)
    assert g2 == [None, 10 * plain.tgs, None]  # the answer's search, the floored one, the one without
    assert (high.layout, high.policy.label(), high.tgs) == (plain.layout, plain.policy.label(), plain.tgs)


def test_the_bound_search_counts_a_floor_as_its_best():
    """`simulate_by_bound`'s floor: candidates whose bound is below it are not simulated; the best reported is it
    where nothing simulated beats it."""
    from memo_sim.search import prune

    class C:
        def __init__(self, bound, tgs):
            self._tgs_upper_bound, self.tgs, self.simulated = bound, tgs, None

    cands = [C(100.0, 90.0), C(80.0, 70.0), C(60.0, 50.0)]
    ran = []

    def sim(cs):
        for c in cs:
            ran.append(c)
            c.simulated = {"status": "OK", "tgs_tokens_per_gpu_s": c.tgs}

    rep = prune.simulate_by_bound(cands, sim, batch=1, floor=85.0)
    assert ran == [cands[0]] and rep.best_tgs == 90.0
    for c in cands:
        c.simulated = None
    ran.clear()
    rep = prune.simulate_by_bound(cands, sim, batch=1, floor=95.0)
    assert ran == [cands[0]] and rep.best_tgs == 95.0  # 100 is above the floor, 80 and 60 are not


def test_a_gap_the_framework_cannot_split_still_names_the_mechanisms_that_differ():
    """Where the framework does not run memo's best layout, the gap split could only say 'layout and mechanisms
    together' (a review: torchtitan's FlashAttention-2 against memo's cuDNN kernel went unsaid behind 1.77x); it names
    the mechanisms the framework runs its own way too, in the text and in --json."""
    import json

    args = ["whatif", "--model", "llama-3.1-70b", "--gpus", "64", "--seq", "128K", "--profile", "h100-sxm5-80gb",
            "--framework", "torchtitan", "--no-plan", "--jobs", "1", "--simulate-top", "1"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if "the gap split" in ln)
    assert "is not one torchtitan runs" in line and "(memo's -> torchtitan's mechanisms: attention cudnn -> flash" in line
    d = json.loads(CliRunner().invoke(cli, [*args, "--json"]).output)
    assert "attention cudnn -> flash" in d["memo_best_on_framework"]["mechanisms"]


def test_a_profile_name_in_another_case_is_the_profile():
    """Model names were found in any case (Llama-3.1-70B) and profile names refused (H100-SXM5-80GB), a review: the
    profile a name in other case names is loaded, by its own name, and a plan keeps that spelling."""
    from memo_sim.plan.schema import with_profile_reference
    from memo_sim.profile import load_profile

    assert load_profile("H100-SXM5-80GB").name == "h100-sxm5-80gb"
    plan = type("P", (), {"profile": "h100-sxm5-80gb"})()
    assert with_profile_reference(plan, "H100-SXM5-80GB") is plan
    r = CliRunner().invoke(cli, ["whatif", "--profile", "H100-sxm", "--no-plan"])
    assert r.exit_code == 2 and "did you mean h100-sxm5-80gb" in r.output, r.output
