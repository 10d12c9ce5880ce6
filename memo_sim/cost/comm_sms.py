"""The SMs a communication kernel holds while it runs, and what that leaves a kernel beside it.

An NCCL collective or send/recv is a kernel of one CTA per channel, each CTA on an SM of its own for the whole
transfer (NCCL's channels: ``gpu.comm_sms`` of the profile, as NCCL logs them on the node). A kernel that runs on
another stream meanwhile (a GEMM, attention) gets the SMs left: memo runs a kernel at ``(S - held) / S`` of its
stand-alone speed while communication kernels holding ``held`` of the GPU's ``S`` SMs (``gpu.sm_count``) run
beside it on its device (`memo_sim.engine.core`; the kernels' stand-alone times come from curves measured with
nothing beside them). Host copies and PyTorch's async TP move data by copy engine and hold no SM (async TP's
collectives are priced inside their GEMMs, `memo_sim.tp.async_tp`); DeepEP's kernels hold the SMs Megatron-LM
gives them (`memo_sim.layout.moe_dispatchers.base.Dispatcher.sms`).

Not modelled: the wave quantisation that SMs taken mid-kernel cause (a GEMM of exactly one wave of tiles then
needs a second, partial one: slower than the SM share says), the channels NCCL drops for small messages (fewer SMs
held), the HBM bandwidth the communication kernels use, and the SMs a receiving peer's kernel holds (memo's
send/recv is an op of the sender).
"""

from __future__ import annotations

from memo_sim.layout.moe_dispatchers import dispatcher
from memo_sim.profile.schema import HardwareProfile


def priced(profile: HardwareProfile) -> bool:
    """Whether the profile says how many SMs the GPU has and an NCCL kernel holds (older profiles do not)."""
    return profile.gpu.sm_count is not None and profile.gpu.comm_sms is not None


def nccl_sms(profile: HardwareProfile) -> float:
    """SMs an NCCL kernel holds on this profile's GPUs (0 where the profile does not say)."""
    return float(profile.gpu.comm_sms) if priced(profile) else 0.0


def collective_sms(name: str, layout) -> float | None:
    """SMs the layer collective ``name`` holds where it is not an NCCL kernel's (a MoE dispatcher of its own
    kernels: DeepEP), or None (NCCL's: the profile's ``gpu.comm_sms``, resolved by the engine)."""
    if name.startswith("moe_"):
        sms = dispatcher(layout.moe_dispatcher).sms
        return None if sms is None else float(sms)
    return None


def compute_share(held: float, profile: HardwareProfile) -> float:
    """The share of its stand-alone speed a kernel runs at while communication kernels hold ``held`` SMs of its
    GPU (at least one SM stays its own: NCCL's CTAs cannot take them all)."""
    if held <= 0.0 or not priced(profile):
        return 1.0
    total = float(profile.gpu.sm_count)
    return max(total - held, 1.0) / total
