"""Build the hardware-profile YAML from a calibration run, validate it, write it atomically.

Every number carries its source: ``measured: ...`` (what was run, on which device, when),
``from base profile X, not measured: <X's own source>`` for what this machine cannot show
(inter-node links, NVLink on a one-GPU box, PCIe switch topology, a GPU host's memory
bandwidth), or, on CPU, a documented convention (one device per node, no PCIe). The result must
pass `memo_sim.profile.loader.parse_profile` before anything is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from memo_exec.calibrate.allocator import profile_fields as allocator_fields
from memo_exec.calibrate.allocator import summary as allocator_summary
from memo_sim.errors import MemoError
from memo_sim.fileio import atomic_write_text
from memo_sim.profile.loader import SCHEMA, list_profiles, load_profile, parse_profile
from memo_sim.profile.schema import HardwareProfile

GiB, MiB = 2**30, 2**20


class FlowMap(dict):
    """Dumped on one line: ``{value: 3.35, unit: TB/s, source: ...}``."""


class FlowList(list):
    """Dumped on one line: ``[1.0e+9, 0.35]``."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(FlowMap, lambda d, m: d.represent_mapping("tag:yaml.org,2002:map", m.items(), flow_style=True))
_Dumper.add_representer(FlowList, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def dump_yaml(d: dict) -> str:
    return yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def sig(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant digits (as a plain float)."""
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(f"{x:.{digits - 1}e}")


def q(value: float, unit: str, source: str) -> FlowMap:
    v = int(value) if unit == "count" else sig(value)
    return FlowMap(value=v, unit=unit, source=source)


def q_bytes(n: float, source: str) -> FlowMap:
    return q(n / GiB, "GiB", source) if n >= GiB else q(n / MiB, "MiB", source)


def q_bw(bps: float, source: str) -> FlowMap:
    return q(bps / 1e9, "GB/s", source)


def q_time(s: float, source: str) -> FlowMap:
    return q(s * 1e6, "us", source)


def curve(points: list[list[float]], source: str) -> dict:
    return {"x": "FLOP", "points": [FlowList([sig(f), round(e, 4)]) for f, e in points], "source": source}


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
    raw = yaml.safe_load(Path(path).read_text())
    return BaseProfile(prof.name, Path(path), raw, prof)


def _fmt_list(xs) -> str:
    return "{" + ", ".join(str(x) for x in xs) + "}"


def build_profile(name: str, r: dict, base: BaseProfile | None, node_from_base: bool = False) -> dict:
    """The profile dict (schema memo-hardware-profile/1) from `suite.run_suite`'s results ``r``."""
    env, grid, cuda = r["env"], r["grid"], r["env"]["device_kind"] == "cuda"
    dev, date = env["device"], env["date"]
    at = f"on {dev}, {date}"
    measured_fields: list[str] = []
    base_fields: list[str] = []

    def need_base(field: str) -> BaseProfile:
        if base is None:
            raise MemoError(f"{field} cannot be measured on this machine and no --base profile was given")
        base_fields.append(field)
        return base

    def measured(field: str, v):
        measured_fields.append(field)
        return v

    # ---------------------------------------------------------------- gpu
    pk = r["peak"]
    if cuda:
        m0, m1 = r["memory_start"], r["memory_end"]
        gpu_mem = measured("gpu.memory", q_bytes(m1["total"], f"measured: torch.cuda.mem_get_info total "
                                                               f"({m1['total']} bytes) {at}"))
        outside = max(m0["outside_torch"], m1["outside_torch"])
        reserved = measured("gpu.reserved", q_bytes(
            outside, f"measured: device memory in use outside PyTorch's caching allocator (CUDA context, "
                     f"cuBLAS/cuDNN handles) after the kernels ran, {outside} bytes {at}; NCCL buffers not included"))
        peaks = {"bf16": q(pk["value"] / 1e12, "TFLOP/s", f"{pk['source']}; not measured (best measured bf16 "
                                                              f"GEMM: {pk['best_measured'] / 1e12:.1f} TFLOP/s)")}
        if "fp32" in pk["datasheet"]:
            peaks["fp16"] = q(pk["value"] / 1e12, "TFLOP/s", f"{pk['source']} (dense fp16 = dense bf16); "
                                                              "efficiency curves were measured in bf16")
            peaks["fp32"] = q(pk["datasheet"]["fp32"] / 1e12, "TFLOP/s",
                              f"{pk['source']}; efficiency curves were measured in bf16 and do not apply to fp32")
    else:
        budget = r["cpu_budget"]
        gpu_mem = q_bytes(budget["bytes"], "CPU run: the executor's device memory is host RAM; this is the budget "
                          "it may use" + (f", default min(8 GiB, half of the host's "
                                          f"{r['host_memory']['total'] / GiB:.1f} GiB)" if budget["default"]
                                          else " (--gpu-memory)"))
        base_fields.append("gpu.memory (CPU budget)")
        reserved = measured("gpu.reserved", q_bytes(
            r["framework_rss"], f"measured: resident set of the calibrating process after importing torch, before "
                                f"the benchmarks ({r['framework_rss']} bytes) {at}"))
        peaks = {"fp32": measured("gpu.peak_flops.fp32", q(pk["value"] / 1e9, "GFLOP/s", f"{pk['source']}, {at}"))}
    if float(reserved["value"]) * (GiB if reserved["unit"] == "GiB" else MiB) >= \
            float(gpu_mem["value"]) * (GiB if gpu_mem["unit"] == "GiB" else MiB):
        raise MemoError(f"measured reserved memory ({reserved['value']} {reserved['unit']}) is not below the device "
                        f"memory ({gpu_mem['value']} {gpu_mem['unit']}); raise --gpu-memory")
    hbm = r["hbm"]
    hbm_q = measured("gpu.hbm_bandwidth", q_bw(hbm["bandwidth"], (
        f"measured: the faster of a {hbm['bytes'] / MiB:.0f} MiB device copy ({hbm['copy_bytes_per_s'] / 1e9:.1f} "
        f"GB/s) and add ({hbm['add_bytes_per_s'] / 1e9:.1f} GB/s), bytes read + written per second, {at}")))
    cc = r["copies"]["copy_compute"]
    slow = r["copies"]["compute_slowdown"]
    slow_src = (f"measured: a {cc['gemm_n']}^3 {r['dtype']} GEMM loop ({cc['compute_alone_s'] * 1e3:.0f} ms alone) "
                f"slows by {cc['d2h']['compute_slowdown'] * 100:+.1f}% while d2h copies run and "
                f"{cc['h2d']['compute_slowdown'] * 100:+.1f}% while h2d copies run "
                f"({cc['both']['compute_slowdown'] * 100:+.1f}% with both); mean of the two single-direction values"
                + ("" if 0 <= slow <= 1 else ", clamped to [0, 1]") + f", {at}")
    slow_q = measured("gpu.copy_compute_slowdown", q(min(1.0, max(0.0, slow)), "ratio", slow_src))
    gpu = {"model": dev, "memory": gpu_mem, "reserved": reserved, "peak_flops": peaks, "hbm_bandwidth": hbm_q,
           "copy_compute_slowdown": slow_q}
    alloc, alloc_measured, alloc_not_measured = allocator_fields(r, at, base)
    if alloc is not None:  # absent: the simulator's assumed defaults (CPU, or nothing measured or in the base)
        gpu["allocator"] = alloc
    measured_fields += alloc_measured
    base_fields += alloc_not_measured

    # ---------------------------------------------------------------- efficiency
    g = r["gemm"]
    forms = sorted({row["form"] for row in g["rows"]})
    peak_words = (f"peak {pk['value'] / 1e12:.1f} TFLOP/s ({pk['source']})" if cuda
                  else f"the best measured fp32 GEMM, {pk['value'] / 1e9:.1f} GFLOP/s")
    fit_words = "binned per half decade of FLOPs, median per bin, isotonic (non-decreasing) fit"
    gemm_src = (f"measured: {len(g['rows'])} {r['dtype']} GEMMs ({'/'.join(forms)} forms of the GPT layer's QKV, "
                f"out-proj, FC1, FC2 for h in {_fmt_list(grid['gemm_hiddens'])}, TP in {_fmt_list(grid['gemm_tps'])}, "
                f"T in {_fmt_list(grid['gemm_tokens'])}) {at}; efficiency = achieved / {peak_words}; {fit_words}"
                + (f"; {g['clipped']} point(s) above the peak clipped to 1" if g["clipped"] else ""))
    a = r["attention"]
    hd = ", ".join(f"{h}x{d}" for h, d in grid["attn_heads_dims"])
    attn_what = (f"{len(a['rows'])} causal attention problems (backend {a['backend']}, {r['dtype']}, batch 1, "
                 f"s in {_fmt_list(grid['attn_seqs'])}, heads x head_dim in {{{hd}}}) {at}")
    clip_a = f"; {a['clipped']} point(s) above the peak clipped to 1" if a["clipped"] else ""
    e = r["elementwise"]
    ops = ", ".join(f"{k} {v['bytes_per_s'] / 1e9:.1f} GB/s" for k, v in e["ops"].items())
    eff = {
        "gemm": measured("efficiency.gemm", curve(g["curve"], gemm_src)),
        "attention_fwd": measured("efficiency.attention_fwd", curve(a["fwd_curve"], (
            f"measured: forward of {attn_what}; FLOPs 2*b*s^2*h (causal); efficiency = achieved / {peak_words}; "
            f"{fit_words}{clip_a}"))),
        "attention_bwd": measured("efficiency.attention_bwd", curve(a["bwd_curve"], (
            f"measured: backward of {attn_what}; FLOPs 2.5x the forward's; efficiency = achieved / {peak_words}; "
            f"{fit_words}{clip_a}"))),
        "elementwise": measured("efficiency.elementwise", q(e["fraction"], "ratio", (
            f"measured: one layer's layer-norm, residual-add and GELU forward and backward as memo_exec runs them "
            f"(T={e['tokens']}, h={e['hidden']}, f={e['ffn']}, {r['dtype']}; {ops}), bytes counted as the simulator "
            f"counts them: {e['layer_bytes_per_s'] / 1e9:.1f} GB/s = {e['fraction_raw']:.3f} of hbm_bandwidth"
            + ("" if e["fraction_raw"] <= 1 else ", capped at 1") + f", {at}"))),
    }

    # ---------------------------------------------------------------- node, links
    coll = r["collectives"]
    if cuda and not node_from_base:
        gpn = measured("node.gpus_per_node", q(env["visible_gpus"], "count",
                                               f"measured: CUDA devices visible to torch {at}"))
    elif cuda:
        gpn = need_base("node.gpus_per_node").quantity("node.gpus_per_node", "--node-from-base")
    else:
        gpn = q(1, "count", "CPU run: one executor device per process (memo convention, not measured)")
        base_fields.append("node.gpus_per_node (CPU convention)")
    n_gpus = int(gpn["value"])

    if coll["measured"]:
        lk_src = (f"measured: {coll['backend']} send/recv ping-pong between rank 0 and 1 of {coll['world']} "
                  f"processes, sizes {coll['rows'][0]['bytes']}..{coll['rows'][-1]['bytes']} bytes; bandwidth from "
                  f"the large messages, latency from the small ones, {at}")
        if not cuda:
            lk_src += "; CPU: with gpus_per_node 1 the simulator routes every group over internode"
        nvlink = measured("nvlink", {"bandwidth": q_bw(coll["bandwidth"], lk_src),
                                     "latency": q_time(coll["latency"], lk_src)})
    else:
        b = need_base("nvlink")
        why = f"not measured ({coll['reason']})"
        nvlink = {"bandwidth": b.quantity("nvlink.bandwidth", why), "latency": b.quantity("nvlink.latency", why)}
    if coll["measured"] and not cuda:
        internode = measured("internode", {"bandwidth": q_bw(coll["bandwidth"], lk_src),
                                           "latency": q_time(coll["latency"], lk_src)})
    else:
        b = need_base("internode")
        why = "not measured (one node: no inter-node link to measure)"
        internode = {"bandwidth": b.quantity("internode.bandwidth", why),
                     "latency": b.quantity("internode.latency", why)}

    fits, sweep = r["copies"]["fit"], r["copies"]["sweep"]
    how = ("pinned host memory, copy_(non_blocking=True) on a side stream, CUDA events" if cuda
           else "CPU memcpy between plain tensors (what the CPU executor's copy threads do)")
    sizes = f"{sweep['d2h'][0]['bytes']}..{sweep['d2h'][-1]['bytes']} bytes"

    fit_from = grid["copy_fit_from"]

    def link_src(d):
        return (f"measured: {d} copies of {sizes} ({how}); bandwidth fitted on the copies >= "
                f"{fit_from / MiB:.0f} MiB, {at}")

    lat = (fits["d2h"]["latency"] + fits["h2d"]["latency"]) / 2
    host_link = {
        "d2h_bandwidth": measured("host_link.d2h_bandwidth", q_bw(fits["d2h"]["bandwidth"], link_src("d2h"))),
        "h2d_bandwidth": measured("host_link.h2d_bandwidth", q_bw(fits["h2d"]["bandwidth"], link_src("h2d"))),
        "latency": measured("host_link.latency", q_time(lat, (
            f"measured: mean over d2h and h2d of (time - bytes / bandwidth) of the copies <= 64 KiB "
            f"(d2h {fits['d2h']['latency'] * 1e6:.1f} us, h2d {fits['h2d']['latency'] * 1e6:.1f} us), {at}"))),
    }
    dup = r["copies"]["duplex"]
    if cuda:
        for fld in ("gpus_per_pcie_switch", "pcie_switch_bandwidth", "gpus_per_socket"):
            qv = need_base(f"host_link.{fld}").quantity(f"host_link.{fld}", "not measured (topology)")
            if fld.startswith("gpus_per") and int(qv["value"]) > n_gpus:
                qv = FlowMap(value=n_gpus, unit="count",
                             source=f"{qv['source']}; capped at gpus_per_node ({n_gpus}) of this machine")
            host_link[fld] = qv
    else:
        host_link["gpus_per_pcie_switch"] = q(1, "count", "CPU run: no PCIe; one device per 'switch' "
                                                          "(memo convention, not measured)")
        host_link["pcie_switch_bandwidth"] = measured("host_link.pcie_switch_bandwidth", q_bw(
            max(fits["d2h"]["bandwidth"], fits["h2d"]["bandwidth"]),
            f"CPU run: no PCIe switch; set to the faster measured single-copy rate so that it never binds beyond "
            f"a copy's own rate, {at}"))
        host_link["gpus_per_socket"] = q(1, "count", "CPU run: one executor device per process "
                                                     "(memo convention, not measured)")
        base_fields.extend(["host_link.gpus_per_pcie_switch (CPU convention)",
                            "host_link.gpus_per_socket (CPU convention)"])

    # ---------------------------------------------------------------- host
    hm = r["host_memory"]
    if node_from_base:
        b = need_base("host")
        host_mem = b.quantity("host.memory", "--node-from-base")
        usable = b.quantity("host.usable_fraction", "--node-from-base")
    else:
        host_mem = measured("host.memory", q_bytes(hm["total"], f"measured: MemTotal of /proc/meminfo "
                                                                f"({hm['total']} bytes) {at}"))
        if cuda:
            frac = hm["available"] / hm["total"]
            usable_src = (f"measured: MemAvailable / MemTotal of /proc/meminfo at calibration "
                          f"({hm['available']} / {hm['total']} bytes) {at}")
        else:
            budget = r["cpu_budget"]["bytes"]
            frac = (hm["available"] - budget) / hm["total"]
            usable_src = (f"measured: (MemAvailable - the device budget) / MemTotal at calibration "
                          f"(({hm['available']} - {budget}) / {hm['total']} bytes): the CPU executor's device "
                          f"tensors live in the same RAM, {at}")
        if not 0 < frac <= 1:
            raise MemoError(f"usable host memory fraction {frac:.3f} is not in (0, 1]: lower --gpu-memory")
        usable = measured("host.usable_fraction", q(frac, "ratio", usable_src))
    if cuda:
        mem_bw = need_base("host.memory_bandwidth").quantity(
            "host.memory_bandwidth", f"not measured (measured d2h + h2d at once: {dup['total'] / 1e9:.1f} GB/s)")
    else:
        mem_bw = measured("host.memory_bandwidth", q_bw(dup["total"], (
            f"measured: sum of a d2h and an h2d copy thread running at once ({dup['count']} x "
            f"{dup['bytes'] / MiB:.0f} MiB each: d2h {dup['d2h'] / 1e9:.2f} GB/s, h2d {dup['h2d'] / 1e9:.2f} GB/s), "
            f"bytes copied per second, {at}")))
    pin = r["pinned"]
    if pin.get("measured"):
        pr = {"value": pin["mode"], "source": f"measured: {pin['method']}: {pin['detail']}, {at}"}
        if cuda:
            pr["source"] += ("; memo_exec's HostPool page-locks one buffer with cudaHostRegister, which takes "
                             "exactly the bytes asked for")
        measured_fields.append("host.pinned_rounding")
    elif cuda:
        pr = {"value": "power_of_two",
              "source": f"not measured ({pin['reason']}): PyTorch's CachingHostAllocator rounds pinned sizes up to "
                        "a power of two (documented behaviour)"}
    else:
        pr = {"value": "none", "source": f"not measured ({pin['reason']}): CPU host buffers are plain tensors from "
                                         "the system allocator, no pinned rounding (documented)"}
    host = {"memory": host_mem, "usable_fraction": usable, "memory_bandwidth": mem_bw, "pinned_rounding": pr}

    # ---------------------------------------------------------------- assemble
    base_note = f"; from base profile {base.name}: {', '.join(sorted(set(f for f in base_fields if '(' not in f)))}" \
        if base is not None and any("(" not in f for f in base_fields) else ""
    description = (f"{dev}: calibrated by memo-exec calibrate on {env['hostname']} at {date} "
                   f"({'quick' if r['options']['quick'] else 'full'} run, torch {env['torch']}). Every field is "
                   f"measured except where its source says otherwise{base_note}.")
    if not cuda:
        description += (" CPU profile: efficiencies are relative to the best measured fp32 GEMM; plans for it must "
                        "use dtype fp32.")
    summary = {
        "peak_measured_gemm_tflops": sig(pk["best_measured"] / 1e12),
        "attention_backend": a["backend"],
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
                                   "allreduce_busbw_gb_s": sig(row["allreduce_busbw_bytes_per_s"] / 1e9)}
                                  for row in coll["rows"]]
    else:
        summary["collectives"] = f"not measured: {coll['reason']}"
    prov = {
        "method": "calibrated",
        "tool": "memo-exec calibrate",
        "command": r["options"]["command"] or env["argv"],
        "date": date,
        "hostname": env["hostname"],
        "device": dev,
        "device_kind": env["device_kind"],
    }
    for k in ("driver", "cuda_runtime", "cudnn", "compute_capability", "multiprocessors", "visible_gpus"):
        if k in env:
            prov[k] = env[k]
    prov.update({"torch": env["torch"], "python": env["python"], "platform": env["platform"], "cpu": env["cpu"],
                 "cpu_count": env["cpu_count"], "torch_threads": env["torch_threads"],
                 "load_average_1min": [env.get("load_average_1min"), env.get("load_average_1min_end")],
                 "timing": ("median of repeats timed with CUDA events" if cuda else
                            "fastest of the repeats timed with perf_counter (the CPU is shared)"),
                 "dtype": r["dtype"], "quick": r["options"]["quick"], "duration_s": round(r["duration_s"], 1),
                 "base_profile": str(base.path) if base is not None else None,
                 "measured_fields": measured_fields, "not_measured_fields": base_fields,
                 "measurements": summary})
    return {
        "schema": SCHEMA,
        "name": name,
        "description": description,
        "provenance": prov,
        "gpu": gpu,
        "efficiency": eff,
        "node": {"gpus_per_node": gpn},
        "nvlink": nvlink,
        "internode": internode,
        "host_link": host_link,
        "host": host,
    }


def _plain(obj: Any) -> Any:
    """FlowMap/FlowList -> dict/list (for validation with the loader, which expects plain types)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


def write_profile(d: dict, path: str | Path) -> HardwareProfile:
    """Validate ``d`` with the simulator's own loader, then write it atomically as YAML."""
    path = Path(path)
    text = dump_yaml(d)
    prof = parse_profile(_plain(yaml.safe_load(text)), str(path))  # what a later load will read
    atomic_write_text(path, text)
    return prof
