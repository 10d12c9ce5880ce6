"""What a quantised GEMM format (`memo_sim.model.gemm_formats`) costs beside its GEMMs, written once:
the casts' HBM bytes and time, the quantised weight copies kept in memory and their re-cast after
each optimizer step, and the check that the profile's GPU has the tensor cores for it.

The GEMMs themselves (`layer_gemm_time`) run at the profile's peak for the format
(``peak_flops.fp8``, ``.mxfp8``, ``.fp4``) times the format's own efficiency curve where the profile measured
one (``efficiency.gemm_formats``: the Hopper profiles' fp8_tensorwise curve, torch._scaled_mm timed
on an H200, `benchmarks/gpu/hopper_curves.py`), else the model dtype's GEMM curve, the same
fractions of peak as the dtype's GEMMs of the same FLOPs: an assumption the profile's sensitivity
line covers; a format that runs another's tensor-core work and more (``no_faster_than``: blockwise FP8
after tensorwise) no faster than that one's measured curve. Layer GEMMs only: the attention
core, the classifier and the embedding stay in the model dtype.
"""

from __future__ import annotations

import difflib
from dataclasses import replace

from memo_sim.cost.kernel_time import gemm_bytes, gemm_time, memory_bound_op_time
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.model.gemm_formats import GEMM_FORMATS
from memo_sim.model.layer_graph import DTYPE_BYTES
from memo_sim.profile.schema import HardwareProfile


def check_profile_gemm_formats(profile: HardwareProfile) -> None:
    """A one-line `MemoError` when a profile's ``efficiency.gemm_formats`` names no quantised GEMM format
    (the profile loader cannot know the formats: they are registered downstream of it)."""
    known = [f for f in GEMM_FORMATS if f != "bf16"]
    for name, _curve in profile.efficiency.gemm_formats:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            meant = f"did you mean {near[0]!r}? " if near else ""
            raise MemoError(f"profile {profile.path or profile.name}: efficiency.gemm_formats.{name}: no such GEMM "
                            f"format; {meant}fix: name one of {', '.join(known)}")


def format_given(model: ModelConfig) -> tuple[str, str]:
    """Where the model's GEMM format was given, for a refusal: (the words naming it, the words of the fix that
    changes it): a model file's ``gemm_format`` field (``ModelConfig.gemm_format_from``; a review: a file's format
    was refused as "--precision", a flag not given), else the --precision flag."""
    fmt = model.gemm_format
    if model.gemm_format_from:
        return (f"{model.gemm_format_from} {fmt}",
                f"set {model.gemm_format_from.rsplit(': ', 1)[-1]} in the model file to a format the GPU runs (or "
                f"give --precision bf16)")
    return f"--precision {fmt}", f"drop --precision {fmt}"


def check_gemm_format(model: ModelConfig, profile: HardwareProfile) -> None:
    """A one-line `MemoError` when the profile's GPU has no peak for the model's GEMM format, when its stated compute
    capability is outside the format's (`_check_capability`), or when its profile names a GEMM format that does not
    exist (`check_profile_gemm_formats`). The line names where the format was given (`format_given`)."""
    check_profile_gemm_formats(profile)
    fmt = model.gemm
    if fmt.quantised and fmt.peak not in profile.gpu.peak_flops:
        import difflib  # noqa: PLC0415

        from memo_sim.model.gemm_formats import gemm_format  # noqa: PLC0415

        known = set(DTYPE_BYTES) | {gemm_format(n).peak for n in GEMM_FORMATS}  # keys something reads
        near = difflib.get_close_matches(fmt.peak, [k for k in profile.gpu.peak_flops if k not in known], n=1,
                                         cutoff=0.5)
        typo = f"; its gpu.peak_flops.{near[0]} is read as no format's: rename it {fmt.peak}" if near else ""
        where, fix = format_given(model)
        raise MemoError(f"{where}: profile {profile.name} ({profile.gpu.model}) has no {fmt.peak} peak "
                        f"(needs {fmt.needs}){typo}; fix: {fix} or use a profile that lists "
                        f"gpu.peak_flops.{fmt.peak}")
    _check_capability(model, profile)


# the least compute capability whose tensor cores run each quantised format, as TransformerEngine checks it
# (transformer_engine/pytorch/quantization.py at d0067d0d: _compute_fp8_support line 149, 8.9 on Ada and Hopper;
# _compute_fp8_block_scaling_support line 178, 9.0; _compute_mxfp8_support line 162 and _compute_nvfp4_support line
# 171, 'Device compute capability 10.0 or higher required'); torchtitan's NVFP4 and MXFP8 converters refuse below
# SM100 too (torchtitan/components/quantization/nvfp4.py line 291)
MIN_CAPABILITY = {"fp8-tensorwise": (8, 9), "fp8-rowwise": (8, 9), "fp8-blockwise": (9, 0), "mxfp8": (10, 0),
                  "nvfp4": (10, 0)}
# the first compute capability on which TransformerEngine refuses a format it runs below it, by its own check: the
# same file's _compute_mxfp8_support returns "MXFP8 (for all gemm layouts) is not supported on 12.0+ architectures
# yet." for capability >= 12.0 (consumer Blackwell, RTX 50 / RTX PRO, GB10), before its 10.0 test. Only
# TransformerEngine says so (Megatron-LM's --fp8-recipe mxfp8 is its MXFP8BlockScaling): torchtitan's MX converter
# (torchao; torchtitan/components/quantization/mx.py) checks has_cuda_capability(10, 0), a lower bound alone. A model
# runs TransformerEngine's FP8 where its framework keeps the GEMM inputs' quantised copies (``fp8_saved_inputs``, as
# `for_profile` reads it)
TE_BELOW_CAPABILITY = {"mxfp8": (12, 0)}


def _check_capability(model: ModelConfig, profile: HardwareProfile) -> None:
    """A one-line `MemoError` where the profile states a compute capability below the format's (`MIN_CAPABILITY`):
    a Hopper profile with an mxfp8 or fp4 peak added does not run MXFP8 or NVFP4 GEMMs; or, under TransformerEngine
    (``fp8_saved_inputs``), at or above the capability its support check refuses the format on
    (`TE_BELOW_CAPABILITY`)."""
    fmt = model.gemm_format
    cc, need = profile.gpu.compute_capability, MIN_CAPABILITY.get(fmt)
    top = TE_BELOW_CAPABILITY.get(fmt) if runs_transformer_engine(model) else None
    if cc is None or ((need is None or cc >= need) and (top is None or cc < top)):
        return
    where, fix = format_given(model)
    if need is not None and cc < need:
        why = f"{fmt} GEMMs need compute capability {need[0]}.{need[1]} or higher (TransformerEngine's support checks)"
    else:
        why = (f"TransformerEngine runs no {fmt} GEMMs on compute capability {top[0]}.{top[1]} or higher (its "
               f"support check: not supported on {top[0]}.{top[1]}+ architectures yet)")
    raise MemoError(f"{where}: profile {profile.name} ({profile.gpu.model}) states gpu.compute_capability "
                    f"{cc[0]}.{cc[1]}; {why}; fix: {fix} or use a profile of such a GPU")


def gemm_peak_key(model: ModelConfig) -> str:
    """The profile peak the layer GEMMs run at: the format's, else the model dtype's."""
    return model.gemm.peak or model.dtype


def layer_gemm_time(model: ModelConfig, profile: HardwareProfile, m: float, k: float, n: float) -> float:
    """One layer GEMM out[m, n] = x[m, k] W[k, n] in the model's GEMM format: at the format's peak and
    its own efficiency curve where the profile has one (module docs), its HBM bytes as the floor."""
    fmt = model.gemm
    flops, peak, nbytes = 2.0 * m * k * n, gemm_peak_key(model), layer_gemm_bytes(model, m, k, n)
    t = gemm_time(flops, profile, peak, nbytes, fmt.name if fmt.quantised else None)
    measured = dict(profile.efficiency.gemm_formats)
    if fmt.no_faster_than and fmt.name not in measured and fmt.no_faster_than in measured:
        t = max(t, gemm_time(flops, profile, peak, nbytes, fmt.no_faster_than))
    return t


def layer_gemm_bytes(model: ModelConfig, m: float, k: float, n: float) -> float:
    """HBM bytes of one layer GEMM kernel out[m, n] = x[m, k] W[k, n]: quantised operands in the
    format's element size, the output in the model dtype."""
    fmt, d = model.gemm, DTYPE_BYTES[model.dtype]
    if not fmt.quantised:
        return gemm_bytes(m, n, k, d)
    return (m * k + k * n) * fmt.element_bytes + m * n * d


def cast_seconds(model: ModelConfig, profile: HardwareProfile, elements: float, amax_fused: bool = False,
                 weight: bool = False) -> float:
    """One activation or gradient cast of ``elements`` elements (0 when the format is not quantised);
    ``amax_fused``: the kernel that wrote the tensor already took its amax (a compiled block,
    `memo_sim.model.kernel_fusion`), so the cast reads it once; ``weight``: a weight's (its scale blocks)."""
    fmt = model.gemm
    if not fmt.quantised:
        return 0.0
    nbytes = fmt.cast_bytes(elements, DTYPE_BYTES[model.dtype], weight=weight)
    if amax_fused and fmt.amax_pass:
        nbytes -= elements * DTYPE_BYTES[model.dtype]
    return memory_bound_op_time(nbytes, profile)


def linear_params_on_gpu(model: ModelConfig, layout: Layout, layers: float, owned: bool = False,
                         experts_only: bool = False) -> float:
    """Linear weights of ``layers`` layers one GPU holds: the dense ones split by TP, a MoE layer's routed
    experts by EP x ETP; ``owned``: its ZeRO-3 shard only (the dense part over the data group, the experts
    over the expert data-parallel ranks); ``experts_only``: the routed experts' alone."""
    expert = model.expert_linear_params()
    dense = 0.0 if experts_only else (model.linear_params() - expert) / layout.tp
    routed = expert / (layout.ep * layout.etp)
    if owned:
        dense /= layout.dp_flavour.shard_group(layout)
        routed /= layout.expert_dp
    return layers * (dense + routed)


def gemm_cast_seconds(model: ModelConfig, profile: HardwareProfile, phase: str, m: float, k: float, n: float,
                      amax_in: bool = False, amax_out: bool = False, input_kept: bool = False,
                      groups: int = 1, weight_cast: bool = True, input_shards: int = 1,
                      dout_shards: int = 1) -> float:
    """The casts around one quantised GEMM out[m, n] = x[m, k] W[k, n] (0 when the format is not quantised):
    forward (and recompute) its input; backward its output gradient and, unless its quantised copy was kept
    (``input_kept``: TransformerEngine's ``fp8_saved_inputs``), the input again for the weight gradient (memo keeps
    the high-precision input, as torchao's Float8Linear does); and the weight where it is cast at every use
    (`weight_use_cast_seconds`). ``amax_in`` / ``amax_out``: a compiled block took the tensor's amax already.
    ``groups``: a grouped GEMM of that many such GEMMs (a rank's local experts), each cast one kernel over them all
    (the permuted tokens in one buffer, the experts' weights as one multi-tensor cast). ``weight_cast`` False: the
    weight's per-use cast left out, for a GEMM priced as token chunks whose weight is cast once beside them
    (`memo_sim.cost.layer_time`'s async TP pairs). ``input_shards`` / ``dout_shards``: the forward input's / the
    backward output gradient's cast runs on one of that many sequence shards, before the all-gather that carries
    the quantised copy (torchao's Float8 TP styles, ``fp8_sp_gathers``: `fp8_gather_shards`)."""
    g = groups
    if phase != "bwd":
        t = cast_seconds(model, profile, g * m * k / input_shards, amax_in)
    else:
        t = cast_seconds(model, profile, g * m * n / dout_shards, amax_out) + (
            0.0 if input_kept else cast_seconds(model, profile, g * m * k))
    return t + (weight_use_cast_seconds(model, profile, g * k * n, phase) if weight_cast else 0.0)


def fp8_gather_shards(model: ModelConfig, layout: Layout, row_parallel: bool, phase: str) -> int:
    """The sequence shards a tensor-parallel GEMM's quantised operand is cast on where the framework casts it before
    sequence parallelism's all-gather and gathers the quantised copy (``ModelConfig.fp8_sp_gathers``: torchao's
    Float8ColwiseParallel / PrepareFloat8ModuleInput cast a column-parallel GEMM's input before the forward's
    all-gather; Float8RowwiseParallel's ``NoopFwToFloat8BwDynamic`` casts a row-parallel GEMM's output gradient to
    e5m2 before the backward's all-gather, and the linear's backward takes it as cast): ``layout.tp``, else 1 (the
    cast on the gathered tensor). The all-gathers' bytes: `memo_sim.cost.layer_time`'s TP collectives."""
    if not (model.fp8_sp_gathers and model.gemm.quantised and layout.sp and layout.tp > 1):
        return 1
    return layout.tp if row_parallel == (phase == "bwd") else 1


def gemm_cast_buffers(model: ModelConfig, phase: str, m: float, k: float, n: float, input_kept: bool = False,
                      groups: int = 1) -> list[tuple[str, float]]:
    """The casts' outputs around one quantised GEMM out[m, n] = x[m, k] W[k, n] on one GPU, (what, bytes), live
    while the GEMM (backward: both its GEMMs) runs, beside the high-precision tensors they were cast from: the
    memory side of `gemm_cast_seconds`, the same casts, each at its format's `GemmFormat.cast_output_bytes`
    ([] when the format is not quantised). Forward (and recompute): the input's copies ("input"); where the framework
    keeps one of them for the weight gradient (``input_kept``: TransformerEngine drops the row-wise copy after the
    GEMM and keeps the column-wise one) that one is a saved tensor of the layer graph
    (`memo_sim.model.layer_graph.FP8_SAVED_INPUTS`), so the rest only. Backward: the output gradient's ("dout")
    and, unless kept, the input's again ("input"). Where the framework casts the weight at every use
    (``fp8_weights_per_use``) its copies too ("weight"). ``groups``: a grouped GEMM over that many
    (`gemm_cast_seconds`)."""
    fmt, g = model.gemm, groups
    if not fmt.quantised:
        return []
    if phase != "bwd":
        x = fmt.cast_output_bytes(g * m * k)
        out = [("input", x * (fmt.copies - 1) / fmt.copies if input_kept else x)]
    else:
        out = [("dout", fmt.cast_output_bytes(g * m * n))]
        if not input_kept:
            out.append(("input", fmt.cast_output_bytes(g * m * k)))
    if model.fp8_weights_per_use:
        out.append(("weight", fmt.quantised_bytes(g * k * n, weight=True)))
    return [(what, nbytes) for what, nbytes in out if nbytes > 0]


def weight_use_cast_seconds(model: ModelConfig, profile: HardwareProfile, elements: float, phase: str) -> float:
    """A GEMM's weight of ``elements`` elements cast in ``phase`` where the framework casts it per use: at every use
    (``ModelConfig.fp8_weights_per_use``: torchao's Float8Linear casts the high-precision weight in the forward,
    the recompute and again in the backward, keeping no copy), or in every forward and recompute with the copy saved
    for the backward (``fp8_weights_saved``: torchao eab345c's ``cast_weight_to_float8_t`` in each Float8Linear
    forward, every micro-batch's and a checkpointed layer's recompute, the backward reading the saved copy); 0 where
    the copies are a per-step cache re-cast after the optimizer step (`weight_recast_bytes`)."""
    per_use = model.fp8_weights_per_use or (model.fp8_weights_saved and phase != "bwd")
    return cast_seconds(model, profile, elements, weight=True) if per_use else 0.0


def weight_cache_bytes(model: ModelConfig, layers: float, layout: Layout, experts_only: bool = False) -> float:
    """The quantised copies of ``layers`` layers' linear weights on one GPU (`linear_params_on_gpu`); none where the
    framework casts the weights at every use (`weight_use_cast_seconds`) or where each layer's copy is a saved tensor
    of the layer rather than a per-step cache (``fp8_weights_saved``: `saved_weight_bytes`)."""
    fmt = model.gemm
    if not fmt.quantised or model.fp8_weights_per_use or model.fp8_weights_saved:
        return 0.0
    return fmt.quantised_bytes(linear_params_on_gpu(model, layout, layers, experts_only=experts_only), weight=True)


def saved_weight_bytes(model: ModelConfig, layout: Layout) -> float:
    """One layer's quantised weight copy on one GPU where autograd saves it from the layer's forward to its backward
    (``ModelConfig.fp8_weights_saved``: torchao eab345c's Float8Linear saves ``weight_fp8_t``, one copy of each
    linear weight with its scale; the transposed copy its backward's GEMM makes is a temporary); 0 otherwise. The
    policy holds it as the layer's saved tensors (`memo_sim.policy.base.Policy.kept_extras`)."""
    fmt = model.gemm
    if not (fmt.quantised and model.fp8_weights_saved):
        return 0.0
    return fmt.quantised_bytes(linear_params_on_gpu(model, layout, 1), weight=True) / fmt.copies


def weight_recast_bytes(model: ModelConfig, layers: float, layout: Layout, owned: bool = False) -> float:
    """HBM bytes of re-casting ``layers`` layers' linear weights after the optimizer step (read the
    working weights, write the quantised copies); ``owned``: only the GPU's ZeRO-3 shard; none where the weights are
    cast per use instead (`weight_use_cast_seconds`: at every use, or in every forward with the copy saved)."""
    fmt = model.gemm
    if not fmt.quantised or model.fp8_weights_per_use or model.fp8_weights_saved:
        return 0.0
    return fmt.cast_bytes(linear_params_on_gpu(model, layout, layers, owned), model.recipe.weight_bytes, weight=True)


def fp8_gemm_any_layout(profile: HardwareProfile) -> bool:
    """Whether the profile's GPU runs FP8 GEMMs on any operand layout, not only TN (A row-major, B column-major):
    TransformerEngine's ``is_non_tn_fp8_gemm_supported`` (transformer_engine/pytorch/utils.py: compute capability
    10.x and 11.x, Blackwell, and 13.0 on); a profile that states no capability is taken as TN-only (Hopper's)."""
    cc = profile.gpu.compute_capability
    return cc is not None and ((10, 0) <= cc < (12, 0) or cc >= (13, 0))


def runs_transformer_engine(model: ModelConfig) -> bool:
    """Whether the model's framework runs its FP8 GEMMs in TransformerEngine: it keeps the GEMM inputs' quantised
    copies (``fp8_saved_inputs``) and does not all-gather them under TP, as torchao's Float8 TP styles do
    (``fp8_sp_gathers``: torchtitan@2024-12's torchao keeps them too). `for_profile` and `_check_capability`."""
    return bool(model.fp8_saved_inputs and not model.fp8_sp_gathers)


def for_profile(model: ModelConfig, profile: HardwareProfile) -> ModelConfig:
    """``model`` as its framework's FP8 library runs it on the profile's GPU: TransformerEngine (the framework that
    keeps the GEMM inputs' quantised copies, ``fp8_saved_inputs``) writes no transposed copy of a per-tensor-scaled
    tensor where the GPU's FP8 GEMMs take any layout (``fp8_transposes`` off: one copy of each weight, input and
    gradient; its Float8Quantizer and Float8CurrentScalingQuantizer make the transpose only when
    ``not is_non_tn_fp8_gemm_supported()``, and its tests count a Blackwell module's cached FP8 weights at one byte
    per element, two on Hopper). torchao's Float8Linear and memo's executor cast both copies whatever the GPU; the
    torchao of torchtitan@2024-12 (eab345c) keeps its FP8 inputs too (``fp8_saved_inputs``) but all-gathers them under
    its Float8 TP styles (``fp8_sp_gathers``), which TransformerEngine does not, so that marks it apart. A format
    TransformerEngine refuses on the GPU (`TE_BELOW_CAPABILITY`) is refused here (one line), where the framework's
    library is first known (the what-if after `Framework.for_model`, the commands that price a plan file)."""
    _check_capability(model, profile)  # the framework's library known here: TransformerEngine's own refusals
    single = model.gemm.transposed_copy and runs_transformer_engine(model) and fp8_gemm_any_layout(profile)
    return model if model.fp8_transposes != single else replace(model, fp8_transposes=not single)


# each quantised format's nearest others, nearest first: the same scaling family first (per-tensor and per-row
# scales are one FP8 GEMM on the same tensor cores; block scales are MXFP8's on Blackwell), then the rest; a
# format the GPU does not run is passed over (`gpu_runs`), so blockwise falls to mxfp8 on Blackwell and rowwise on
# Hopper, and mxfp8 (or nvfp4) to rowwise on Hopper
NEAREST_FORMATS = {"fp8-tensorwise": ("fp8-rowwise", "fp8-blockwise", "mxfp8"),
                   "fp8-rowwise": ("fp8-tensorwise", "fp8-blockwise", "mxfp8"),
                   "fp8-blockwise": ("mxfp8", "fp8-rowwise", "fp8-tensorwise"),
                   "mxfp8": ("fp8-rowwise", "fp8-blockwise", "fp8-tensorwise"),
                   "nvfp4": ("mxfp8", "fp8-blockwise", "fp8-rowwise", "fp8-tensorwise")}


def gpu_runs(name: str, model: ModelConfig, profile: HardwareProfile) -> bool:
    """Whether the profile's GPU runs ``model``'s layer GEMMs in the format ``name`` (`check_gemm_format` passes)."""
    try:
        check_gemm_format(replace(model, gemm_format=name), profile)
    except MemoError:
        return False
    return True


def nearest_format(model: ModelConfig, offered, profile: HardwareProfile | None) -> str:
    """The GEMM format a framework that offers ``offered`` runs in place of ``model``'s: its own where offered, else
    the nearest quantised one offered that the GPU runs (`NEAREST_FORMATS`), else the model dtype's (bf16); bf16
    too where the profile is unknown (None)."""
    fmt = model.gemm_format
    if fmt in offered:
        return fmt
    if profile is None:
        return "bf16"
    return next((f for f in NEAREST_FORMATS.get(fmt, ()) if f in offered and gpu_runs(f, model, profile)), "bf16")


def plan_for_profile(plan, profile: HardwareProfile):
    """``plan`` with its model as its framework's FP8 library runs it on ``profile``'s GPU (`for_profile`), in place:
    every command that prices a plan file (simulate, explain, check-plan) derives ``fp8_transposes`` anew rather than
    trusting the file's (a plan without the field, or planned for another GPU, priced two FP8 copies on a Blackwell
    where simulate priced one: a review)."""
    plan.model = for_profile(plan.model, profile)
    return plan
