"""The SPPO schedule a plan implies, stage by stage: which piece's forward or backward runs when,
and which transfers each one sends and waits for.

The pieces are the simulator's (the plan's `Sppo` policy's ``stage_pieces``, i.e.
`memo_sim.cost.sppo.stage_pieces`: the N subsequences of the plan's bounds, split again where multiplexed partitioning puts
a subsequence in a stage's Left-SP or Right-SP phase). The order is the one
`memo_sim.engine.pipeline` prices: every stage runs the forwards of its pieces in order, then
their backwards in reverse order (a piece's backward adds to the dK/dV of every piece before it).
Forward k of stage s > 0 waits for the activations of every piece of stage s-1 whose tokens
overlap it; backward k of stage s < pp-1 for the input gradients of the overlapping pieces of
stage s+1 (pieces of neighbouring stages differ only where multiplexing split a subsequence).
Each piece's output (forward) and input gradient (backward) is sent once, right after it is
computed; a receiver posts the receives of a neighbour's pieces in the order the neighbour sends
them, so both ends of a pair always issue their point-to-point operations in the same order.

``torch.distributed.pipelining`` (torch 2.13, checked in its source) is not used. Its custom
action lists (``_PipelineScheduleRuntime`` loading a CSV of F/B actions) could order the backwards
in reverse, but (1) a micro-batch ("chunk") is the unit on every stage, while multiplexing gives
neighbouring stages different pieces of one subsequence; (2) the receive buffers of every chunk
are set up from one stage input metadata (``_setup_forward_recv_info`` builds each chunk's recv
info from ``_stage_meta.inputs``), while pieces have different lengths; (3) it treats chunks as
independent, while piece k's forward reads the K/V cache the earlier pieces' forwards left and
its backward must precede theirs (the carried K/V's gradients), which only a stateful module
outside its knowledge could arrange.
"""

from __future__ import annotations

from dataclasses import dataclass

from memo_sim.policy.sppo import Piece  # the simulator's piece (memo_sim.cost.sppo)


@dataclass(frozen=True)
class Action:
    """One step of a stage: the forward or backward of piece ``piece``, with the pieces of the
    neighbour (stage s-1 for a forward, s+1 for a backward) whose transfers it waits for, and
    whether it sends its result on (to s+1 after a forward, to s-1 after a backward)."""

    kind: str  # fwd | bwd
    piece: int
    waits_for: tuple[int, ...]
    sends: bool


def overlapping(pieces: list[Piece], a: int, b: int) -> tuple[int, ...]:
    """Indices of the pieces covering any of the tokens [a, b)."""
    return tuple(k for k, p in enumerate(pieces) if p.start < b and a < p.end)


def stage_actions(pieces: list[list[Piece]], stage: int) -> list[Action]:
    pp = len(pieces)
    own = pieces[stage]
    out = []
    for k, pc in enumerate(own):
        out.append(Action("fwd", k, overlapping(pieces[stage - 1], pc.start, pc.end) if stage > 0 else (),
                          stage < pp - 1))
    for k in range(len(own) - 1, -1, -1):
        pc = own[k]
        out.append(Action("bwd", k, overlapping(pieces[stage + 1], pc.start, pc.end) if stage < pp - 1 else (),
                          stage > 0))
    return out


def check_pieces(pieces: list[list[Piece]], seq: int) -> None:
    """Every stage's pieces tile [0, seq) in order (what the schedule and the K/V cache assume)."""
    for s, ps in enumerate(pieces):
        pos = 0
        for p in ps:
            if p.start != pos or p.end <= p.start:
                raise ValueError(f"stage {s}: pieces do not tile the sequence at token {pos}")
            pos = p.end
        if pos != seq:
            raise ValueError(f"stage {s}: pieces end at {pos}, not at {seq}")
