"""What a MoE token dispatcher is: the collectives that move each token's hidden state to the ranks
holding the experts it was routed to (dispatch) and its expert outputs back (combine), as data.

A step is (collective, group, what it moves):

- collective: ``alltoall``, ``alltoall_dedup`` (an all-to-all that sends each token across the
  inter-node link once per destination node and forwards it inside the node: DeepEP),
  ``allgather`` or ``reducescatter`` (priced by `memo_sim.cost.collectives` on the group's link,
  `memo_sim.cost.moe`);
- group: ``ep`` (the expert-parallel ranks, ``etp`` apart), ``etp`` (the expert tensor-parallel
  ranks, adjacent) or ``etp_ep`` (both: etp x ep adjacent ranks);
- moves: ``routed`` (each token once per chosen expert: top-k copies, permuted by expert) or
  ``tokens`` (each token once, with its routing map).

Dispatch runs its steps in order after the router and permutation, combine runs its own before
the unpermutation; backward runs each step's transpose (an all-to-all's is an all-to-all, an
all-gather's a reduce-scatter) on the same bytes, so the same time.
"""

from __future__ import annotations

from dataclasses import dataclass

COLLECTIVES = ("alltoall", "alltoall_dedup", "allgather", "reducescatter")
GROUPS = ("ep", "etp", "etp_ep")
MOVES = ("routed", "tokens")


@dataclass(frozen=True)
class Step:
    collective: str
    group: str
    moves: str

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES or self.group not in GROUPS or self.moves not in MOVES:
            raise ValueError(f"bad dispatcher step {self}")


@dataclass(frozen=True)
class Dispatcher:
    name: str
    summary: str
    dispatch: tuple[Step, ...]
    combine: tuple[Step, ...]
    megatron: str  # --moe-token-dispatcher-type
    megatron_backend: str = ""  # --moe-flex-dispatcher-backend (the flex dispatcher's)
    # what its kernels can run (0: no limit): the EP group's ranks, and the GPUs of a node (an NVLink domain),
    # with the source of both (`group_why_not`)
    max_ranks: int = 0
    max_node_gpus: int = 0
    limits_source: str = ""
    # the fewest EP ranks it runs on (a dispatcher that asserts a group to dispatch over), with the source
    min_ranks: int = 1
    min_ranks_source: str = ""
    # whether its kernels take expert inputs padded to a capacity (`memo_sim.layout.moe_balance` ``capacity:F``),
    # with the source where they do not (`balance_why_not`)
    pads_to_capacity: bool = True
    no_padding_source: str = ""
    # the SMs its kernels hold while they run (`memo_sim.cost.comm_sms`; its module says where the count comes from);
    # None: NCCL's kernels (the profile's ``gpu.comm_sms``)
    sms: int | None = None

    def balance_why_not(self, kind: str) -> str | None:
        """Why the dispatcher cannot run the expert-load setting ``kind`` (`memo_sim.layout.moe_balance`), or None."""
        if kind == "capacity" and not self.pads_to_capacity:
            return (f"the {self.name} dispatcher does not pad expert inputs to a capacity ({self.no_padding_source}): "
                    f"use --moe-balance dropless, or another dispatcher (alltoall) with capacity")
        return None

    def group_why_not(self, ep: int, node_gpus: int) -> str | None:
        """Why the dispatcher cannot run an EP group of ``ep`` ranks on nodes of ``node_gpus`` GPUs, or None."""
        if self.max_ranks and ep > self.max_ranks:
            return (f"the {self.name} dispatcher's kernels run at most {self.max_ranks} ranks ({self.limits_source}): "
                    f"ep {ep} is more; use ep <= {self.max_ranks} or another dispatcher (alltoall)")
        if self.max_node_gpus and node_gpus > self.max_node_gpus:  # at any ep: the profile's nodes rule it out
            return (f"the {self.name} dispatcher's kernels run nodes of at most {self.max_node_gpus} GPUs "
                    f"({self.limits_source}): this profile's nodes (NVLink domains) hold {node_gpus}; use another "
                    f"dispatcher (alltoall)")
        if ep < self.min_ranks:
            return (f"the {self.name} dispatcher runs over at least {self.min_ranks} expert-parallel ranks "
                    f"({self.min_ranks_source}): ep {ep} dispatches nothing; use ep >= {self.min_ranks} or another "
                    f"dispatcher (alltoall)")
        return None

    def buffer_step(self, op: str) -> Step:
        """The step whose bytes a rank's receive buffer of the layer graph's ``dispatch`` / ``combine`` op holds
        (`memo_sim.cost.moe.dispatcher_buffer_bytes` sizes it, as the step is priced): dispatch's last step's
        output (the tokens as they arrive: the all-to-all's routed copies, gathered over ETP; the all-gather
        dispatcher's tokens of the whole ETP x EP group, before it picks its local experts' copies out), combine's
        first step's input (the outputs as they leave: the all-gather dispatcher's unpermuted group-sized buffer,
        which it reduce-scatters)."""
        if op not in ("dispatch", "combine"):
            raise ValueError(f"a dispatcher's buffers are its dispatch's and its combine's, not {op!r}")
        return self.dispatch[-1] if op == "dispatch" else self.combine[0]
