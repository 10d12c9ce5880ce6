"""``fp8-rowwise``: FP8 GEMMs with one fp32 scale per row of each operand along the reduction dimension, as
torchao's Float8Linear runs its ``rowwise`` recipe (torchtitan's Float8 default at b5bcd76c,
``Float8LinearConverter.Config.recipe_name``): every operand, the gradients too, in E4M3 with power-of-two scales
(``Float8LinearConfig.from_recipe_name("rowwise")``: axiswise casts, ``round_scales_to_power_of_2``), multiplied by
``torch._scaled_mm`` with a scale vector per operand. A row's scale is its own amax, so each cast reads the tensor
once with the amax fused into it; the weight-gradient GEMM needs the input and the output gradient scaled along the
other axis, a second cast of each from its own read: two reads and two copies per tensor, the bytes of
tensorwise's amax read, cast and two copies (``amax_pass`` and ``copies`` 2 here). The scales (4 bytes per row of K,
K >= 1,024 elements in the layers memo prices: under 0.4% of a copy) are priced as one per tensor. Its GEMMs run
tensorwise FP8's MMAs with a scale vector applied in the epilogue: the Hopper profiles' ``fp8-rowwise`` curve is their
tensorwise one over the row-wise kernel's time per tensorwise time on the same shapes in one run on an H200 (1.01-1.03x,
2026-12-04: benchmarks/gpu/hopper_curves.py); on a profile with no rowwise curve of its own they run no faster than its
tensorwise one (`GemmFormat.no_faster_than`)."""

from memo_sim.model.gemm_formats.base import GemmFormat
from memo_sim.model.gemm_formats.registry import FORMATS

FP8_ROWWISE = FORMATS.add("fp8-rowwise", GemmFormat(
    "fp8-rowwise", "FP8 GEMMs, one scale per row of each operand from its own amax (torchao's rowwise recipe)",
    ("pytorch/ao torchao/float8/config.py: Float8LinearConfig.from_recipe_name('rowwise'): axiswise scaling of "
     "input, weight and grad_output, e4m3 everywhere, power-of-two scales",
     "pytorch/torchtitan@b5bcd76c torchtitan/components/quantization/float8.py: Float8LinearConverter.Config "
     "recipe_name 'rowwise' (default) or 'rowwise_with_gw_hp'; llama3_405b's configuration converts every Linear "
     "but lm_head"),
    peak="fp8", element_bytes=1, copies=2, amax_pass=True, scale_block=0, weight_scale_block=0, scale_bytes=4,
    needs="FP8 tensor cores (Hopper H100/H200 and newer)", no_faster_than="fp8-tensorwise"))
