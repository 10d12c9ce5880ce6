"""Build the hardware-profile YAML from a calibration run, validate it, write it atomically.

Every number carries its source: ``measured: ...`` (what was run, on which device, when),
``from base profile X, not measured: <X's own source>`` for what this machine cannot show
(inter-node links, NVLink on a one-GPU box, PCIe switch topology, a GPU host's memory
bandwidth), or, on CPU, a documented convention (one device per node, no PCIe). The result must
pass `memo_sim.profile.loader.parse_profile` before anything is written.

`build_profile` assembles the sections, each built by one step below (`gpu_section`,
`efficiency_section`, `link_sections`, `host_link_section`, `host_section`, `provenance`) from
the run's results and a `Build` that records which fields were measured and which came from
the base profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memo_exec.calibrate.allocator import profile_fields as allocator_fields
from memo_exec.calibrate.collectives import FIT_FROM
from memo_exec.calibrate.allocator import summary as allocator_summary
from memo_exec.calibrate.microbench import TIMING_STATISTIC
from memo_exec.calibrate.quantities import (GiB, MiB, FlowMap, curve, dump_yaml, plain, q, q_bw, q_bytes, q_time,
                                            sig)
from memo_exec.calibrate.fit import SCORE_TIME_HEADROOM
from memo_sim.errors import MemoError
from memo_sim.fileio import atomic_write_text, load_yaml
from memo_sim.profile.loader import SCHEMA, list_profiles, load_profile, parse_profile
from memo_sim.profile.schema import HardwareProfile

@dataclass(frozen=True)
class BaseProfile:
    name: str
    path: Path
    raw: dict
    profile: HardwareProfile

    def quantity(self, dotted: str, note: str = "not measured") -> FlowMap:
        node: Any = self.raw
        for k in dotted.split("."):
            node = node[k]
        out = FlowMap(value=node["value"])
        if "unit" in node:
            out["unit"] = node["unit"]
        out["source"] = f"from base profile {self.name}, {note}: {node['source']}"
        return out


def load_base(name_or_path: str) -> BaseProfile:
    """A builtin profile by name or a profile file, validated, with its raw fields (units, sources)."""
    prof = load_profile(name_or_path)  # raises ProfileError with the file and field
    p = Path(name_or_path)
    path = p if (p.suffix in (".yaml", ".yml", ".json") or p.exists()) else list_profiles()[str(name_or_path)]
    raw = load_yaml(Path(path).read_text())
    return BaseProfile(prof.name, Path(path), raw, prof)


def _graph_words(rows: list[dict]) -> str:
    """How many GEMMs were timed by CUDA-graph replay (`Bench.time_kernel`), for the curve's source."""
    n = sum(1 for row in rows if row.get("timing") == "cuda_graph")
    return f" ({n} short ones timed by CUDA-graph replay, per call)" if n else ""


def _fmt_list(xs) -> str:
    return "{" + ", ".join(str(x) for x in xs) + "}"


@dataclass
class Build:
    """One profile being built: the run's results, the base profile, and which fields were
    measured and which were taken from the base (or are CPU conventions), in the order built."""
    r: dict
    base: BaseProfile | None
    node_from_base: bool = False
    measured_fields: list[str] = field(default_factory=list)
    base_fields: list[str] = field(default_factory=list)

    @property
    def cuda(self) -> bool:
        return self.r["env"]["device_kind"] == "cuda"

    @property
    def at(self) -> str:
        return f"on {self.r['env']['device']}, {self.r['env']['date']}"

    def need_base(self, fld: str) -> BaseProfile:
        if self.base is None:
            raise MemoError(f"{fld} cannot be measured on this machine and no --base profile was given")
        self.base_fields.append(fld)
        return self.base

    def measured(self, fld: str, v):
        self.measured_fields.append(fld)
        return v


def _gpu_memory(b: Build) -> tuple[FlowMap, FlowMap, dict]:
    """(gpu.memory, gpu.reserved, gpu.peak_flops)."""
    r, at, pk = b.r, b.at, b.r["peak"]
    if b.cuda:
        m0, m1 = r["memory_start"], r["memory_end"]
        gpu_mem = b.measured("gpu.memory", q_bytes(m1["total"], f"measured: torch.cuda.mem_get_info total "
                                                                 f"({m1['total']} bytes) {at}"))
        outside = max(m0["outside_torch"], m1["outside_torch"])
        reserved = b.measured("gpu.reserved", q_bytes(
            outside, f"measured: device memory in use outside PyTorch's caching allocator (CUDA context, "
                     f"cuBLAS/cuDNN handles) after the kernels ran, {outside} bytes {at}; NCCL buffers not included"))
        peaks = {"bf16": q(pk["value"] / 1e12, "TFLOP/s", f"{pk['source']}; not measured (best measured bf16 "
                                                              f"GEMM: {pk['best_measured'] / 1e12:.1f} TFLOP/s)")}
        if "fp32" in pk["datasheet"]:
            peaks["fp16"] = q(pk["value"] / 1e12, "TFLOP/s", f"{pk['source']} (dense fp16 = dense bf16); "
                                                              "efficiency curves were measured in bf16")
            peaks["fp32"] = q(pk["datasheet"]["fp32"] / 1e12, "TFLOP/s",
                              f"{pk['source']}; efficiency curves were measured in bf16 and do not apply to fp32")
        return gpu_mem, reserved, peaks
    budget = r["cpu_budget"]
    ranks = cpu_ranks(r)
    half = (f"half of the host's {r['host_memory']['total'] / GiB:.1f} GiB" if ranks == 1 else
            f"half of the host's {r['host_memory']['total'] / GiB:.1f} GiB over its {ranks} ranks")
    gpu_mem = q_bytes(budget["bytes"], "CPU run: the executor's device memory is host RAM; this is the budget "
                      "a rank may use" + (f", default min(8 GiB, {half})" if budget["default"] else " (--gpu-memory)"))
    b.base_fields.append("gpu.memory (CPU budget)")
    reserved = b.measured("gpu.reserved", q_bytes(
        r["framework_rss"], f"measured: resident set of the calibrating process after importing torch, before "
                            f"the benchmarks ({r['framework_rss']} bytes) {at}"))
    peaks = {"fp32": b.measured("gpu.peak_flops.fp32", q(pk["value"] / 1e9, "GFLOP/s", f"{pk['source']}, {at}"))}
    return gpu_mem, reserved, peaks


def _bytes_of(qv: FlowMap) -> float:
    return float(qv["value"]) * (GiB if qv["unit"] == "GiB" else MiB)


def gpu_section(b: Build) -> dict:
    """``gpu``: memory, reserved, peaks, memory bandwidth, copy/compute slowdown, allocator."""
    r, at = b.r, b.at
    gpu_mem, reserved, peaks = _gpu_memory(b)
    if _bytes_of(reserved) >= _bytes_of(gpu_mem):
        raise MemoError(f"measured reserved memory ({reserved['value']} {reserved['unit']}) is not below the device "
                        f"memory ({gpu_mem['value']} {gpu_mem['unit']}); raise --gpu-memory")
    hbm = r["hbm"]
    hbm_q = b.measured("gpu.hbm_bandwidth", q_bw(hbm["bandwidth"], (
        f"measured: the faster of a {hbm['bytes'] / MiB:.0f} MiB device copy ({hbm['copy_bytes_per_s'] / 1e9:.1f} "
        f"GB/s) and add ({hbm['add_bytes_per_s'] / 1e9:.1f} GB/s), bytes read + written per second, {at}")))
    cc = r["copies"]["copy_compute"]
    slow = r["copies"]["compute_slowdown"]
    slow_src = (f"measured: a {cc['gemm_n']}^3 {r['dtype']} GEMM loop ({cc['compute_alone_s'] * 1e3:.0f} ms alone) "
                f"slows by {cc['d2h']['compute_slowdown'] * 100:+.1f}% while d2h copies run and "
                f"{cc['h2d']['compute_slowdown'] * 100:+.1f}% while h2d copies run "
                f"({cc['both']['compute_slowdown'] * 100:+.1f}% with both); mean of the two single-direction values"
                + ("" if 0 <= slow <= 1 else ", clamped to [0, 1]") + f", {at}")
    slow_q = b.measured("gpu.copy_compute_slowdown", q(min(1.0, max(0.0, slow)), "ratio", slow_src))
    gpu = {"model": r["env"]["device"], "memory": gpu_mem, "reserved": reserved, "peak_flops": peaks,
           "hbm_bandwidth": hbm_q, "copy_compute_slowdown": slow_q}
    if r["env"].get("compute_capability"):  # a CUDA device's (`memo_sim.cost.gemm_format.fp8_gemm_any_layout`)
        gpu["compute_capability"] = b.measured("gpu.compute_capability", {
            "value": r["env"]["compute_capability"],
            "source": f"measured: torch.cuda.get_device_properties major.minor, {at}"})
    alloc, alloc_measured, alloc_not_measured = allocator_fields(r, at, b.base)
    if alloc is not None:  # absent: the simulator's assumed defaults (CPU, or nothing measured or in the base)
        gpu["allocator"] = alloc
    b.measured_fields += alloc_measured
    b.base_fields += alloc_not_measured
    return gpu


def efficiency_section(b: Build) -> dict:
    """``efficiency``: GEMM and attention curves, the memory-bound ops' share of the bandwidth."""
    r, grid, pk, at = b.r, b.r["grid"], b.r["peak"], b.at
    g = r["gemm"]
    forms = sorted({row["form"] for row in g["rows"]})
    peak_words = (f"peak {pk['value'] / 1e12:.1f} TFLOP/s ({pk['source']})" if b.cuda
                  else f"the best measured fp32 GEMM, {pk['value'] / 1e9:.1f} GFLOP/s")
    fit_words = "binned per half decade of FLOPs, median per bin, isotonic (non-decreasing) fit"
    gemm_src = (f"measured: {len(g['rows'])} {r['dtype']} GEMMs ({'/'.join(forms)} forms of the GPT layer's QKV, "
                f"out-proj, FC1, FC2 for h in {_fmt_list(grid['gemm_hiddens'])}, TP in {_fmt_list(grid['gemm_tps'])}, "
                f"T in {_fmt_list(grid['gemm_tokens'])}) {at}{_graph_words(g['rows'])}; efficiency = achieved / "
                f"{peak_words}; {fit_words}"
                + (f"; {g['clipped']} point(s) above the peak clipped to 1" if g["clipped"] else ""))
    a = r["attention"]
    hd = ", ".join(f"{h}x{d}" for h, d in grid["attn_heads_dims"])
    attn_what = (f"{len(a['rows'])} causal attention problems (backend {a['backend']}, {r['dtype']}, batch 1, "
                 f"s in {_fmt_list(grid['attn_seqs'])}, heads x head_dim in {{{hd}}}) {at}")
    clip_a = f"; {a['clipped']} point(s) above the peak clipped to 1" if a["clipped"] else ""
    e = r["elementwise"]
    ops = ", ".join(f"{k} {v['bytes_per_s'] / 1e9:.1f} GB/s" for k, v in e["ops"].items())
    return {
        "gemm": b.measured("efficiency.gemm", curve(g["curve"], gemm_src)),
        "attention_fwd": b.measured("efficiency.attention_fwd", curve(a["fwd_curve"], (
            f"measured: forward of {attn_what}; FLOPs 2*b*s^2*h (causal); efficiency = achieved / {peak_words}; "
            f"{fit_words}{clip_a}"))),
        "attention_bwd": b.measured("efficiency.attention_bwd", curve(a["bwd_curve"], (
            f"measured: backward of {attn_what}; FLOPs 2.5x the forward's; efficiency = achieved / {peak_words}; "
            f"{fit_words}{clip_a}"))),
        **_score_times(b, a, attn_what),
        **_ring_blocks(b, a.get("ring_blocks"), peak_words, fit_words),
        **_attention_times(b, a),
        **_call_latency(b, e),
        "elementwise": b.measured("efficiency.elementwise", q(e["fraction"], "ratio", (
            f"measured: one layer's layer-norm, residual-add and GELU forward and backward as memo_exec runs them "
            f"(T={e['tokens']}, h={e['hidden']}, f={e['ffn']}, {r['dtype']}; {ops}), bytes counted as the simulator "
            f"counts them: {e['layer_bytes_per_s'] / 1e9:.1f} GB/s = {e['fraction_raw']:.3f} of hbm_bandwidth"
            + ("" if e["fraction_raw"] <= 1 else ", capped at 1") + f", {at}"))),
    }


def _score_times(b: Build, a: dict, attn_what: str) -> dict:
    """``efficiency.attention_{fwd,bwd}_score_time`` where the run measured them (raw results of
    calibrations before memo did have no ``fwd_score_time``: nothing is written)."""
    out = {}
    for ph, word in (("fwd", "forward"), ("bwd", "backward")):
        if f"{ph}_score_time" not in a:
            continue
        n = len(a["score_fit"][ph])
        how = (f"measured: {word} of {attn_what}: t = FLOPs at the curve + score elements (b*s^2*heads/2) x this, "
               f"solved per (s, heads) from the smallest and largest head size, median of {n} case(s), at least 0 "
               f"and at most {SCORE_TIME_HEADROOM:g} of any case's time per element" if n else
               f"not separable: every (s, heads) was measured at one head size ({attn_what}); taken as 0")
        key = f"efficiency.attention_{ph}_score_time"
        out[f"attention_{ph}_score_time"] = b.measured(key, q_time(a[f"{ph}_score_time"], how))
    return out


def _ring_blocks(b: Build, rb: dict | None, peak_words: str, fit_words: str) -> dict:
    """``efficiency.attention_block_*``: ring CP's block kernel where the run measured it apart
    (`memo_exec.calibrate.attention.measure_ring_blocks`); nothing where the ring runs the
    whole-sequence kernel or the raw results predate it."""
    if not rb or not rb.get("measured"):
        return {}
    rows, grid = rb["rows"], b.r["grid"]
    hd = ", ".join(f"{h}x{d}" for h, d in grid["attn_heads_dims"])
    what = (f"ring CP's c x c attention blocks as memo_exec's ring runs them ({rb['reason']}): "
            f"memo_exec.block_attention.block_forward on strided chunk views + merge_ into the running output, "
            f"backward block_backward + the adds into dQ, dK, dV; kernel {rb['kernel']}, {b.r['dtype']}, batch 1, "
            f"c in {_fmt_list(sorted({r['c'] for r in rows}))}, heads x head_dim in {{{hd}}}, {b.at}")
    clip = f"; {rb['clipped']} point(s) above the peak clipped to 1" if rb["clipped"] else ""
    out = {}
    for ph, word, factor in (("fwd", "forward", ""), ("bwd", "backward", " x 2.5")):
        for causal, key in ((False, f"attention_block_{ph}"), (True, f"attention_block_causal_{ph}")):
            n = sum(1 for r in rows if r["causal"] == causal)
            out[key] = b.measured(f"efficiency.{key}", curve(rb[f"{'causal_' if causal else ''}{ph}_curve"], (
                f"measured: {word} of {n} {'causal diagonal' if causal else 'full'} blocks of {what}; FLOPs "
                f"{2 if causal else 4}*b*c^2*h{factor}; efficiency = FLOPs / (time - score elements x "
                f"attention_block_{ph}_score_time) / {peak_words}; {fit_words}{clip}")))
        g = len(rb["score_fit"][ph])
        how = (f"measured: {word} of the full blocks of {what}: t = FLOPs at the curve + score elements (b*c^2*heads) "
               f"x this, solved per (c, heads) from the smallest and largest head size, median of {g} case(s), at "
               f"least 0, at most {SCORE_TIME_HEADROOM:g} of any block's time per element and at most what leaves "
               f"every block's FLOPs at or below the peak" if g else
               f"not separable: every (c, heads) was measured at one head size ({what}); taken as 0")
        out[f"attention_block_{ph}_score_time"] = b.measured(f"efficiency.attention_block_{ph}_score_time",
                                                            q_time(rb[f"{ph}_score_time"], how))
    return out


def _attention_times(b: Build, a: dict) -> dict:
    """``efficiency.attention_times``: every attention case the run timed, the whole-sequence kernel's and
    (where measured apart) ring CP's blocks', as measured (`memo_sim.profile.schema.AttentionTimes`)."""
    rows = [FlowMap(kernel="whole", heads=r["heads"], head_dim=r["head_dim"], seq=r["seq"], fwd_s=sig(r["fwd_s"]),
                    bwd_s=sig(r["bwd_s"])) for r in a["rows"] + a.get("extra_rows", []) if r.get("batch", 1) == 1]
    rb = a.get("ring_blocks") or {}
    if rb.get("measured"):
        rows += [FlowMap(kernel="block_causal" if r["causal"] else "block_full", heads=r["heads"],
                         head_dim=r["head_dim"], seq=r["c"], fwd_s=sig(r["fwd_s"]), bwd_s=sig(r["bwd_s"]))
                 for r in rb["rows"] + rb.get("extra_rows", []) if r.get("batch", 1) == 1]
    if not rows:
        return {}
    shapes = ", ".join(f"{h}x{d}" for h, d in sorted({(r["heads"], r["head_dim"]) for r in rows}))
    block = f"; ring CP's blocks on {rb['kernel']} (seq = c)" if rb.get("measured") else ""
    src = (f"measured: each case's median seconds (batch 1, {b.r['dtype']}), the executor's attention backend "
           f"{a['backend']}{block}, heads x head_dim in {{{shapes}}}, {b.at}; memo_sim.cost.attention_measured prices a "
           f"layer at a measured shape from these rows, interpolated log-log in seq")
    return {"attention_times": b.measured("efficiency.attention_times", {"rows": rows, "source": src})}


def _call_latency(b: Build, e: dict) -> dict:
    """``efficiency.kernel_latency`` where the run measured the memory-bound ops at a small size too."""
    if "call_latency_s" not in e:
        return {}
    sm = e["small"]
    return {"kernel_latency": b.measured("efficiency.kernel_latency", q_time(e["call_latency_s"], (
        f"measured: the same memory-bound ops at T={sm['tokens']}, h={sm['hidden']}, f={sm['ffn']}: per op, its time "
        f"less its bytes at its own rate at T={e['tokens']}; mean over the ops weighted by their calls per layer, "
        f"at least 0, {b.at}")))}


def cpu_ranks(r: dict) -> int:
    """The executor ranks a CPU profile's machine runs (`memo_exec.calibrate.suite.cpu_ranks`; 1 in raw results
    written before 2026-11-28)."""
    return int(r["cpu_budget"].get("ranks", 1))


def _gpus_per_node(b: Build) -> FlowMap:
    if b.cuda and not b.node_from_base:
        return b.measured("node.gpus_per_node", q(b.r["env"]["visible_gpus"], "count",
                                                  f"measured: CUDA devices visible to torch {b.at}"))
    if b.cuda:
        return b.need_base("node.gpus_per_node").quantity("node.gpus_per_node", "--node-from-base")
    b.base_fields.append("node.gpus_per_node (CPU convention)")
    ranks = cpu_ranks(b.r)
    if ranks == 1:
        return q(1, "count", "CPU run: one executor device per process (memo convention, not measured)")
    return q(ranks, "count", f"CPU run: the {ranks} executor ranks (one process each) this machine runs, as many as "
                             f"the gloo processes its collectives were measured between (memo convention, not "
                             f"measured): a layout's TP group of up to {ranks} stays on this machine")


def _collective_fits(b: Build, coll: dict) -> dict:
    """A link's ``collectives`` section: each collective's own fit (`memo_exec.calibrate.collectives`)."""
    fits = coll.get("fits") or {}
    if not fits:
        return {}
    how = (" (each call between stretches of compute on every rank, the mean of the calls: as a CPU run issues "
           "it)" if coll["backend"] == "gloo" else "")
    src = (f"measured: {coll['backend']} {{}} over {coll['world']} processes{how}, sizes {coll['rows'][0]['bytes']}.."
           f"{coll['rows'][-1]['bytes']} bytes per rank; a line through the sizes from {FIT_FROM // 1024} KiB per rank on, "
           f"as the formula's bandwidth and per-step latency (memo_sim.cost.collectives.fit_params), {b.at}")
    return {"collectives": {k: {"bandwidth": q_bw(f["bandwidth"], src.format(k.replace("_", "-"))),
                                "latency": q_time(f["latency"], src.format(k.replace("_", "-")))}
                            for k, f in fits.items()}}


def link_sections(b: Build) -> tuple[dict, dict, dict]:
    """(``node``, ``nvlink``, ``internode``): measured collectives where they ran, else the base's."""
    gpn = _gpus_per_node(b)
    coll = b.r["collectives"]
    lk_src = ""
    if coll["measured"]:
        lk_src = (f"measured: {coll['backend']} send/recv ping-pong between rank 0 and 1 of {coll['world']} "
                  f"processes, sizes {coll['rows'][0]['bytes']}..{coll['rows'][-1]['bytes']} bytes; bandwidth from "
                  f"the large messages, latency from the small ones, {b.at}")
        if not b.cuda:
            lk_src += "; CPU: one machine, so the internode link is this same measurement"
        nvlink = b.measured("nvlink", {"bandwidth": q_bw(coll["bandwidth"], lk_src),
                                       "latency": q_time(coll["latency"], lk_src), **_collective_fits(b, coll)})
    else:
        base = b.need_base("nvlink")
        why = f"not measured ({coll['reason']})"
        nvlink = {"bandwidth": base.quantity("nvlink.bandwidth", why), "latency": base.quantity("nvlink.latency", why)}
    if coll["measured"] and not b.cuda:
        internode = b.measured("internode", {"bandwidth": q_bw(coll["bandwidth"], lk_src),
                                             "latency": q_time(coll["latency"], lk_src), **_collective_fits(b, coll)})
    else:
        base = b.need_base("internode")
        why = "not measured (one node: no inter-node link to measure)"
        internode = {"bandwidth": base.quantity("internode.bandwidth", why),
                     "latency": base.quantity("internode.latency", why)}
    return {"gpus_per_node": gpn}, nvlink, internode


def host_link_section(b: Build, n_gpus: int) -> dict:
    """``host_link``: copy bandwidths and latency measured; PCIe topology from the base (CUDA) or
    the CPU conventions."""
    fits, sweep, grid = b.r["copies"]["fit"], b.r["copies"]["sweep"], b.r["grid"]
    how = ("pinned host memory, copy_(non_blocking=True) on a side stream, CUDA events" if b.cuda
           else "CPU memcpy between plain tensors (what the CPU executor's copy threads do)")
    sizes = f"{sweep['d2h'][0]['bytes']}..{sweep['d2h'][-1]['bytes']} bytes"

    def link_src(d):
        return (f"measured: {d} copies of {sizes} ({how}); bandwidth fitted on the copies >= "
                f"{grid['copy_fit_from'] / MiB:.0f} MiB, {b.at}")

    lat = (fits["d2h"]["latency"] + fits["h2d"]["latency"]) / 2
    host_link = {
        "d2h_bandwidth": b.measured("host_link.d2h_bandwidth", q_bw(fits["d2h"]["bandwidth"], link_src("d2h"))),
        "h2d_bandwidth": b.measured("host_link.h2d_bandwidth", q_bw(fits["h2d"]["bandwidth"], link_src("h2d"))),
        "latency": b.measured("host_link.latency", q_time(lat, (
            f"measured: mean over d2h and h2d of (time - bytes / bandwidth) of the copies <= 64 KiB "
            f"(d2h {fits['d2h']['latency'] * 1e6:.1f} us, h2d {fits['h2d']['latency'] * 1e6:.1f} us), {b.at}"))),
    }
    if b.cuda:
        for fld in ("gpus_per_pcie_switch", "pcie_switch_bandwidth", "gpus_per_socket"):
            qv = b.need_base(f"host_link.{fld}").quantity(f"host_link.{fld}", "not measured (topology)")
            if fld.startswith("gpus_per") and int(qv["value"]) > n_gpus:
                qv = FlowMap(value=n_gpus, unit="count",
                             source=f"{qv['source']}; capped at gpus_per_node ({n_gpus}) of this machine")
            host_link[fld] = qv
        return host_link
    host_link["gpus_per_pcie_switch"] = q(1, "count", "CPU run: no PCIe; one device per 'switch' "
                                                      "(memo convention, not measured)")
    host_link["pcie_switch_bandwidth"] = b.measured("host_link.pcie_switch_bandwidth", q_bw(
        max(fits["d2h"]["bandwidth"], fits["h2d"]["bandwidth"]),
        f"CPU run: no PCIe switch; set to the faster measured single-copy rate so that it never binds beyond "
        f"a copy's own rate, {b.at}"))
    host_link["gpus_per_socket"] = q(1, "count", "CPU run: one executor device per process "
                                                 "(memo convention, not measured)")
    b.base_fields.extend(["host_link.gpus_per_pcie_switch (CPU convention)",
                          "host_link.gpus_per_socket (CPU convention)"])
    return host_link


def _host_memory(b: Build) -> tuple[FlowMap, FlowMap]:
    """(host.memory, host.usable_fraction)."""
    if b.node_from_base:
        base = b.need_base("host")
        return base.quantity("host.memory", "--node-from-base"), base.quantity("host.usable_fraction",
                                                                               "--node-from-base")
    hm, at = b.r["host_memory"], b.at
    host_mem = b.measured("host.memory", q_bytes(hm["total"], f"measured: MemTotal of /proc/meminfo "
                                                              f"({hm['total']} bytes) {at}"))
    if b.cuda:
        frac = hm["available"] / hm["total"]
        usable_src = (f"measured: MemAvailable / MemTotal of /proc/meminfo at calibration "
                      f"({hm['available']} / {hm['total']} bytes) {at}")
    else:
        budget, ranks = b.r["cpu_budget"]["bytes"], cpu_ranks(b.r)
        frac = (hm["available"] - ranks * budget) / hm["total"]
        less = f"{ranks} x {budget}" if ranks > 1 else f"{budget}"
        usable_src = (f"measured: (MemAvailable - the ranks' device budgets) / MemTotal at calibration "
                      f"(({hm['available']} - {less}) / {hm['total']} bytes): the CPU executor's device "
                      f"tensors live in the same RAM, {at}")
    if not 0 < frac <= 1:
        raise MemoError(f"usable host memory fraction {frac:.3f} is not in (0, 1]: lower --gpu-memory")
    return host_mem, b.measured("host.usable_fraction", q(frac, "ratio", usable_src))


def _pinned_rounding(b: Build) -> dict:
    pin = b.r["pinned"]
    if pin.get("measured"):
        pr = {"value": pin["mode"], "source": f"measured: {pin['method']}: {pin['detail']}, {b.at}"}
        if b.cuda:
            pr["source"] += ("; memo_exec's HostPool page-locks one buffer with cudaHostRegister, which takes "
                             "exactly the bytes asked for")
        b.measured_fields.append("host.pinned_rounding")
        return pr
    if b.cuda:
        return {"value": "power_of_two",
                "source": f"not measured ({pin['reason']}): PyTorch's CachingHostAllocator rounds pinned sizes up "
                          "to a power of two (documented behaviour)"}
    return {"value": "none", "source": f"not measured ({pin['reason']}): CPU host buffers are plain tensors from "
                                      "the system allocator, no pinned rounding (documented)"}


def host_section(b: Build) -> dict:
    """``host``: memory, usable fraction, memory bandwidth, pinned rounding."""
    host_mem, usable = _host_memory(b)
    dup = b.r["copies"]["duplex"]
    if b.cuda:
        mem_bw = b.need_base("host.memory_bandwidth").quantity(
            "host.memory_bandwidth", f"not measured (measured d2h + h2d at once: {dup['total'] / 1e9:.1f} GB/s)")
    else:
        mem_bw = b.measured("host.memory_bandwidth", q_bw(dup["total"], (
            f"measured: sum of a d2h and an h2d copy thread running at once ({dup['count']} x "
            f"{dup['bytes'] / MiB:.0f} MiB each: d2h {dup['d2h'] / 1e9:.2f} GB/s, h2d {dup['h2d'] / 1e9:.2f} GB/s), "
            f"bytes copied per second, {b.at}")))
    return {"memory": host_mem, "usable_fraction": usable, "memory_bandwidth": mem_bw,
            "pinned_rounding": _pinned_rounding(b)}


def description(b: Build) -> str:
    env, base = b.r["env"], b.base
    base_note = f"; from base profile {base.name}: {', '.join(sorted(set(f for f in b.base_fields if '(' not in f)))}" \
        if base is not None and any("(" not in f for f in b.base_fields) else ""
    text = (f"{env['device']}: calibrated by memo-exec calibrate on {env['hostname']} at {env['date']} "
            f"({'quick' if b.r['options']['quick'] else 'full'} run, torch {env['torch']}). Every field is "
            f"measured except where its source says otherwise{base_note}.")
    if not b.cuda:
        text += (" CPU profile: efficiencies are relative to the best measured fp32 GEMM; plans for it must "
                 "use dtype fp32.")
    return text


def measurements(r: dict) -> dict:
    """The raw numbers behind the fits, kept in ``provenance.measurements``."""
    fits, dup, cc, e = r["copies"]["fit"], r["copies"]["duplex"], r["copies"]["copy_compute"], r["elementwise"]
    coll = r["collectives"]
    summary = {
        "peak_measured_gemm_tflops": sig(r["peak"]["best_measured"] / 1e12),
        "attention_backend": r["attention"]["backend"],
        "ring_block_kernel": (r["attention"].get("ring_blocks") or {}).get("kernel", "not recorded"),
        "copy_fit": {d: {"bandwidth_gb_s": sig(f["bandwidth"] / 1e9), "latency_us": sig(f["latency"] * 1e6)}
                     for d, f in fits.items()},
        "duplex_gb_s": {k: sig(dup[k] / 1e9) for k in ("d2h", "h2d", "total")},
        "copy_compute": {m: {k: sig(v) for k, v in cc[m].items() if isinstance(v, float)}
                         for m in ("d2h", "h2d", "both")},
        "elementwise_gb_s": {k: sig(v["bytes_per_s"] / 1e9) for k, v in e["ops"].items()},
        "allocator": allocator_summary(r),
    }
    if coll["measured"]:
        summary["collectives"] = [{"bytes": row["bytes"], "sendrecv_us": sig(row["sendrecv_s"] * 1e6),
                                   "allreduce_busbw_gb_s": sig(row["allreduce_busbw_bytes_per_s"] / 1e9),
                                   **{k.replace("_s", "_us"): sig(row[k] * 1e6)
                                      for k in ("allgather_s", "reducescatter_s", "alltoall_s") if k in row},
                                   # gloo: the collectives above timed between kernels; back to back beside them
                                   **{k.replace("_s_", "_us_"): sig(row[k] * 1e6)
                                      for k in sorted(row) if k.endswith("_back_to_back")}}
                                  for row in coll["rows"]]
    else:
        summary["collectives"] = f"not measured: {coll['reason']}"
    return summary


def provenance(b: Build) -> dict:
    """``provenance``: how, where and when the profile was measured, and which fields were."""
    r, env = b.r, b.r["env"]
    prov = {"method": "calibrated", "tool": "memo-exec calibrate", "command": r["options"]["command"] or env["argv"],
            "date": env["date"], "hostname": env["hostname"], "device": env["device"],
            "device_kind": env["device_kind"]}
    for k in ("driver", "cuda_runtime", "cudnn", "compute_capability", "multiprocessors", "visible_gpus"):
        if k in env:
            prov[k] = env[k]
    prov.update({"torch": env["torch"], "python": env["python"], "platform": env["platform"], "cpu": env["cpu"],
                 "cpu_count": env["cpu_count"], "torch_threads": env["torch_threads"],
                 "load_average_1min": [env.get("load_average_1min"), env.get("load_average_1min_end")],
                 "cpu_share": env.get("cpu_share"), "speed_probe": env.get("speed_probe"),
                 "timing": (f"{TIMING_STATISTIC} of the repeats timed with CUDA events" if b.cuda else
                            f"{TIMING_STATISTIC} of the repeats timed with perf_counter (the runs' steps are "
                            "compared by their median too)"),
                 "dtype": r["dtype"], "quick": r["options"]["quick"], "duration_s": round(r["duration_s"], 1),
                 "base_profile": str(b.base.path) if b.base is not None else None,
                 "measured_fields": b.measured_fields, "not_measured_fields": b.base_fields,
                 "measurements": measurements(r)})
    if env.get("torch_threads_reason"):
        prov["torch_threads_reason"] = env["torch_threads_reason"]
    if env.get("cold_write"):  # CPU: the cold-cache write each repeat began with (`microbench.measure_cold_write`)
        prov["cold_write"] = env["cold_write"]
    if env.get("host_malloc"):  # CPU: the allocator policy the kernels were timed with (`memo_exec.host_malloc`)
        prov["host_malloc"] = env["host_malloc"]
    return prov


def build_profile(name: str, r: dict, base: BaseProfile | None, node_from_base: bool = False) -> dict:
    """The profile dict (schema memo-hardware-profile/1) from `suite.run_suite`'s results ``r``."""
    b = Build(r, base, node_from_base)
    gpu = gpu_section(b)
    eff = efficiency_section(b)
    node, nvlink, internode = link_sections(b)
    host_link = host_link_section(b, int(node["gpus_per_node"]["value"]))
    host = host_section(b)
    return {"schema": SCHEMA, "name": name, "description": description(b), "provenance": provenance(b),
            "gpu": gpu, "efficiency": eff, "node": node, "nvlink": nvlink, "internode": internode,
            "host_link": host_link, "host": host}


def write_profile(d: dict, path: str | Path) -> HardwareProfile:
    """Validate ``d`` with the simulator's own loader, then write it atomically as YAML."""
    path = Path(path)
    text = dump_yaml(d)
    prof = parse_profile(plain(load_yaml(text)), str(path))  # what a later load will read
    atomic_write_text(path, text)
    return prof
