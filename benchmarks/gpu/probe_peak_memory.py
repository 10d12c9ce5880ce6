#!/usr/bin/env python
"""Where a plan's measured peak of allocated device memory comes from: run ``memo-exec run`` in
this process with PyTorch's allocator history on, then replay the history and print the live
allocations at the peak (and at the start of the last step) grouped by the innermost memo frame
that made them, as JSON lines.

    python3 benchmarks/gpu/probe_peak_memory.py PLAN.json --profile PROFILE.yaml [--steps 2]
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile

import torch


def site(frames: list[dict]) -> str:
    for f in frames or []:
        name = f.get("filename", "")
        if "memo_exec" in name:
            return f"{'/'.join(name.split('/')[-2:])}:{f.get('line')} {f.get('name')}"
    return "(outside memo_exec)"


def replay(entries: list[dict]):
    """(peak bytes, index of the peak, live allocations at the peak grouped by site)."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at = -1
    for i, e in enumerate(entries):
        a = e.get("action")
        if a == "alloc":
            live[e["addr"]] = (e["size"], site(e.get("frames")))
            total += e["size"]
            if total > peak:
                peak, at = total, i
        elif a == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
    live, total = {}, 0
    for e in entries[:at + 1]:
        a = e.get("action")
        if a == "alloc":
            live[e["addr"]] = (e["size"], site(e.get("frames")))
        elif a == "free_completed" and e["addr"] in live:
            live.pop(e["addr"])
    groups: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for size, s in live.values():
        groups[s][0] += size
        groups[s][1] += 1
    peak_site = site(entries[at].get("frames")) if at >= 0 else None
    return peak, at, peak_site, sorted(groups.items(), key=lambda kv: -kv[1][0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("plan")
    ap.add_argument("--profile", required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    from memo_exec.cli import cli  # noqa: PLC0415

    torch.cuda.memory._record_memory_history(max_entries=3_000_000, context="alloc", stacks="python")
    out = tempfile.mkdtemp(prefix="probe-peak-")
    try:
        cli.main(args=["run", a.plan, "--device", "cuda", "--steps", str(a.steps), "--profile", a.profile, "--out",
                       out], prog_name="memo-exec", standalone_mode=False)
    except SystemExit as e:  # noqa: PERF203 - report and analyse what was recorded
        print(json.dumps({"exit": str(e.code)}))
    except torch.OutOfMemoryError as e:
        print(json.dumps({"oom": str(e)[:300]}))
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    entries = snap["device_traces"][torch.cuda.current_device()]
    peak, at, peak_site, groups = replay(entries)
    print(json.dumps({"plan": a.plan, "entries": len(entries), "peak_gib": peak / 2**30, "peak_event": at,
                      "allocation_at_peak": peak_site,
                      "max_memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30}))
    for s, (b, n) in groups[:a.top]:
        print(json.dumps({"site": s, "gib": round(b / 2**30, 4), "tensors": n}))


if __name__ == "__main__":
    main()
