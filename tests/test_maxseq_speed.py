"""[fidelity] maxseq's probes ask only whether a length fits, and a single-stage candidate that fits decides that
without pricing the micro-batch pipelines (`memo_sim.search.maxseq._single_stage_witness`): every probe answers as
the whole ranking does, the answers are those of the whole ranking, and no fitting grid length past the answer's
first failure is missed."""

import pytest

import memo_sim.search.maxseq as ms
from memo_sim.api import get_model, load_profile

K = 1024
A800 = load_profile("a800-80gb")
H100 = load_profile("h100-sxm5-80gb")
M7 = get_model("gpt-7b")
L8 = get_model("llama-3.1-8b")

# (model, gpus, profile, policy, framework, step, allocator): 8 GPUs, where pipelines of 2, 4 and 8 stages are
# priced beside the single-stage layouts; the gpt-7b full_recompute one fails the caching allocator's replay first
# and is scanned past that failure
CASES = [(M7, 8, A800, "full_recompute", "memo-paper", 32 * K, "caching"),
         (M7, 8, A800, "full_recompute", "memo-paper", 32 * K, "plan"),
         (L8, 8, H100, "recompute_mlp", "megatron", 128 * K, "caching"),
         (L8, 8, H100, "store_all", "any", 128 * K, "caching")]


def _ids(case):
    return f"{case[0].name}-{case[3]}-{case[4]}-{case[6]}"


def _whole(model, seq, gpus, profile, policy, framework, allocator, fixed):
    """Whether ``seq`` fits by the whole ranking (pipelines priced), without the witness."""
    ms.SINGLE_STAGE_FIRST, was = False, ms.SINGLE_STAGE_FIRST
    try:
        return ms._fits(ms._ranked(model, seq, gpus, profile, policy, framework, allocator, fixed))
    except ms.MemoError:
        return False
    finally:
        ms.SINGLE_STAGE_FIRST = was


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_every_probe_answers_as_the_whole_ranking(monkeypatch, case):
    """Each length maxseq probes fits exactly where the whole ranking fits it; a witness is a candidate of the whole
    ranking, priced the same (its layout and peak), and the witness decided some probe (the fast path ran)."""
    model, gpus, profile, policy, framework, step, allocator = case
    ranked, probes, witnessed = ms._ranked, [], []

    def checked(model, seq, gpus, profile, policy, framework, allocator="caching", fixed=None, *, fits_only=False):
        got = ranked(model, seq, gpus, profile, policy, framework, allocator, fixed, fits_only=fits_only)
        if fits_only:
            whole = _whole(model, seq, gpus, profile, policy, framework, allocator, fixed or {})
            probes.append((seq // K, ms._fits(got), whole))
            if not isinstance(got, str) and len(got) == 1 and ms._fits(got):
                w = got[0]
                ms.SINGLE_STAGE_FIRST = False
                try:
                    full = ranked(model, seq, gpus, profile, policy, framework, allocator, fixed)
                finally:
                    ms.SINGLE_STAGE_FIRST = True
                same = [c for c in full if c.layout == w.layout and c.status == "OK"
                        and c.memory.peak_gpu_bytes == w.memory.peak_gpu_bytes]
                assert same, f"witness {w.layout.label()} at {seq // K}K is not among the whole ranking's fits"
                witnessed.append(seq // K)
        return got

    monkeypatch.setattr(ms, "_ranked", checked)
    ms.max_seq(model, gpus, profile, policy, step=step, framework=framework, allocator=allocator, simulate=False,
               fixed=ms.maxseq_fixed(None))
    assert probes and all(fast == whole for _, fast, whole in probes), probes
    assert witnessed  # the single-stage witness decided at least one probe


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_the_answer_is_the_whole_rankings(monkeypatch, case):
    """The same answer, every field, with the witness on and off (the whole ranking at every probe)."""
    model, gpus, profile, policy, framework, step, allocator = case
    kw = dict(step=step, framework=framework, allocator=allocator, simulate=False, fixed=ms.maxseq_fixed(None))
    fast = ms.max_seq(model, gpus, profile, policy, **kw)
    monkeypatch.setattr(ms, "SINGLE_STAGE_FIRST", False)
    whole = ms.max_seq(model, gpus, profile, policy, **kw)
    assert fast.to_json() == whole.to_json()
    assert fast.binding == whole.binding


def test_no_fitting_length_past_the_failure_is_missed():
    """A linear scan by the whole ranking over every grid length from the step to the last one looked at: the answer
    fits, its next length fails, and the lengths past it that fit are exactly those reported (the caching
    allocator's replay fails gpt-7b's full_recompute at 672K, with longer lengths looked at up to 800K)."""
    step, fixed = 32 * K, ms.maxseq_fixed(None)
    ans = ms.max_seq(M7, 8, A800, "full_recompute", step=step, framework="memo-paper", simulate=False, fixed=fixed)
    assert ans.max_seq and ans.looked_past_failure_to  # the case scans past a replay failure
    fits = {k for k in range(1, ans.looked_past_failure_to // step + 1)
            if _whole(M7, k * step, 8, A800, "full_recompute", "memo-paper", "caching", fixed)}
    assert ans.max_seq // step in fits and ans.next_seq // step not in fits
    past = sorted(k * step for k in fits if k * step > ans.next_seq)
    assert list(ans.fits_past_failure) == past


def test_a_fixed_pipeline_degree_prices_everything():
    """With ``pp`` fixed the witness is not looked for (its pp-1 search would not be the question's)."""
    assert ms._single_stage_witness(M7, 64 * K, 8, A800, "full_recompute", "memo-paper", "caching",
                                    {"pp": 2, "tp_mode": "all"}) is None
    assert ms._single_stage_witness(M7, 64 * K, 8, A800, "full_recompute", "memo-paper", "caching",
                                    {"tp_mode": "all"}) is not None

