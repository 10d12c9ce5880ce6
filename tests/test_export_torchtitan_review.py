"""memo-sim export --to torchtitan, after a user's review (2026-11-29): the written configuration must start under
torchtitan at b5bcd76c and run what memo priced.

torchtitan is not a test dependency, so each exported module runs here against a small stand-in of the torchtitan
names it imports (slots dataclasses, as torchtitan's configs are, so that a field torchtitan lacks raises), built as
torchtitan at b5bcd76c builds them (tests/data/export/torchtitan_names.txt names each source line), and then through
the checks torchtitan's trainer makes before the first step (`_start`): the RoPE length (models/common/decoder.py
update_from_config), context parallelism's attention backends, CUDA graphs (trainer.py _validate_cuda_graphs), the
mesh (distributed/parallel_dims.py ParallelDims._validate) and the token counts (trainer.py Trainer.__init__).
"""

from __future__ import annotations

import ast
import json
import sys
import types
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from memo_sim.export import export_plan
from memo_sim.export import torchtitan as tt
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.plan.schema import Plan
from memo_sim.policy import get_policy

DATA = Path(__file__).parent / "data"


# --- a stand-in of the torchtitan names the exported module imports (torchtitan at b5bcd76c) --------------------

@dataclass(kw_only=True, slots=True)
class TrainingConfig:  # config/configs.py:35-87 (the fields the export reads or writes)
    num_tokens_per_microbatch_per_dp_rank: int = 16384
    num_tokens_per_train_step: int = -1
    max_context_length: int = 2048
    disable_cuda_graphs: bool = False


@dataclass(kw_only=True, slots=True)
class ParallelismConfig:  # config/configs.py:120-290
    data_parallel_replicate_degree: int = 1
    data_parallel_shard_degree: int = -1
    fsdp_reshard_after_forward: str = "default"
    tensor_parallel_degree: int = 1
    enable_sequence_parallel: bool = True
    spmd_backend: str = "spmd_types"
    pipeline_parallel_degree: int = 1
    module_fqns_per_model_part: list | None = None
    pipeline_parallel_first_stage_less_layers: int = 1
    pipeline_parallel_last_stage_less_layers: int = 1
    pipeline_parallel_layers_per_stage: int | None = None
    pipeline_parallel_schedule: str = "1F1B"
    num_pp_microbatches: int = 1
    context_parallel_degree: int = 1
    expert_parallel_degree: int = 1


@dataclass(kw_only=True, slots=True)
class CompileConfig:  # config/configs.py:293-313
    enable: bool = False
    enable_async_tensor_parallel: bool = False
    components: list = field(default_factory=lambda: ["model", "loss"])
    backend: str = "inductor"


@dataclass(kw_only=True, slots=True)
class RoPEConfig:  # models/common/rope.py:92-108
    dim: int
    max_context_length: int
    theta: float = 10000.0


@dataclass(kw_only=True, slots=True)
class Attention:
    rope: RoPEConfig
    inner_attention: str  # models/common/config_utils.py get_attention_config: flex | varlen
    linears: tuple[str, ...]


@dataclass(kw_only=True, slots=True)
class Block:  # models/common/decoder.py:53-58 TransformerBlock.Config
    attention: Attention
    feed_forward: bool = False  # dense w1, w2, w3
    moe: bool = False  # router.gate, routed experts, shared experts where `shared`
    shared: bool = False


@dataclass(kw_only=True, slots=True)
class Model:  # Decoder.Config, its Linear.Configs by FQN as Configurable.Config.traverse names them
    layers: list
    num_experts: int = 0
    quantised: set = field(default_factory=set)  # Linear FQNs a converter swapped
    experts_quantised: bool = False
    pad_multiple: int | None = None

    def linears(self) -> list[str]:
        out = ["lm_head"]
        for i, b in enumerate(self.layers):
            out += [f"layers.{i}.attention.{n}" for n in b.attention.linears]
            out += [f"layers.{i}.feed_forward.w{j}" for j in (1, 2, 3)] if b.feed_forward else []
            out += [f"layers.{i}.moe.router.gate"] if b.moe else []
            out += [f"layers.{i}.moe.shared_experts.w{j}" for j in (1, 2, 3)] if b.shared else []
        return out


@dataclass(kw_only=True, slots=True)
class ModelSpec:
    name: str
    flavor: str
    model: Model


@dataclass(kw_only=True, slots=True)
class LossFn:
    global_vocab_size: int


@dataclass(kw_only=True, slots=True)
class Loss:
    loss_fn: LossFn


@dataclass(kw_only=True, slots=True)
class TrainerConfig:  # trainer.py:69-116 (the fields the export reads or writes)
    model_spec: ModelSpec | None = None
    hf_assets_path: str = "./tests/assets/tokenizer"
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    activation_checkpoint: object = None
    compile: CompileConfig = field(default_factory=CompileConfig)
    loss: Loss = field(default_factory=lambda: Loss(loss_fn=LossFn(global_vocab_size=0)))


class Trainer:
    Config = TrainerConfig


class FullAC:
    @dataclass(kw_only=True, slots=True)
    class Config:
        pass


class SelectiveAC(FullAC):
    pass


class MXFP8LinearConverter:  # components/quantization/mx.py:50-98
    @dataclass(kw_only=True, slots=True)
    class Config:
        model_compile_enabled: bool = False
        fqns: list = field(default_factory=list)

    @staticmethod
    def convert(c, model: Model) -> None:
        model.quantised |= {f for f in model.linears() if not c.fqns or any(t in f for t in c.fqns)}


class MXFP8GroupedExpertsConverter:  # mx.py:149-206
    @dataclass(kw_only=True, slots=True)
    class Config:
        model_compile_enabled: bool = False
        recipe_name: str = "mxfp8_rceil"
        pad_multiple: int = 32

    @staticmethod
    def convert(c, model: Model) -> None:
        model.experts_quantised, model.pad_multiple = True, c.pad_multiple


class Float8LinearConverter:  # components/quantization/float8.py (llama3_405b's: filter_fqns=["lm_head"])
    @dataclass(kw_only=True, slots=True)
    class Config:
        model_compile_enabled: bool = False
        recipe_name: str = "rowwise"
        filter_fqns: list = field(default_factory=list)

    @staticmethod
    def convert(c, model: Model) -> None:
        model.quantised |= {f for f in model.linears() if not any(t in f for t in c.filter_fqns)}


class Float8GroupedExpertsConverter:  # components/quantization/float8.py (deepseek_v3_671b_float8's)
    @dataclass(kw_only=True, slots=True)
    class Config:
        model_compile_enabled: bool = False

    @staticmethod
    def convert(c, model: Model) -> None:
        model.experts_quantised, model.pad_multiple = True, 16  # Float8GroupedExpertsConverter.PAD_MULTIPLE


_OWNER = {MXFP8LinearConverter.Config: MXFP8LinearConverter, MXFP8GroupedExpertsConverter.Config:
          MXFP8GroupedExpertsConverter, Float8LinearConverter.Config: Float8LinearConverter,
          Float8GroupedExpertsConverter.Config: Float8GroupedExpertsConverter}

# (module, flavour): layers, the rotary table's length, attention Linears, experts (0: dense), shared expert, dense
# layers first: torchtitan/models/<module>/__init__.py at b5bcd76c
FLAVOURS = {
    **{("llama3", f): (n, 131072, ("wqkv", "wo"), 0, False, 0) for f, n in (("8B", 32), ("70B", 80), ("405B", 126))},
    **{("qwen3", f): (n, 40960, ("wqkv", "wo"), 0, False, 0) for f, n in (("8B", 36), ("14B", 40), ("32B", 64))},
    ("qwen3", "30B-A3B"): (48, 40960, ("wqkv", "wo"), 128, False, 0),
    ("qwen3", "235B-A22B"): (94, 40960, ("wqkv", "wo"), 128, False, 0),
    ("deepseek_v3", "671B"): (61, 4096 * 4, ("wq_a", "wq_b", "wkv_a", "wkv_b", "wo"), 256, True, 3),
    ("gpt_oss", "20b"): (24, 131072, ("wq", "wk", "wv", "wo"), 32, False, 0),
    ("gpt_oss", "120b"): (36, 131072, ("wq", "wk", "wv", "wo"), 128, False, 0),
}
_DEFAULT_ATTN = {"llama3": "flex", "qwen3": "flex", "deepseek_v3": "flex", "gpt_oss": "varlen"}  # model_registry's


def _registry(module: str):
    def model_registry(flavor, attn_backend=_DEFAULT_ATTN[module], converters=None, moe_comm_backend=None):
        n, rope, attn, experts, shared, dense = FLAVOURS[(module, flavor)]
        layers = [Block(attention=Attention(rope=RoPEConfig(dim=64, max_context_length=rope), linears=attn,
                                            inner_attention=attn_backend),
                        feed_forward=not experts or i < dense, moe=bool(experts) and i >= dense,
                        shared=shared and i >= dense) for i in range(n)]
        model = Model(layers=layers, num_experts=experts)
        for c in converters or ():
            _OWNER[type(c)].convert(c, model)
        return ModelSpec(name=module, flavor=flavor, model=model)
    return model_registry


def _shipped(module: str, flavor: str, **kw):
    """A shipped configuration (config_registry.py at b5bcd76c), as far as the export reads or writes it."""
    def make() -> TrainerConfig:
        spec = _registry(module)(flavor, **kw.get("registry", {}))
        return TrainerConfig(model_spec=spec, training=TrainingConfig(**kw.get("training", {})),
                             parallelism=ParallelismConfig(**kw.get("parallelism", {})),
                             compile=CompileConfig(**kw.get("compile", {})))
    return make


SHIPPED = {
    "llama3": {"llama3_8b": _shipped("llama3", "8B"), "llama3_70b": _shipped("llama3", "70B"),
               # llama3/config_registry.py:305-356
               "llama3_405b": _shipped("llama3", "405B", compile={"enable": True, "enable_async_tensor_parallel": True},
                                       registry={"converters": [Float8LinearConverter.Config(
                                           filter_fqns=["lm_head"], model_compile_enabled=True)]})},
    "qwen3": {"qwen3_14b": _shipped("qwen3", "14B"), "qwen3_32b": _shipped("qwen3", "32B"),
              "qwen3_30b_a3b": _shipped("qwen3", "30B-A3B")},
    # deepseek_v3/config_registry.py:209-245
    "deepseek_v3": {"deepseek_v3_671b": _shipped("deepseek_v3", "671B",
                                                 compile={"enable": True, "components": ["loss"]},
                                                 training={"disable_cuda_graphs": True},
                                                 parallelism={"pipeline_parallel_schedule": "Interleaved1F1B",
                                                              "expert_parallel_degree": 2})},
    "gpt_oss": {"gpt_oss_20b": _shipped("gpt_oss", "20b"), "gpt_oss_120b": _shipped("gpt_oss", "120b")},
}


@pytest.fixture
def titan(monkeypatch):
    """The stand-in torchtitan in sys.modules, for the exported module's imports."""
    def mod(name: str, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, m)

    for name in ("torchtitan", "torchtitan.distributed", "torchtitan.components", "torchtitan.models",
                 "torchtitan.components.quantization"):
        mod(name)
    mod("torchtitan.trainer", Trainer=Trainer)
    mod("torchtitan.distributed.activation_checkpoint", FullAC=FullAC, SelectiveAC=SelectiveAC)
    mod("torchtitan.components.quantization.mx", MXFP8LinearConverter=MXFP8LinearConverter,
        MXFP8GroupedExpertsConverter=MXFP8GroupedExpertsConverter)
    mod("torchtitan.components.quantization.float8", Float8LinearConverter=Float8LinearConverter,
        Float8GroupedExpertsConverter=Float8GroupedExpertsConverter)
    for module, functions in SHIPPED.items():
        mod(f"torchtitan.models.{module}", model_registry=_registry(module))
        mod(f"torchtitan.models.{module}.config_registry", **functions)
    return run


def run(src: str) -> TrainerConfig:
    """The exported module's configuration, as ``torchtitan.train --module memo_torchtitan --config memo_plan``
    builds it."""
    ns: dict = {}
    exec(compile(src, "memo_torchtitan.py", "exec"), ns)  # noqa: S102 - the module memo wrote
    return ns[tt.FUNCTION]()


def _start(cfg: TrainerConfig, world: int) -> None:
    """What torchtitan at b5bcd76c checks of a configuration before its first step (each raise as its source's)."""
    p, t, m = cfg.parallelism, cfg.training, cfg.model_spec.model
    dp_rep, dp_shard, cp, tp, pp, ep = (p.data_parallel_replicate_degree, p.data_parallel_shard_degree,
                                        p.context_parallel_degree, p.tensor_parallel_degree,
                                        p.pipeline_parallel_degree, p.expert_parallel_degree)
    if dp_shard < 0:  # distributed/parallel_dims.py:166-192
        dp_shard = world // (dp_rep * cp * tp * pp)
    assert dp_rep * dp_shard * cp * tp * pp == world, "Invalid parallel dims"
    if (dp_shard * cp * tp) % ep:
        raise ValueError(f"expert_parallel_degree ({ep}) must divide dp_shard * cp * tp ({dp_shard * cp * tp})")
    divisor = (tp if p.enable_sequence_parallel else 1) * (2 * cp if cp > 1 else 1)  # trainer.py:295-308
    if t.num_tokens_per_microbatch_per_dp_rank % divisor:
        raise ValueError("The number of tokens per pipeline microbatch must be divisible")
    if cp > 1 and any(b.attention.inner_attention == "varlen" for b in m.layers):  # models/common/decoder.py:166-176
        raise NotImplementedError("Context Parallel is not supported with ScaledDotProductAttention or "
                                  "VarlenAttention. Use FlexAttention or disable CP.")
    if m.num_experts % ep:  # decoder.py:194-201
        raise ValueError(f"num_experts ({m.num_experts}) must be divisible by expert_parallel_degree ({ep}).")
    if t.max_context_length > m.layers[0].attention.rope.max_context_length:  # decoder.py:129-137, 216-225
        raise ValueError(f"Training sequence length {t.max_context_length} exceeds attention RoPE maximum "
                         f"supported sequence length {m.layers[0].attention.rope.max_context_length}.")
    if not t.disable_cuda_graphs:  # trainer.py:168-199 (the all-to-all dispatcher of the "standard" comm_backend)
        if pp > 1:
            raise ValueError("CUDA graphs do not support pipeline parallelism yet.")
        if ep > 1 and m.num_experts:
            raise ValueError("CUDA graphs support only expert parallel token dispatcher configurations without CPU "
                             "synchronization.")
    per_dp_rank = t.num_tokens_per_microbatch_per_dp_rank * (p.num_pp_microbatches if pp > 1 else 1)
    if t.num_tokens_per_train_step % (per_dp_rank * dp_rep * dp_shard):  # trainer.py:409-425
        raise ValueError("training.num_tokens_per_train_step must be divisible")


def _compiled(cfg: TrainerConfig) -> bool:
    """Whether torchtitan compiles the model's blocks (llama3/parallelize.py:42-55, distributed/compile.py:39-72)."""
    return cfg.compile.enable and "model" in cfg.compile.components


def _converters(src: str) -> dict[str, dict[str, object]]:
    """The converters' keyword arguments in the exported module, by class."""
    out = {}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("Converter.Config"):
            out[ast.unparse(node.func).removesuffix(".Config")] = {k.arg: ast.literal_eval(k.value)
                                                                  for k in node.keywords}
    return out


def _names_checked(src: str) -> None:
    """Every attribute the module sets and every keyword it passes is one tests/data/export/torchtitan_names.txt lists
    (checked against torchtitan at b5bcd76c), of the kind listed."""
    lines = (DATA / "export" / "torchtitan_names.txt").read_text().splitlines()
    sets = {ln.split(" ")[1]: ln.split(" ")[2] for ln in lines if ln.startswith("set ")}
    args = {(ln.split(" ")[1], ln.split(" ")[2]): ln.split(" ")[3] for ln in lines if ln.startswith("arg ")}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
            target = ast.unparse(node.targets[0]).removeprefix("config.")
            assert target in sets, target
            if sets[target] == "list":
                assert isinstance(node.value, ast.List), ast.unparse(node)
        if isinstance(node, ast.Call):
            for k in node.keywords:
                key = (ast.unparse(node.func), k.arg)
                assert key in args, key
                kind = args[key]
                value = ast.literal_eval(k.value) if kind != "list" else None
                assert (isinstance(k.value, ast.List) if kind == "list" else isinstance(value, bool) if kind == "bool"
                        else isinstance(value, int) if kind == "int" else value in kind.split("|")), ast.unparse(node)


def _plan(model, layout: Layout, policy=("full_recompute",), seq=32768, batch=1, micro=0, sched="",
          profile="b200-180gb") -> Plan:
    return Plan(model=model, batch=batch, seq_tokens=seq, gpus=layout.gpus, layout=layout,
                policy=get_policy(*policy), profile=profile,
                predicted={"status": "OK", "iteration_s": 10.0, "mfu": 0.5},
                layer_timings_s={"forward": 0.1, "backward": 0.2}, micro_batch=micro, schedule=sched)


def _exported(plan: Plan):
    ex = export_plan(plan, "torchtitan", price=False, nearest=True)
    src = ex.files["memo_torchtitan.py"]
    _names_checked(src)
    return ex, src


def _q235(tmp_path: Path):
    """Qwen/Qwen3-235B-A22B's config.json: the 30B-A3B fixture's fields but these (rope_theta 1e6)."""
    raw = json.loads((DATA / "hf" / "qwen3-30b-a3b" / "config.json").read_text())
    raw.update(hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536, num_attention_heads=64,
               num_hidden_layers=94, max_window_layers=94)
    path = tmp_path / "qwen3-235b.json"
    path.write_text(json.dumps(raw))
    return get_model(str(path))


# the reviewer's plans (/tmp/review_a): DeepSeek-V3 on 256 B200 at 32K in fp8-blockwise (memo's "any" plan), and
# Qwen3-235B-A22B and Llama-3.1-70B in MXFP8 priced for torchtitan (its blocks hand-fused: kernel_fusion fused)
DSV3 = _plan(replace(get_model("deepseek-v3"), gemm_format="fp8-blockwise"),
             Layout(tp=2, sp=True, dp=128, zero=3, ep=8), ("memo", 0.014), batch=2, micro=2)
L70_MX = _plan(replace(get_model("llama-3.1-70b"), gemm_format="mxfp8"),
               Layout(tp=4, sp=True, cp=2, pp=4, vpp=4, dp=2, zero=3, dp_mode="fsdp", reshard_after_forward=False,
                      cross_entropy="torch_fused", expandable_segments=True),
               ("store_all",), batch=32, micro=1, sched="interleaved_1f1b")
Q235_LAYOUT = Layout(tp=2, sp=True, cp=4, pp=8, vpp=4, dp=4, zero=0, ep=8, account_embedding_loss=True,
                     cross_entropy="torch_fused", expandable_segments=True)


# 1. the rotary table -------------------------------------------------------------------------------------------

def test_deepseek_v3_at_32k_sets_every_layers_rope_length_and_starts(titan):
    """deepseek_v3_671b's rope is ComplexRoPE.Config(max_context_length=4096 * 4) (deepseek_v3/__init__.py:575-584),
    and update_from_config refused the 32K plan ("Training sequence length 32768 exceeds attention RoPE maximum
    supported sequence length 16384"), while the export said the plan was expressed apart from its gaps."""
    ex, src = _exported(DSV3)
    assert ("    for layer in config.model_spec.model.layers:\n"
            "        layer.attention.rope.max_context_length = 32768\n") in src, src
    cfg = titan(src)
    _start(cfg, DSV3.gpus)
    assert {b.attention.rope.max_context_length for b in cfg.model_spec.model.layers} == {32768}
    # the shipped length where it suffices: nothing written
    _, short = _exported(replace(DSV3, seq_tokens=16384))
    assert "max_context_length = " not in short.split("config.training.max_context_length")[1], short
    _start(titan(short), DSV3.gpus)


def test_every_flavour_written_gets_a_rope_long_enough(titan):
    """Each flavour the export starts from has its rotary table's length in ROPE_MAX, and a plan longer than it is
    written with the plan's: Qwen3-8B (model_registry('8B'), 40960) at 64K, Llama-3.1-8B at 256K."""
    for name, seq in (("qwen3-8b", 65536), ("llama-3.1-8b", 262144), ("gpt-oss-20b", 262144)):
        plan = _plan(get_model(name), Layout(tp=2, sp=True, cp=4, dp=2, zero=3, dp_mode="fsdp"), seq=seq)
        _, src = _exported(plan)
        assert f"layer.attention.rope.max_context_length = {seq}" in src, src
        cfg = titan(src)
        _start(cfg, plan.gpus)
        assert cfg.model_spec.model.layers[-1].attention.rope.max_context_length == seq
    assert {v for v in tt.REGISTRY.values()} <= set(tt.ROPE_MAX)


# 2. MXFP8 on what memo prices in it --------------------------------------------------------------------------------

def _layer_gemms(model: Model) -> set[str]:
    """The Linears memo prices in the plan's GEMM format: the layers' (memo_sim/cost/gemm_format.py: the classifier
    in the model dtype; memo_sim/cost/layer_time.py: the router in the model dtype)."""
    return {f for f in model.linears() if f.startswith("layers.") and not f.endswith("router.gate")}


@pytest.mark.parametrize("which", ["qwen3-235b", "llama-3.1-70b", "deepseek-v3", "qwen3-30b-a3b"])
def test_mxfp8_converts_the_layer_gemms_only(titan, tmp_path, which):
    """MXFP8LinearConverter.Config without fqns converts every Linear.Config (mx.py:79-98), the output head and the
    routers' gates (config_utils.py:329-357) among them, which memo prices in bf16: the export names the blocks'
    attention, feed-forward and shared-expert Linears (torchtitan's own deepseek_v3_debugmodel_mxfp8 does), and pads
    the grouped experts' tokens to 128 (mx.py:161-165)."""
    if which == "qwen3-235b":
        plan = _plan(replace(_q235(tmp_path), gemm_format="mxfp8"), Q235_LAYOUT, ("store_all",), batch=64, micro=1,
                     sched="interleaved_1f1b")
    elif which == "llama-3.1-70b":
        plan = L70_MX
    else:
        plan = _plan(replace(get_model(which), gemm_format="mxfp8"), Layout(tp=2, sp=True, dp=32, zero=3, ep=8),
                     batch=2, micro=1)
    ex, src = _exported(plan)
    cfg = titan(src)
    model = cfg.model_spec.model
    assert model.quantised == _layer_gemms(model), sorted(model.quantised ^ _layer_gemms(model))[:6]
    assert "lm_head" not in model.quantised and not any(f.endswith("router.gate") for f in model.quantised)
    assert model.experts_quantised == plan.model.moe
    if plan.model.moe:
        assert model.pad_multiple == 128
    _start(cfg, plan.gpus)


@pytest.mark.parametrize("which", ["llama-3.1-405b", "llama-3.1-8b", "qwen3-32b", "deepseek-v3", "qwen3-30b-a3b"])
def test_float8_rowwise_converts_every_linear_but_the_head_as_llama3_405b_does(titan, which):
    """Float8's rowwise recipe (torchtitan's default at b5bcd76c, llama3_405b's converter): every Linear.Config but
    lm_head (and a MoE's routers' gates), which memo prices in bf16 (float8.py filter_fqns), a MoE's grouped experts
    through Float8GroupedExpertsConverter (deepseek_v3_671b_float8's), the blocks compiled; the shipped 405B
    configuration's own converter is replaced by the same one, not stacked on it."""
    lay = (Layout(tp=2, sp=True, dp=32, zero=3, ep=8, kernel_fusion="compiled") if which in ("deepseek-v3",
           "qwen3-30b-a3b") else Layout(tp=8, sp=True, dp=8, zero=3, dp_mode="fsdp", kernel_fusion="compiled"))
    plan = _plan(replace(get_model(which), gemm_format="fp8-rowwise"), lay, profile="h100-sxm5-80gb")
    ex, src = _exported(plan)
    assert not any("fp8" in g.what for g in ex.gaps), [g.what for g in ex.gaps]
    cfg = titan(src)
    model = cfg.model_spec.model
    assert model.quantised == _layer_gemms(model), sorted(model.quantised ^ _layer_gemms(model))[:6]
    assert "lm_head" not in model.quantised and model.experts_quantised == plan.model.moe
    assert cfg.compile.enable and "model" in cfg.compile.components
    _start(cfg, plan.gpus)


# 3. MXFP8 compiled, and compile as priced ------------------------------------------------------------------------

def test_mxfp8_runs_compiled_and_says_memo_priced_it_hand_fused(titan, tmp_path):
    """The MXFP8 exports wrote model_compile_enabled=False and left compile off (mx.py:73-77 warns: "torch.compile
    enablement is required for highest performance of MXFP8 dynamic quantization"). torchtitan's framework data
    prices its blocks hand-fused (kernel_fusion fused: memo_sim/frameworks/data/torchtitan.yaml); the export compiles
    them, tells the converters, and lists that beside the plan."""
    plans = [L70_MX, _plan(replace(_q235(tmp_path), gemm_format="mxfp8"), Q235_LAYOUT, ("store_all",), batch=64,
                           micro=1, sched="interleaved_1f1b")]
    for plan in plans:
        ex, src = _exported(plan)
        cfg = titan(src)
        assert _compiled(cfg), src
        assert all(kw["model_compile_enabled"] is True for kw in _converters(src).values()), _converters(src)
        gap = next(g for g in ex.gaps if g.what.startswith("MXFP8 GEMMs in blocks priced uncompiled"))
        assert "compiled" in gap.nearest and "no slower than priced" in gap.nearest
        assert "Every part of the plan is expressed" not in src
        _start(cfg, plan.gpus)
    compiled = replace(L70_MX, layout=replace(L70_MX.layout, kernel_fusion="compiled"))
    ex, src = _exported(compiled)  # priced compiled: nothing to say
    assert _compiled(titan(src)) and not any(g.what.startswith("MXFP8 GEMMs in blocks") for g in ex.gaps)


def test_deepseek_compiled_blocks_are_compiled(titan):
    """deepseek_v3_671b ships CompileConfig(enable=True, components=["loss"]) (config_registry.py:244): enable alone
    left its blocks uncompiled; a plan priced compiled adds "model" to the components, one priced otherwise does not."""
    plan = replace(DSV3, layout=replace(DSV3.layout, kernel_fusion="compiled"))
    _, src = _exported(plan)
    cfg = titan(src)
    assert _compiled(cfg) and "loss" in cfg.compile.components
    # a plan priced uncompiled in bf16 is written uncompiled (its fp8-blockwise is written as the nearest format
    # torchtitan runs on the B200, MXFP8, whose blocks compile: a review)
    assert not _compiled(titan(_exported(replace(DSV3, model=replace(DSV3.model, gemm_format="bf16")))[1]))
    _start(cfg, plan.gpus)


def test_llama_405b_runs_what_was_priced(titan):
    """llama3_405b ships a rowwise Float8 converter, compile and async TP (config_registry.py:305-356): a plan priced
    in bf16 with uncompiled blocks ran Float8 GEMMs, compiled, with async TP. The export sets its model_spec anew
    (no converter) and compiles the blocks and runs async TP where priced only."""
    m = get_model("llama-3.1-405b")
    plan = _plan(m, Layout(tp=8, sp=True, dp=16, zero=3, dp_mode="fsdp"), seq=8192)
    _, src = _exported(plan)
    cfg = titan(src)
    assert not cfg.model_spec.model.quantised and not _compiled(cfg) and not cfg.compile.enable_async_tensor_parallel
    assert "model_registry('405B')" in src
    _start(cfg, plan.gpus)
    asy = replace(plan, layout=replace(plan.layout, tp_mode="async_tp"))
    cfg = titan(_exported(asy)[1])
    assert _compiled(cfg) and cfg.compile.enable_async_tensor_parallel and not cfg.model_spec.model.quantised
    _start(cfg, asy.gpus)


# 4. other startup refusals -----------------------------------------------------------------------------------------

def test_async_tp_is_set_on_the_compile_config(titan):
    """enable_async_tensor_parallel is a CompileConfig field (config/configs.py:298), not a ParallelismConfig one: the
    export set config.parallelism.enable_async_tensor_parallel, an AttributeError on torchtitan's slots dataclass."""
    plan = _plan(get_model("llama-3.1-8b"), Layout(tp=8, sp=True, tp_mode="async_tp", dp=4, zero=3, dp_mode="fsdp"),
                 seq=8192, profile="h100-sxm5-80gb")
    _, src = _exported(plan)
    assert "config.compile.enable_async_tensor_parallel = True" in src and "parallelism.enable_async" not in src
    cfg = titan(src)
    _start(cfg, plan.gpus)
    assert _compiled(cfg) and cfg.compile.enable_async_tensor_parallel


def test_pipelines_and_expert_parallelism_start_without_cuda_graphs(titan, tmp_path):
    """CUDA graphs are on by default at b5bcd76c (TrainingConfig.disable_cuda_graphs False) and trainer.py:168-199
    refuses them beside pipeline parallelism and the all-to-all EP dispatcher: the Llama-3.1-70B and Qwen3-235B
    pipelines, and every MoE plan with EP, did not start. memo prices eager launches: the export turns them off."""
    q235 = _plan(replace(_q235(tmp_path), gemm_format="mxfp8"), Q235_LAYOUT, ("store_all",), batch=64, micro=1,
                 sched="interleaved_1f1b")
    qwen_ep = _plan(get_model("qwen3-30b-a3b"), Layout(dp=16, zero=3, dp_mode="fsdp", ep=8), seq=8192)
    for plan in (L70_MX, q235, qwen_ep, DSV3):
        _, src = _exported(plan)
        assert "config.training.disable_cuda_graphs = True" in src
        _start(titan(src), plan.gpus)


def test_expert_parallelism_beside_replicas_borrows_from_a_shard_group(titan):
    """torchtitan borrows the EP ranks from dp_shard x cp x tp (distributed/parallel_dims.py:187-192); a ZeRO-0 plan
    (data_parallel_shard_degree 1) with EP over more ranks than TP x CP did not start: it is written as ZeRO 2 (FSDP2
    over the data group, never resharded), a gap says so and the nearest plan is priced so (memo's FSDP, kept)."""
    plan = _plan(get_model("qwen3-30b-a3b"), Layout(dp=8, ep=4), ("store_all",), seq=8192, profile="a800-80gb")
    ex, src = _exported(plan)
    gap = next(g for g in ex.gaps if g.what.startswith("expert parallelism over 4 ranks beside replicated"))
    assert gap.change.layout == {"zero": 3, "dp_mode": "fsdp", "reshard_after_forward": False}
    assert "config.parallelism.data_parallel_shard_degree = 8" in src
    assert "config.parallelism.fsdp_reshard_after_forward = 'never'" in src
    _start(titan(src), plan.gpus)
    within = _plan(get_model("qwen3-30b-a3b"), Layout(tp=2, cp=4, dp=4, ep=8), seq=32768)  # TP x CP holds EP: as is
    ex, src = _exported(within)
    assert not any("replicated data parallelism" in g.what for g in ex.gaps)
    assert "config.parallelism.data_parallel_shard_degree = 1" in src
    _start(titan(src), within.gpus)


def test_gpt_oss_under_context_parallelism_uses_flex_attention(titan):
    """gpt_oss's model_registry defaults to varlen attention (gpt_oss/__init__.py model_registry), which
    update_from_config refuses beside CP (decoder.py:166-176): with CP the export sets model_spec with
    attn_backend='flex' (gpt_oss_debugmodel_flex's); without CP it keeps the shipped one."""
    plan = _plan(get_model("gpt-oss-20b"), Layout(tp=2, sp=True, cp=2, dp=4, zero=3, dp_mode="fsdp", ep=4),
                 seq=32768, profile="h100-sxm5-80gb")
    _, src = _exported(plan)
    assert "config.model_spec = model_registry('20b', attn_backend='flex')" in src, src
    _start(titan(src), plan.gpus)
    no_cp = replace(plan, layout=replace(plan.layout, cp=1, dp=8))
    _, src = _exported(no_cp)
    assert "model_spec" not in src
    _start(titan(src), no_cp.gpus)
