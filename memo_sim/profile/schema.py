"""Typed hardware profile. Every number is a `Quantity` in base units with its source.

Base units: bytes, seconds, FLOP/s, bytes/s, counts, ratios. Efficiency curves map a kernel's
problem size (its FLOPs) to the fraction of peak it reaches, interpolated linearly in log10(FLOPs)
and held flat outside the measured range.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace
from functools import cached_property

from memo_sim.errors import ProfileError
from memo_sim.profile.attention_kernels import attention_kernel
from memo_sim.units import fmt_bytes


@dataclass(frozen=True)
class Quantity:
    value: float
    source: str

    def __float__(self) -> float:
        return float(self.value)


@dataclass(frozen=True)
class Curve:
    """Efficiency (0..1] as a function of a kernel's FLOPs, piecewise linear in log10(FLOPs)."""

    points: tuple[tuple[float, float], ...]
    source: str

    def __call__(self, flops: float) -> float:
        xs, ys = self._xy
        if flops <= 0:
            return ys[0]
        x = math.log10(flops)
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, x)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    @cached_property
    def _xy(self) -> tuple[list[float], list[float]]:
        """log10 of the points' FLOPs and their efficiencies (computed once: the cost model reads a
        curve for every kernel it prices)."""
        return [math.log10(p[0]) for p in self.points], [p[1] for p in self.points]


@dataclass(frozen=True)
class AllocatorCosts:
    """What the device calls of PyTorch's caching allocator cost the compute stream.

    A reorganisation (cache flush and retry, PyTorch's ``num_alloc_retries``) synchronises the
    device, cudaFrees every cached unsplit segment and cudaMallocs again; while it runs the GPU
    has nothing queued. Priced as

    * ``sync``: seconds per reorganisation for the synchronisation itself (an idle-device
      ``cudaDeviceSynchronize`` plus refilling the launch queue afterwards);
    * a cudaMalloc of ``b`` bytes: ``cuda_malloc_latency + b / cuda_malloc_throughput``;
    * a cudaFree of ``b`` bytes: ``cuda_free_latency + b / cuda_free_throughput``.

    Throughputs are bytes of device memory mapped (unmapped) per second, in bandwidth units.
    """

    sync: Quantity  # seconds
    cuda_malloc_latency: Quantity  # seconds per call
    cuda_malloc_throughput: Quantity  # bytes/s
    cuda_free_latency: Quantity  # seconds per call
    cuda_free_throughput: Quantity  # bytes/s

    def malloc_seconds(self, calls: int, nbytes: float) -> float:
        """Seconds of ``calls`` cudaMalloc calls that map ``nbytes`` in all."""
        return calls * float(self.cuda_malloc_latency) + nbytes / float(self.cuda_malloc_throughput)

    def free_seconds(self, calls: int, nbytes: float) -> float:
        """Seconds of ``calls`` cudaFree calls that release ``nbytes`` in all."""
        return calls * float(self.cuda_free_latency) + nbytes / float(self.cuda_free_throughput)


_ASSUMED = ("assumed default: this profile has no gpu.allocator section (written before memo priced allocator "
            "calls); order of magnitude only, not measured; `memo-exec calibrate` on a CUDA GPU measures it: ")
DEFAULT_ALLOCATOR_COSTS = AllocatorCosts(
    sync=Quantity(20e-6, _ASSUMED + "tens of microseconds for an idle-device synchronise plus one kernel launch "
                  "to refill the queue"),
    cuda_malloc_latency=Quantity(50e-6, _ASSUMED + "tens of microseconds per cudaMalloc call"),
    cuda_malloc_throughput=Quantity(2e12, _ASSUMED + "roughly half a millisecond per GB mapped by cudaMalloc"),
    cuda_free_latency=Quantity(50e-6, _ASSUMED + "tens of microseconds per cudaFree call"),
    cuda_free_throughput=Quantity(1e12, _ASSUMED + "roughly a millisecond per GB unmapped by cudaFree"),
)


@dataclass(frozen=True)
class GPUSpec:
    model: str
    memory_bytes: Quantity
    reserved_bytes: Quantity  # CUDA context, NCCL buffers, library workspaces: not usable for tensors
    peak_flops: dict[str, Quantity]  # dtype -> FLOP/s
    hbm_bandwidth: Quantity
    copy_compute_slowdown: Quantity  # fractional compute slowdown while a host copy runs (HBM contention)
    allocator: AllocatorCosts = DEFAULT_ALLOCATOR_COSTS  # cudaMalloc / cudaFree / synchronise costs
    # CUDA compute capability (major, minor): what the GPU's kernels can take (FP8 GEMM layouts,
    # `memo_sim.cost.gemm_format.fp8_gemm_any_layout`); None where the profile does not say (taken as Hopper's)
    compute_capability: tuple[int, int] | None = None
    # the GPU's streaming multiprocessors, and how many of them an NCCL kernel (collective or send/recv) holds while
    # it runs (its channels, one CTA each): a kernel beside it gets the rest (`memo_sim.cost.comm_sms`); None where
    # the profile does not say (no SM contention priced)
    sm_count: Quantity | None = None
    comm_sms: Quantity | None = None


_NOT_MEASURED = ("not measured: this profile has none (written before memo measured it, or calibrated with one "
                 "head size per case); taken as 0")
NO_TIME = Quantity(0.0, _NOT_MEASURED)


BLOCK_SHAPES = ("full", "causal")  # ring CP's c x c blocks (`Efficiency.attention_curves`)
# the kernels `AttentionTimes` holds measured times of: the whole-sequence causal kernel over ``seq`` tokens,
# and ring CP's full and causal diagonal c x c blocks (``seq`` = c)
ATTENTION_TIME_KERNELS = ("whole", "block_full", "block_causal")


@dataclass(frozen=True)
class AttentionTimes:
    """Seconds the executor's attention kernels took at the shapes `memo-exec calibrate` timed them,
    batch 1: one row ``(kernel, heads, head_dim, seq, fwd_s, bwd_s)`` per case (``kernel`` one of
    `ATTENTION_TIME_KERNELS`; heads are query heads, as many K/V heads). Where a layer's attention has
    a measured (kernel, heads, head_dim) and its length lies within the measured ones,
    `memo_sim.cost.attention_measured` prices it from these rows instead of the efficiency curves: a
    curve over FLOPs plus a time per score element is one fit over every shape, and on a CPU, where
    the score matrix's passes and cache footprint set the time, it misses a shape it was not fitted
    at by 20-40% (reports/cpu-loop.md)."""

    rows: tuple[tuple[str, int, int, int, float, float], ...]
    source: str

    def points(self, kernel: str, heads: int, head_dim: int) -> tuple[tuple[int, float, float], ...]:
        """(seq, fwd_s, bwd_s) of one kernel and head shape, by increasing seq (the median of repeats)."""
        by_seq: dict[int, list[tuple[float, float]]] = {}
        for k, h, d, s, f, b in self.rows:
            if (k, h, d) == (kernel, heads, head_dim):
                by_seq.setdefault(s, []).append((f, b))
        out = []
        for s in sorted(by_seq):
            fs, bs = sorted(x[0] for x in by_seq[s]), sorted(x[1] for x in by_seq[s])
            out.append((s, fs[len(fs) // 2], bs[len(bs) // 2]))
        return tuple(out)



# the attention kernels a profile may give curves of their own for (`memo_sim.profile.attention_kernels`): the
# Efficiency fields of their (forward, backward) curves
OWN_ATTENTION_CURVES = {"cudnn": ("attention_cudnn_fwd", "attention_cudnn_bwd"),
                        "flash_triton": ("attention_flash_triton_fwd", "attention_flash_triton_bwd")}


@dataclass(frozen=True)
class Efficiency:
    """How fast a layer's kernels run, as fractions of the peak and per-call costs.

    ``attention_*_score_time``: seconds per causal score element (one query-key pair of one
    head) that an attention kernel spends beyond its FLOPs at the ``attention_*`` curve: the
    softmax's exponentials and the score matrix's passes scale with seq²·heads whatever the head
    size, the GEMM FLOPs with seq²·heads·head_dim, so a curve over FLOPs alone, measured at one
    head size, under-prices a smaller one. ``kernel_latency``: seconds a memory-bound op (norm,
    activation, residual add) costs beyond its bytes over the bandwidth, per call: what a small
    op pays for its dispatch and for operands that start out in memory, not in cache.
    `memo-exec calibrate` measures the three (attention at two head sizes, the ops at two sizes);
    a profile without them prices both as 0.

    ``attention_block_*``: the kernel ring context parallelism runs per block (memo's executor:
    `memo_exec.block_attention.kernel_for`), where it is not the whole-sequence kernel the
    ``attention_*`` curves describe (on a CPU: aten's flash kernel, against the query-chunked math
    backend). ``attention_block_fwd``/``bwd`` are its curves on full c x c blocks,
    ``attention_block_causal_fwd``/``bwd`` on the causal diagonal c x c blocks (a kernel that works
    in key tiles computes more than the triangle of a small causal block, so its efficiency at the
    triangle's FLOPs is not the full block's), ``attention_block_*_score_time`` its own seconds per
    score element (the curves were fitted beside them; absent: 0). Measured by `memo-exec
    calibrate`; absent where the ring runs the whole-sequence kernel (`attention_curves`)."""

    gemm: Curve
    attention_fwd: Curve
    attention_bwd: Curve
    elementwise: Quantity  # fraction of HBM bandwidth reached by norms / activations / adds
    attention_fwd_score_time: Quantity = NO_TIME  # seconds per causal score element (forward)
    attention_bwd_score_time: Quantity = NO_TIME  # seconds per causal score element (backward)
    kernel_latency: Quantity = NO_TIME  # seconds per memory-bound op call
    # cuDNN's fused attention (TransformerEngine's FusedAttention), where the profile gives it; else the
    # attention_* curves (FlashAttention-2) price it too (`attention_curves`)
    attention_cudnn_fwd: Curve | None = None
    attention_cudnn_bwd: Curve | None = None
    # FlashAttention's Triton kernel (`memo_sim.profile.attention_kernels`), where the profile gives it; else a layout
    # that runs it is refused on this profile (no fallback: it is far slower than FlashAttention-2)
    attention_flash_triton_fwd: Curve | None = None
    attention_flash_triton_bwd: Curve | None = None
    # ring CP's block kernel (class docs): full blocks, causal diagonal blocks, its score times
    attention_block_fwd: Curve | None = None
    attention_block_bwd: Curve | None = None
    attention_block_causal_fwd: Curve | None = None
    attention_block_causal_bwd: Curve | None = None
    attention_block_fwd_score_time: Quantity = NO_TIME
    attention_block_bwd_score_time: Quantity = NO_TIME
    # the executor's attention kernels timed at given shapes (`AttentionTimes`): they price a layer's
    # attention at a measured shape ahead of the curves above
    attention_times: AttentionTimes | None = None
    # a quantised GEMM format's own efficiency curve against its peak, (format name, curve) pairs
    # (`memo_sim.model.gemm_formats`); a format without one runs at the ``gemm`` curve's fractions
    gemm_formats: tuple[tuple[str, Curve], ...] = ()

    def gemm_curve(self, fmt: str | None = None) -> Curve:
        """The GEMM efficiency curve of ``fmt`` (a quantised format's name): its own where the profile
        measured one, else ``gemm``."""
        for name, curve in self.gemm_formats:
            if name == fmt:
                return curve
        return self.gemm

    @property
    def has_block_kernel(self) -> bool:
        """Whether the profile describes ring CP's block kernel apart (class docs)."""
        return self.attention_block_fwd is not None and self.attention_block_bwd is not None

    def attention_curves(self, kernel: str = "flash", block: str = "") -> tuple[Curve, Curve]:
        """(forward, backward) efficiency curves of an attention kernel (`memo_sim.profile.attention_kernels`):
        a kernel's own (cuDNN's, FlashAttention's Triton kernel's) where the profile has them, else the
        FlashAttention-2 ones every profile has (`priced_attention_kernel`: where a kernel without a fallback has none).
        ``block`` (one of `BLOCK_SHAPES`) asks for ring CP's block kernel on a c x c block of that
        shape: the block curves where the profile has them (a causal block: its causal ones, else the
        full blocks'), else those of ``kernel``."""
        if block and block not in BLOCK_SHAPES:
            raise ValueError(f"attention block shape must be one of {', '.join(BLOCK_SHAPES)}, got {block!r}")
        if block and self.has_block_kernel:
            if (block == "causal" and self.attention_block_causal_fwd is not None
                    and self.attention_block_causal_bwd is not None):
                return self.attention_block_causal_fwd, self.attention_block_causal_bwd
            return self.attention_block_fwd, self.attention_block_bwd
        own = self._own_curves(self.priced_attention_kernel(kernel))
        return own if own is not None else (self.attention_fwd, self.attention_bwd)

    def _own_curves(self, kernel: str) -> tuple[Curve, Curve] | None:
        """A kernel's own (forward, backward) curves where the profile gives them, else None (FlashAttention-2's
        price it: ``flash`` and ``materialised``, whose GEMMs `memo_sim.cost.attention_kernel` prices)."""
        pair = tuple(getattr(self, f) for f in OWN_ATTENTION_CURVES.get(kernel, ()))
        return pair if pair and None not in pair else None

    def priced_attention_kernel(self, kernel: str) -> str:
        """The kernel whose curves price a layout's attention ``kernel`` here: one with curves of its own
        (``cudnn``, ``flash_triton``) itself where the profile gives them, else its fallback (``cudnn``: FlashAttention-2's,
        ``flash``); a kernel with no fallback and no curves here is refused (`ProfileError`); any other kernel itself.
        What the executor runs for a plan's ``auto`` backend follows it (`memo_sim.plan.Plan.priced_attention_kernel`)."""
        if kernel not in OWN_ATTENTION_CURVES or self._own_curves(kernel) is not None:
            return kernel
        spec = attention_kernel(kernel)
        if spec.fallback:
            return spec.fallback
        raise ProfileError(f"no efficiency curves for {spec.words} (efficiency.attention_{kernel}_fwd / _bwd): add "
                           "them to the profile, or choose another attention kernel")

    def attention_score_times(self, block: str = "") -> tuple[Quantity, Quantity]:
        """(forward, backward) seconds per score element beside `attention_curves`'s curves: the
        block kernel's own where ``block`` asks for it and the profile has its curves."""
        if block and self.has_block_kernel:
            return self.attention_block_fwd_score_time, self.attention_block_bwd_score_time
        return self.attention_fwd_score_time, self.attention_bwd_score_time


# The collectives a link may carry a measured fit for (`CollectiveFit`); a send/recv is the link's own
# bandwidth and latency, and METP's broadcasts and reduces take those too.
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")


@dataclass(frozen=True)
class CollectiveFit:
    """One collective's own alpha-beta parameters on a link, as measured (`memo-exec calibrate`):
    the per-direction ``bandwidth`` and per-step ``latency`` that `memo_sim.cost.collectives`'s
    formula for that collective needs to give the measured times (a library's implementation of
    an all-gather or a reduce-scatter is not a ping-pong: extra copies, its own algorithm)."""

    bandwidth: Quantity  # bytes/s
    latency: Quantity  # seconds


@dataclass(frozen=True)
class Link:
    bandwidth: Quantity  # bytes/s per direction (a send/recv's, and every collective's without a fit of its own)
    latency: Quantity  # seconds
    # measured per collective (`COLLECTIVES`); a collective not named here is
    # priced from the link's bandwidth and latency above
    collectives: dict[str, CollectiveFit] = field(default_factory=dict)


@dataclass(frozen=True)
class HostLink:
    d2h_bandwidth: Quantity  # one GPU's own PCIe link, device -> host, bytes/s
    h2d_bandwidth: Quantity
    latency: Quantity
    gpus_per_pcie_switch: Quantity
    pcie_switch_bandwidth: Quantity  # switch uplink to the CPU, shared by its GPUs, per direction
    gpus_per_socket: Quantity


@dataclass(frozen=True)
class HostSpec:
    memory_bytes: Quantity  # per node
    usable_fraction: Quantity  # OS, framework, dataloader leave the rest
    memory_bandwidth: Quantity  # per node, caps the sum of all host copies
    pinned_rounding: str  # "power_of_two" (PyTorch's CachingHostAllocator), "page", "none"
    pinned_rounding_source: str


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    description: str
    gpu: GPUSpec
    efficiency: Efficiency
    gpus_per_node: Quantity
    nvlink: Link
    internode: Link  # per GPU (its share of the node's NICs), per direction
    host_link: HostLink
    host: HostSpec
    path: str = ""
    provenance: dict = field(default_factory=dict)
    validation: dict = field(default_factory=dict)  # the error measured for it (loader's _ValidationIn), if any
    gpus_per_host: Quantity | None = None  # GPUs per OS instance where a node (NVLink domain) spans hosts (GB200 NVL72)
    # GPU memory a search leaves free beside ``gpu.reserved_bytes`` (`with_headroom`: whatif's and maxseq's --headroom)
    headroom_bytes: float = 0.0

    # -- convenience in base units -------------------------------------------------------
    @property
    def gpu_memory(self) -> float:
        return float(self.gpu.memory_bytes)

    @property
    def usable_gpu_memory(self) -> float:
        """The bytes a GPU's tensors may take: its memory less what the CUDA context and libraries reserve, less the
        headroom a search was asked to leave (`with_headroom`)."""
        return float(self.gpu.memory_bytes) - float(self.gpu.reserved_bytes) - self.headroom_bytes

    def with_headroom(self, nbytes: float) -> HardwareProfile:
        """This profile with ``nbytes`` more of each GPU's memory left free: every fit, memory plan and caching-allocator
        replay of a search on it counts against the smaller capacity (a plan it writes names the profile, whose
        checks and runs have the whole memory again). The margin a user keeps for what memo's memory model leaves out
        (a review: the default answers ran at 97-100% of the GPU, where memo's own words put the caching allocator's
        measured reserved peak 1.3-17.7% above its replay)."""
        return replace(self, headroom_bytes=self.headroom_bytes + float(nbytes))

    def headroom_words(self) -> str:
        """``; 7.72 GiB of each GPU left free (--headroom): plans fit in 69.46 GiB`` ('' without a headroom)."""
        if not self.headroom_bytes:
            return ""
        return (f"; {fmt_bytes(self.headroom_bytes)} of each GPU left free (--headroom): plans fit in "
                f"{fmt_bytes(self.usable_gpu_memory)}")

    @property
    def node_gpus(self) -> int:
        return int(self.gpus_per_node.value)

    @property
    def host_gpus(self) -> int:
        """GPUs one host (one OS instance: torchrun's node) drives: the node's unless the profile says fewer
        (a GB200 NVL72 rack is one 72-GPU NVLink domain of 18 hosts of 4)."""
        return int(self.gpus_per_host.value) if self.gpus_per_host is not None else self.node_gpus

    def partial_node_words(self, gpus: int) -> str | None:
        """Where ``gpus`` do not fill whole nodes (more than one node, not a multiple of `node_gpus`):
        how memo places them (ranks fill the nodes in order, the last node partly), else None."""
        n = self.node_gpus
        if gpus <= n or gpus % n == 0:
            return None
        return (f"{gpus} GPUs on nodes of {n}: {gpus // n + 1} nodes, the last with {gpus % n} GPUs (ranks fill "
                f"the nodes in order; a group with ranks on two nodes crosses the inter-node link)")

    def provenance_line(self) -> str:
        """How this profile's numbers were obtained, in one line: measured on a device (and the
        validation error measured for it, if any), or datasheet numbers with fitted or assumed
        curves, which an answer should be read with."""
        prov = self.provenance or {}
        method = prov.get("method")
        if method == "calibrated" or prov.get("tool") == "memo-exec calibrate":
            words = f"calibrated on {prov.get('device', 'a device')} ({prov.get('date', 'date unknown')})"
            quick = " with --quick" if prov.get("quick") else ""
            return words + quick + "; " + (self.validation_words() or "not validated yet") + self.headroom_words()
        val = f"; {self.validation_words()}" if self.validation else ""
        if prov.get("summary"):
            return f"not calibrated ({method or 'source unstated'}): {prov['summary']}{val}" + self.headroom_words()
        return ("provenance unknown (no provenance in the profile): treat its answers as assumptions" + val
                + self.headroom_words())

    def validation_words(self) -> str:
        """The validation error measured for this profile, in words (empty when none was)."""
        v = self.validation or (self.provenance or {}).get("validation") or {}
        err = v.get("median_abs_iteration_error", v.get("mean_abs_iteration_error"))
        if err is None:
            return ""
        which = "median" if "median_abs_iteration_error" in v else "mean"
        where = f" on {v['device']}" if v.get("device") else ""
        when = f" ({v['date']})" if v.get("date") else ""
        n = f" over {v['plans']} plans" if v.get("plans") else ""
        tau = f", Kendall tau {v['kendall_tau']:.2f}" if v.get("kendall_tau") is not None else ""
        return f"validated{where}{when}: {which} |iteration error| {100 * err:.1f}%{n}{tau}"

    @property
    def device_kind(self) -> str:
        """The kind of device the profile describes: ``cpu`` for a profile calibrated on a CPU
        (``provenance.device_kind``), else ``cuda``."""
        return (self.provenance or {}).get("device_kind") or "cuda"

    @property
    def calibrated(self) -> bool:
        prov = self.provenance or {}
        return prov.get("method") == "calibrated" or prov.get("tool") == "memo-exec calibrate"

    def peak(self, dtype: str = "bf16") -> float:
        if dtype not in self.gpu.peak_flops:
            from memo_sim.errors import MemoError

            where = f" ({self.path})" if self.path else ""
            raise MemoError(
                f"profile {self.name}{where}: gpu.peak_flops has no {dtype!r} (it has "
                f"{', '.join(self.gpu.peak_flops) or 'none'}); add {dtype}: {{value: ..., unit: TFLOP/s, source: ...}} "
                f"under gpu.peak_flops, or plan another dtype (--dtype, --precision)"
            )
        return float(self.gpu.peak_flops[dtype])

    @property
    def usable_host_memory(self) -> float:
        """Usable pinned host memory of one node (`host_capacity` of a node's GPUs)."""
        return float(self.host.memory_bytes) * float(self.host.usable_fraction)

    def host_capacity(self, gpus_in_node: int) -> float:
        """Usable pinned host memory of the hosts ``gpus_in_node`` GPUs of one node occupy: the node's, where one
        host drives the whole node; of a GB200 NVL72 rack (one 72-GPU node of 18 hosts of 4), only the hosts the
        plan's GPUs take, ceil(g / 4) of the 18 (an 8-GPU plan does not pin the other 16 trays' memory)."""
        return self.usable_host_memory * self._host_share(gpus_in_node)

    def host_memory_bandwidth(self, gpus_in_node: int) -> float:
        """Bytes/s of host memory the hosts ``gpus_in_node`` GPUs of one node occupy serve their copies with (the
        node's, or the share of its hosts they take, as `host_capacity`)."""
        return float(self.host.memory_bandwidth) * self._host_share(gpus_in_node)

    def hosts_taken(self, gpus_in_node: int) -> tuple[int, int]:
        """(the hosts ``gpus_in_node`` GPUs of one node take, the node's hosts): (1, 1) for a node of one host."""
        hosts = -(-self.node_gpus // self.host_gpus)
        return -(-max(1, min(gpus_in_node, self.node_gpus)) // self.host_gpus), hosts

    def _host_share(self, gpus_in_node: int) -> float:
        """The share of one node's hosts that ``gpus_in_node`` of its GPUs take (1: a node of one host)."""
        used, hosts = self.hosts_taken(gpus_in_node)
        return used / hosts
