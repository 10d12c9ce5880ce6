"""Device and dtype choice, and how much memory the device and the host have.

On CUDA the executor computes in the plan's 16-bit dtype (bf16) with fp32 master weights; on CPU
it computes in fp32 (or fp64 for tests) so that gradients can be compared tightly.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from memo_exec.errors import ExecError
from memo_exec.device_forms import DEVICE_FORMS, device_forms_text  # noqa: F401 - re-exported

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}


def memo_dtype_name(torch_name: str) -> str:
    """memo's name of a torch dtype named as torch prints it ("float32" -> "fp32"; the name itself if unknown)."""
    return next((k for k, v in DTYPES.items() if str(v).removeprefix("torch.") == torch_name), torch_name)


@dataclass(frozen=True)
class DeviceSpec:
    kind: str  # "cuda" | "cpu"
    index: int = 0

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.kind, self.index) if self.kind == "cuda" else torch.device("cpu")

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    def describe(self) -> str:
        if self.is_cuda:
            return f"cuda:{self.index} ({torch.cuda.get_device_name(self.index)})"
        return f"cpu ({os.cpu_count()} cores, torch {torch.__version__})"


_CUDA = re.compile(r"cuda(?::(0|[1-9][0-9]*))?")  # torch.device refuses "cuda:01"


def check_device_name(name: str, forms: tuple[str, ...] = DEVICE_FORMS) -> None:
    """Refuse, in one line naming --device and listing ``forms``, a --device spelled as none of them (``cuda:abc``,
    ``cudax``, ``cuda:-1``: no CUDA is needed to refuse them); where CUDA exists, a ``cuda:N`` beyond the visible
    devices too. Whether CUDA exists for ``cuda`` is `resolve_device`'s to say."""
    m = _CUDA.fullmatch(name)
    if m and ("cuda:N" if m.group(1) else "cuda") in forms:
        if m.group(1) and torch.cuda.is_available() and int(m.group(1)) >= torch.cuda.device_count():
            n = torch.cuda.device_count()
            raise ExecError(f"--device {name}: only {n} CUDA device(s) visible (cuda:0 to cuda:{n - 1}); give one of "
                            f"those, or --device cuda")
        return
    if name in forms and name != "cuda:N":
        return
    raise ExecError(f"--device {name!r} is not a device this command takes; give {device_forms_text(forms)}")


def resolve_device(name: str | None) -> DeviceSpec:
    """``None``/``auto``: CUDA when available, else CPU. A spelling other than `DEVICE_FORMS` is an error
    (`check_device_name`), and so is asking for CUDA without one."""
    if name in (None, "auto"):
        return DeviceSpec("cuda") if torch.cuda.is_available() else DeviceSpec("cpu")
    check_device_name(name)
    if name == "cpu":
        return DeviceSpec("cpu")
    if not torch.cuda.is_available():
        raise ExecError(f"--device {name}: no CUDA device is visible to torch {torch.__version__}; use --device cpu")
    return DeviceSpec("cuda", int(name.partition(":")[2] or 0))  # an index below the count: check_device_name


def compute_dtype(model_dtype: str, device: DeviceSpec, override: str | None = None) -> torch.dtype:
    """The plan's model dtype on CUDA, fp32 on CPU, unless ``override`` (fp32|fp64|bf16) says otherwise."""
    if override is not None:
        if override not in DTYPES:
            raise ExecError(f"--dtype must be one of {', '.join(DTYPES)}, got {override!r}")
        name = override
    elif device.is_cuda:
        name = model_dtype
    else:
        name = "fp32"
    if name == "fp16":
        raise ExecError("fp16 training needs loss scaling, which this executor does not implement; use bf16")
    if device.is_cuda and name == "fp64":
        raise ExecError("fp64 is for CPU gradient checks only; use bf16 or fp32 on CUDA")
    return DTYPES[name]


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype for softmax statistics, norms and optimizer states."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype, device="meta").element_size()


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def cgroup_available_bytes(proc_cgroup: str | Path = "/proc/self/cgroup",
                           root: str | Path = "/sys/fs/cgroup") -> int | None:
    """Memory this process's cgroup still allows (limit minus usage, the tightest over the cgroup
    and its ancestors), or None without a limit. cgroup v2: ``memory.max`` - ``memory.current``;
    v1: ``memory.limit_in_bytes`` - ``memory.usage_in_bytes`` under the memory controller."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    root = Path(root)
    candidates: list[tuple[Path, str, str]] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.strip().lstrip("/")
        if controllers == "":  # v2 unified hierarchy
            candidates.append((root / rel, "memory.max", "memory.current"))
        elif "memory" in controllers.split(","):
            candidates.append((root / "memory" / rel, "memory.limit_in_bytes", "memory.usage_in_bytes"))
    best: int | None = None
    for base, limit_file, usage_file in candidates:
        d = base
        while True:
            limit, usage = _read_int(d / limit_file), _read_int(d / usage_file)
            if limit is not None and usage is not None and limit < 2**60:  # v1 writes ~2^63 for no limit
                free = max(0, limit - usage)
                best = free if best is None else min(best, free)
            if d == root or root not in d.parents:
                break
            d = d.parent
    return best


def host_available_bytes() -> int:
    """Host memory available to this process now: the smaller of the kernel's MemAvailable (or the
    physical memory when /proc/meminfo has none) and what its cgroup still allows."""
    avail = _meminfo("MemAvailable")
    if avail is None:
        avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cg = cgroup_available_bytes()
    return avail if cg is None else min(avail, cg)


def device_free_bytes(device: DeviceSpec) -> tuple[int, int]:
    """(free, total) bytes of the compute device; for CPU the host's available and total memory."""
    if device.is_cuda:
        free, total = torch.cuda.mem_get_info(device.index)
        return int(free), int(total)
    total = _meminfo("MemTotal") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return host_available_bytes(), int(total)


def process_rss_bytes() -> tuple[int, int]:
    """(current, peak) resident set of this process from /proc/self/status (VmRSS, VmHWM)."""
    cur = peak = 0
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    cur = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
    except OSError:
        pass
    return cur, peak


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_rss_now() -> int:
    """The resident set of this process now, from /proc/self/statm (one short line: the executor
    samples it after every layer on a CPU, so it must cost microseconds, not the ~0.1 ms of
    parsing /proc/self/status); 0 where it is not readable."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def reset_process_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def calibrated_threads(provenance: dict | None) -> int | None:
    """The torch CPU threads a profile was calibrated with (its ``provenance.torch_threads``), or None.

    A CPU profile's rates hold for that many threads: a run with more threads than the calibration
    had (torch's default is every core) makes its OpenMP threads wait for each other whenever one
    loses its core to another process or to the executor's copy threads, and then runs many
    times slower than the profile predicts. CPU runs therefore use the calibration's count."""
    n = (provenance or {}).get("torch_threads")
    return int(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


# set (to "1") where `memo-exec run --nproc` chose OMP_NUM_THREADS itself, not the user
# (`memo_exec.distributed.launch.launch_nproc`): its one thread a rank is a default the plan's profile's
# calibration replaces (`use_calibrated_threads`)
LAUNCHER_THREADS_ENV = "MEMO_EXEC_LAUNCHER_THREADS"


def profile_provenance(profile_name: str) -> tuple[dict | None, str]:
    """(``provenance`` of the plan's profile, ""), or (None, the loader's first line) where it is not readable
    here (a profile written on another machine)."""
    from memo_sim.errors import MemoError  # noqa: PLC0415
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415

    try:
        return load_profile(profile_name).provenance or {}, ""
    except MemoError as e:
        return None, str(e).splitlines()[0]


def use_calibrated_threads(profile_name: str) -> dict:
    """Set torch's CPU threads to the count ``profile_name``'s calibration ran with (`calibrated_threads`),
    unless the user's ``OMP_NUM_THREADS`` chooses them (the launcher's own default of one a rank does not):
    what a CPU run used and why (the run's report says it)."""
    prov, missing = profile_provenance(profile_name)
    n = calibrated_threads(prov)  # a profile not readable here: said, not read as one without threads
    launcher = bool(os.environ.get(LAUNCHER_THREADS_ENV))
    unknown = f"the plan's profile is not readable here: {missing}" if missing \
        else "the profile records no calibration's threads"
    if os.environ.get("OMP_NUM_THREADS") and not launcher:
        why = "OMP_NUM_THREADS"
    elif n is not None:
        torch.set_num_threads(n)
        why = "the profile's calibration"
    elif launcher:
        why = f"the launcher's default, one a rank ({unknown})"
    else:
        why = f"torch's default ({unknown})"
    return {"threads": torch.get_num_threads(), "calibrated": n, "set_by": why}

