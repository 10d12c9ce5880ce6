#!/usr/bin/env python
"""Check that Megatron-LM reads the --pipeline-model-parallel-layout strings memo writes as memo means them.

Reads ``PipelineParallelLayerLayout.parse_str_to_list`` from a Megatron-LM checkout (its source, at the commit
the checkout has; it imports nothing else of Megatron), and for random per-chunk layer counts compares the
transformer layers per stage it parses out of `memo_sim.layout.pipeline_layout.format_layout` with the counts.

    python benchmarks/check_megatron_layout.py --megatron /path/to/Megatron-LM [--cases 300] [--seed 1]

Prints one line: the commit read, the cases, and the first mismatch if any (exit 1 then).
"""

from __future__ import annotations

import argparse
import ast
import random
import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from memo_sim.layout.pipeline_layout import format_layout  # noqa: E402

SOURCE = "megatron/core/transformer/pipeline_parallel_layer_layout.py"


def megatron_parser(root: Path):
    """Megatron's ``parse_str_to_list`` from the checkout, with its layer types as their letters."""
    tree = ast.parse((root / SOURCE).read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "parse_str_to_list")
    src = textwrap.dedent(ast.get_source_segment((root / SOURCE).read_text(), fn))
    names = {"LayerType": type("LayerType", (), {"embedding": "E", "loss": "L", "decoder": "t", "mtp": "m"})}
    ns: dict = {"re": __import__("re"), **names}
    exec(compile(src, str(root / SOURCE), "exec"), ns)  # noqa: S102 - the user's own checkout
    return ns["parse_str_to_list"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--megatron", required=True, help="a Megatron-LM checkout (its work tree)")
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    root = Path(a.megatron)
    if not (root / SOURCE).is_file():
        print(f"error: --megatron {root}: no {SOURCE} there", file=sys.stderr)
        return 2
    parse = megatron_parser(root)
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=10", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown commit"
    rng = random.Random(a.seed)
    for i in range(a.cases):
        counts = tuple(rng.choice([1, 2, 3, 7, 8, 16]) for _ in range(rng.randint(1, 32)))
        text = format_layout(counts)
        got = tuple(stage.count("t") for stage in parse(text))
        if got != counts:
            print(f"Megatron-LM {commit}: case {i}: {text!r} parses to {got}, memo meant {counts}")
            return 1
    print(f"Megatron-LM {commit}: {a.cases} random layouts, each read back as memo wrote it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
