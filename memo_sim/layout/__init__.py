"""Parallel layouts (TP with or without SP, ring CP, Ulysses, DP with ZeRO) and their rules."""

from memo_sim.layout.parallel import Layout, check_layout, enumerate_layouts, group_spans_nodes

__all__ = ["Layout", "check_layout", "enumerate_layouts", "group_spans_nodes"]
