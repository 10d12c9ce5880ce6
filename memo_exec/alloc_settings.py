"""The plan's caching-allocator settings, applied to the run (``layout.expandable_segments`` and
``layout.alloc_conf``, parsed by `memo_sim.layout.alloc_conf`).

On CUDA the allocator settings go into ``PYTORCH_CUDA_ALLOC_CONF`` before CUDA's allocator reads it (`set_env`:
`memo-exec run` sets it in its own process before anything touches CUDA, so that the ranks `--nproc` launches
inherit it), and ``per_process_memory_fraction`` (not an environment key) is
``torch.cuda.set_per_process_memory_fraction`` on the rank's device before its first allocation
(`apply_fraction`); the pre-run fit check then measures against the capped capacity (`capped_free`). On a CPU
the settings have no effect, which the run says in one line (`cpu_line`).
"""

from __future__ import annotations

import dataclasses
import os

from memo_exec.errors import ExecError

ENV = "PYTORCH_CUDA_ALLOC_CONF"


def plan_settings(layout):
    """The layout's parsed settings (`memo_sim.layout.alloc_conf.AllocConf`), or None where it keeps PyTorch's
    defaults (no ``alloc_conf``, expandable segments off)."""
    from memo_sim.errors import MemoError  # noqa: PLC0415
    from memo_sim.layout.alloc_conf import merged_alloc_conf  # noqa: PLC0415

    if not layout.alloc_conf and not layout.expandable_segments:
        return None
    try:
        conf = merged_alloc_conf(layout.expandable_segments, layout.alloc_conf)
    except MemoError as e:
        raise ExecError(f"plan layout {layout.label()}: {e}; re-create the plan with memo-sim whatif") from None
    return dataclasses.replace(conf, expandable_segments=conf.expandable_segments or None)  # False: the default


def env_text(conf) -> str:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` text of ``conf``: every key but the memory fraction (a function call)."""
    return dataclasses.replace(conf, per_process_memory_fraction=None).text()


def plan_text(layout) -> str:
    """The layout's settings as one string (``""``: PyTorch's defaults)."""
    conf = plan_settings(layout)
    return conf.text() if conf is not None else ""


def set_env(layout, device: str | None) -> None:
    """Put the layout's allocator settings into ``PYTORCH_CUDA_ALLOC_CONF`` unless the run is on a CPU (call it
    before anything allocates on CUDA). A different value already in the environment is refused in one line:
    the run would measure another allocator than the one the plan was priced with."""
    conf = plan_settings(layout)
    if conf is None or (device or "").startswith("cpu"):
        return
    text = env_text(conf)
    have = os.environ.get(ENV)
    if have and have.replace(" ", "") != text:
        raise ExecError(f"{ENV}={have!r} differs from the plan's allocator settings {text!r} (layout.alloc_conf, "
                        f"layout.expandable_segments): unset {ENV} to run the plan as priced")
    if text:
        os.environ[ENV] = text


def fraction(layout) -> float | None:
    """The layout's ``per_process_memory_fraction`` (None: none)."""
    conf = plan_settings(layout)
    return conf.per_process_memory_fraction if conf is not None else None


def apply_fraction(layout, device_spec) -> None:
    """On CUDA, cap what this process's allocator may reserve on its device at the plan's fraction."""
    f = fraction(layout)
    if f is not None and device_spec.is_cuda:
        import torch  # noqa: PLC0415

        torch.cuda.set_per_process_memory_fraction(f, device_spec.index)


def capped_free(layout, device_spec, free: int, total: int) -> int:
    """The bytes the run may still take on its device: ``free``, or less under the plan's memory fraction (the
    fraction of ``total`` less what this process has reserved already)."""
    f = fraction(layout)
    if f is None or not device_spec.is_cuda:
        return free
    import torch  # noqa: PLC0415

    return max(0, min(free, int(f * total) - int(torch.cuda.memory_reserved(device_spec.index))))


def cpu_line(layout, device_spec) -> str | None:
    """One line where the plan sets allocator settings and the run is on a CPU (they have no effect there)."""
    text = plan_text(layout)
    if not text or device_spec.is_cuda:
        return None
    return (f"note: the plan's allocator settings {text} (layout.alloc_conf, expandable_segments) have no effect "
            f"on CPU: the run uses the CPU allocator; run on CUDA to apply them")
