"""Shared pieces of the memo-sim commands: count options, model flags, the error-to-exit-2 group, progress."""

from __future__ import annotations

import contextlib
import sys
import time

import click

from memo_sim.errors import MemoError, guarded, parsed_or_one_line, usage_line
from memo_sim.layout.parallel import MAX_DEGREE
from memo_sim.plan.schema import MAX_BATCH
from memo_sim.model.config import MAX_MTP_LAYERS, ModelConfig, get_model, with_overrides
from memo_sim.model.gemm_formats import GEMM_FORMATS
from memo_sim.model.precision import RECIPES
from memo_sim.units import fmt_bytes, parse_count, parse_headroom


def count_option(ctx, param, value):
    if value is None:
        return None
    try:
        return parse_count(value, f"--{param.name.replace('_', '-')}")
    except MemoError as e:
        raise click.BadParameter(str(e).split(": ", 1)[-1]) from None


def moe_balance_option(ctx, param, value):
    """``--moe-balance``: forced, random, dropless, capacity:F or loads:FILE (`memo_sim.layout.moe_balance`):
    a loads file (JSON: per-expert token counts, a list, or a list of lists one per MoE layer, or
    {"loads": ...}) becomes the plan's ``measured:`` setting, its numbers, not its path."""
    from memo_sim.layout.moe_balance import balance_why_not, measured_balance  # noqa: PLC0415 - lazy

    if isinstance(value, str) and value.startswith("loads:"):
        import json  # noqa: PLC0415

        path = value.split(":", 1)[1]
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, ValueError) as e:
            raise click.BadParameter(f"loads file {path!r} cannot be read as JSON ({type(e).__name__}: "
                                     f"{str(e).splitlines()[0] if str(e) else ''}); give per-expert token counts") from None
        raw = raw.get("loads") if isinstance(raw, dict) else raw
        rows = raw if isinstance(raw, list) and raw and all(isinstance(r, list) for r in raw) else [raw]
        try:
            text = measured_balance(rows if all(isinstance(r, list) for r in rows) else [])
        except (ValueError, TypeError) as e:
            raise click.BadParameter(f"loads file {path!r}: {e}") from None
        why = balance_why_not(text)
        if why:
            raise click.BadParameter(f"loads file {path!r}: {why}")
        return text
    why = balance_why_not(value)
    if why:
        raise click.BadParameter(why)
    return value


def precision_option(ctx, param, value):
    """``--precision``: recipe and/or GEMM format names, comma-separated, at most one of each ->
    {"precision": recipe or None, "gemm_format": format or None}; None when not given."""
    if value is None:
        return None
    out = {"precision": None, "gemm_format": None}
    for word in (w.strip() for w in value.split(",")):
        key = "precision" if word in RECIPES else "gemm_format" if word in GEMM_FORMATS else None
        if key is None:
            raise click.BadParameter(f"{word!r} is neither a recipe ({', '.join(RECIPES)}) nor a GEMM format "
                                     f"({', '.join(GEMM_FORMATS)})")
        if out[key] is not None:
            raise click.BadParameter(f"two {'recipes' if key == 'precision' else 'GEMM formats'} "
                                     f"({out[key]}, {word}); name one")
        out[key] = word
    return out


POSITIVE = click.IntRange(min=1)  # a model flag's count or width: one at least, refused in one line naming it


def model_options(f):
    f = click.option("--precision", callback=precision_option, metavar="RECIPE[,FORMAT]",
                     help="Model-state recipe (" + ", ".join(RECIPES) + "; default: the framework's, else megatron "
                          "for 16-bit models, fp32 for fp32) and/or the layer GEMMs' format ("
                          + ", ".join(GEMM_FORMATS) + "; default bf16), comma-separated: e.g. fp8-tensorwise, "
                          "zero,fp8-blockwise.")(f)
    f = click.option("--mtp-layers", type=click.IntRange(0, MAX_MTP_LAYERS), metavar="N",
                     help="Multi-token-prediction modules after the last layer (default: the model's, e.g. "
                          "DeepSeek-V3's 1; 0 plans the model without them).")(f)
    f = click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]),
                     help="Override the model dtype (fp32 for plans run on a CPU profile).")(f)
    f = click.option("--vocab", type=POSITIVE, help="Override the vocabulary size.")(f)
    f = click.option("--ffn", type=POSITIVE, help="Override the FFN width.")(f)
    f = click.option("--head-dim", type=click.IntRange(min=0),
                     help="Override the query/key head size (0: hidden / heads; a preset's "
                                                  "own, e.g. Qwen3's 128, is kept otherwise).")(f)
    f = click.option("--kv-heads", type=POSITIVE,
                     help="Override the K/V heads (grouped-query attention; they divide the "
                                                  "query heads).")(f)
    f = click.option("--heads", type=POSITIVE, help="Override the attention heads.")(f)
    f = click.option("--hidden", type=POSITIVE, help="Override the hidden size (the dense FFN keeps its ratio to it "
                                                "unless --ffn is given; the experts' widths always do).")(f)
    f = click.option("--layers", type=POSITIVE, help="Override the number of layers (e.g. a 4-layer toy model).")(f)
    f = click.option("--model", "model_name", default="gpt-7b", show_default=True,
                     help="Preset name (memo-sim models) or a model .yaml/.json file.")(f)
    return f


DEFAULT_PROFILE = "a800-80gb"  # the hardware profile a command assumes when --profile is not given


def profile_option(help: str = "Hardware profile: a name (memo-sim profiles) or a profile .yaml file."):
    """The ``--profile`` option (a profile name or file), `DEFAULT_PROFILE` unless given."""
    return click.option("--profile", "profile_name", default=DEFAULT_PROFILE, show_default=True, help=help)


def build_model(model_name: str, layers, hidden, heads, ffn, vocab, dtype=None, precision=None, kv_heads=None,
                head_dim=None, mtp_layers=None) -> ModelConfig:
    """The preset or file ``model_name`` with the flags' overrides; ``precision``: a recipe name, or
    `precision_option`'s {"precision": ..., "gemm_format": ...}."""
    prec = precision if isinstance(precision, dict) else {"precision": precision}
    return with_overrides(get_model(model_name), layers=layers, hidden=hidden, heads=heads, ffn=ffn, vocab=vocab,
                          dtype=dtype, kv_heads=kv_heads, head_dim=head_dim, mtp_layers=mtp_layers, **prec)


def asked_policy(name: str, model: ModelConfig, layout=None, alpha: float | None = None,
                 default_alpha: float | None = None):
    """The policy ``name`` for ``model`` on ``layout`` with --alpha ``alpha`` (None: not given; ``default_alpha``
    for a policy that takes one), or one line (`MemoError`) where the what-if and the simulator refuse it: the
    policy's own answers (`Policy.needs_experts`, `Policy.model_why_not`, `Policy.layout_why_not`,
    `Policy.takes_alpha`) to the options given (a review: memplan planned recompute_moe for a dense model,
    recompute_mlp on METP and for a mixture of experts, and dropped an --alpha full_recompute takes none of)."""
    from memo_sim.policy import get_policy, policy_class  # noqa: PLC0415 - lazy

    cls = policy_class(name)
    if why := cls.experts_why_not(model):
        raise MemoError(f"--policy {why}; fix: choose another --policy")
    if why := cls.model_why_not(model):
        raise MemoError(f"--policy {name}: {why}; fix: choose another --policy")
    if layout is not None and (why := cls.layout_why_not(layout)):
        raise MemoError(f"--policy {name} on layout {layout.label()}: {why}")
    if alpha is not None and not cls.takes_alpha:
        raise MemoError(f"--alpha {alpha} sets MEMO's offloaded fraction, but --policy {name} takes none: drop "
                        f"--alpha or use --policy memo")
    return get_policy(name, (default_alpha if alpha is None else alpha) if cls.takes_alpha else None)


def progress_bar(label: str, total: int, quiet: bool = False, force: bool | None = None):
    """A click progress bar on stderr; returns a context manager yielding a step() callable.
    Silent when ``quiet`` (e.g. --json), when there is nothing to count, or when stderr is not a
    terminal (logs and pipes get no bar); ``force`` (``--progress/--no-progress``) overrides both."""
    @contextlib.contextmanager
    def cm():
        on = force if force is not None else (not quiet and sys.stderr.isatty())
        if not on or total == 0:
            yield lambda: None
            return
        with click.progressbar(length=total, label=label, file=sys.stderr) as bar:
            yield lambda: bar.update(1)
    return cm()


def status_line(label: str, quiet: bool = False, force: bool | None = None):
    """A one-line status on stderr for work that has stages rather than a count (a DSA solve's
    phases): a context manager yielding ``say(message)``, which rewrites the line in place on a
    terminal and writes one line per message when ``force`` asks for it off a terminal. Silent
    when ``quiet`` (e.g. --json) unless ``force``, and off a terminal unless ``force``."""
    @contextlib.contextmanager
    def cm():
        on = force if force is not None else (not quiet and sys.stderr.isatty())
        if not on:
            yield lambda msg: None
            return
        tty = sys.stderr.isatty()
        t0 = time.perf_counter()

        def say(msg: str) -> None:
            line = f"{label} [{time.perf_counter() - t0:6.1f} s] {' '.join(str(msg).split())}"
            if tty:
                sys.stderr.write("\r\x1b[K" + line[:200])
            else:
                sys.stderr.write(line + "\n")
            sys.stderr.flush()
        try:
            yield say
        finally:
            if tty:
                sys.stderr.write("\r\x1b[K")
                sys.stderr.flush()
    return cm()


def _alloc_conf_value(_ctx, _param, value):
    """--alloc-conf read at once (the text kept: the search merges it with the framework's), a bad one refused in one
    line naming the option, not the plan field ``alloc_conf`` the parser's words name (a review)."""
    if value:
        from memo_sim.layout.alloc_conf import parse_alloc_conf  # noqa: PLC0415

        try:
            parse_alloc_conf(value)
        except MemoError as e:
            raise MemoError("--alloc-conf: " + str(e).removeprefix("alloc_conf: ")) from None
    return value


def launch_options(f):
    """``--kernel-fusion``, ``--attention`` and ``--grad-overlap/--no-grad-overlap``: what a launch line sets over the
    framework's data (`memo_sim.search.whatif.launch_overrides`)."""
    from memo_sim.model.kernel_fusion import KERNEL_FUSIONS  # noqa: PLC0415
    from memo_sim.profile.attention_kernels import ATTENTION_KERNELS  # noqa: PLC0415
    for opts, kind, text in reversed((  # a decorator applied last is listed first: the help lists these in order
            (("--kernel-fusion",), click.Choice(list(KERNEL_FUSIONS)),
             "How the layers' norms, activations and residual adds run, over the framework's: fused (one "
             "hand-written kernel each, Megatron-LM / TransformerEngine), compiled (each block compiled by "
             "torch.compile) or eager (uncompiled PyTorch: RMSNorm and SwiGLU as separate tensor ops, as Hugging "
             "Face layers and torchtitan without --training.compile run them)."),
            (("--attention",), click.Choice(list(ATTENTION_KERNELS)),
             "The attention kernel every plan runs, over the framework's: flash (FlashAttention-2), cudnn (cuDNN's "
             "fused attention, TransformerEngine's; priced as flash on a profile without its curves), materialised "
             "(the s x s scores, Megatron-LM before FlashAttention) or flash_triton (FlashAttention's Triton kernel, "
             "Megatron-DeepSpeed's --use-flash-attn-triton; the A100 profiles give its curves)."),
            (("--grad-overlap/--no-grad-overlap", "grad_overlap"), None,
             "Reduce the data-parallel gradients in buckets beside the backward (Megatron-LM's --overlap-grad-reduce, "
             "DDP's and FSDP's default), or all after it (Megatron-LM without that option, its argument default). "
             "Default: the framework's data."))):
        f = click.option(*opts, default=None, type=kind, help=text)(f)
    return f


def headroom_option(f):
    """``--headroom SIZE|PERCENT``: GPU memory a search leaves free (`with_headroom`)."""
    return click.option(
        "--headroom", default=None, metavar="SIZE|PCT",
        help="GPU memory to leave free on every GPU, as a size (8GiB, 6GB) or a share of the profile's usable memory "
             "(10%): every plan must fit in what is left, MEMO's memory plan and the caching-allocator replay "
             "included (default: none; the written plan names the profile, whose checks and runs have it all).")(f)


def with_headroom(profile, text: str | None):
    """``profile`` with the --headroom ``text`` left free on each GPU (None: as it is); one line naming the option
    and the fix where ``text`` is not a size or a share below the usable memory."""
    if text is None:
        return profile
    usable = profile.usable_gpu_memory
    nbytes = parse_headroom(text, usable)
    if nbytes >= usable:
        raise MemoError(f"--headroom {text}: {fmt_bytes(nbytes)} leaves nothing of the {fmt_bytes(usable)} a GPU of "
                        f"{profile.name} has for tensors; give less (e.g. 10%)")
    return profile.with_headroom(nbytes)


def alloc_conf_option(f):
    return click.option(
        "--alloc-conf", default=None, metavar="TEXT", callback=_alloc_conf_value,
        help="PyTorch caching allocator settings as PYTORCH_CUDA_ALLOC_CONF writes them (expandable_segments, "
             "max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold with "
             "per_process_memory_fraction), over the framework's; priced for the plans without a memory plan.")(f)


class _ProgressOption(click.Option):
    """``--progress/--no-progress``, whose help names --json only on a command that has it: the default is on when
    stderr is a terminal, and off under --json where the command has one (a review: ``memo-sim export -h`` said
    "unless --json" of a command with no --json)."""

    def get_help_record(self, ctx):
        has_json = any("--json" in p.opts for p in ctx.command.params)
        self.help = (f"Show progress on stderr (default: on a terminal"
                     f"{', unless --json or --format json, csv or md' if has_json else ''}).")
        return super().get_help_record(ctx)


def progress_option(f):
    return click.option("--progress/--no-progress", "progress", default=None, cls=_ProgressOption,
                        help="Show progress on stderr (default: on a terminal).")(f)


class MemoGroup(click.Group):
    """Turns MemoError and click's usage errors into a one-line message and exit code 2, an
    operating-system error (a read-only or full disk ...) into one line and exit code 1, and
    Ctrl-C into exit code 130 (files are written atomically, so nothing half-written is left)."""

    def make_context(self, info_name, args, parent=None, **extra):
        return parsed_or_one_line(
            lambda: super(MemoGroup, self).make_context(info_name, args, parent=parent, **extra),
            lambda line: click.echo(line, err=True))

    def invoke(self, ctx):
        try:
            return guarded(lambda: super(MemoGroup, self).invoke(ctx), lambda line: click.echo(line, err=True),
                           ctx.exit)
        except MemoError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(getattr(e, "exit_code", 2))  # NothingFits: 3
        except click.UsageError as e:
            click.echo(usage_line(e), err=True)
            ctx.exit(2)


class LazyMemoGroup(MemoGroup):
    """A `MemoGroup` whose commands are imported when one is invoked or listed: ``commands``
    maps each command's name to ``"module:attribute"``, so that a what-if imports only the
    modules it uses (not the engine's explain, the plots or the exporters). ``--help`` imports
    every command's module to show its short help (each command's own docstring)."""

    def __init__(self, *args, lazy_commands: dict[str, str], **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands)

    def list_commands(self, ctx) -> list[str]:
        return sorted({*self.lazy_commands, *self.commands})

    def get_command(self, ctx, name: str):
        if name not in self.commands and name in self.lazy_commands:
            import importlib

            module, attr = self.lazy_commands[name].split(":")
            cmd = getattr(importlib.import_module(module), attr)
            if cmd.name != name:
                raise RuntimeError(f"{self.lazy_commands[name]} is the command {cmd.name!r}, not {name!r}")
            self.add_command(cmd)
        return self.commands.get(name)


MAX_GPUS = MAX_DEGREE  # a cluster of more GPUs than this is a typo, not a plan
GPU_COUNT = click.IntRange(1, MAX_GPUS)


def plan_profile(plan_file, plan, override: str | None = None, has_flag: bool = True):
    """The profile a command runs ``plan`` (read from ``plan_file``) on: ``override`` (its --profile), else the plan's
    own, a profile that cannot be loaded refused in one line naming where it was given (an audit: explain, simulate,
    export and the sweeps said "profile 'h300' not found" naming neither the plan file nor its field); ``has_flag``:
    the command takes --profile, which the fix then names."""
    from memo_sim.profile.loader import load_profile  # noqa: PLC0415

    try:
        return load_profile(override or plan.profile)
    except MemoError as e:
        if override:
            raise type(e)(f"--profile: {e}") from None
        fix = "fix the plan's profile field" + (" or give --profile NAME" if has_flag else "")
        raise type(e)(f"{plan_file}: profile: {e}; {fix}") from None


def comma_items(text: str, flag: str, example: str) -> list[str]:
    """The items of a comma-separated option, stripped; an empty option or an empty item between commas is one
    `MemoError` naming ``flag`` and an ``example`` (the sweeps' lists, one rule: an audit found ``--alphas 0.1,``
    run, ``--seqs 2K,`` refused, ``--subseqs ''`` run the default and ``--alphas ''`` refused for its range)."""
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise MemoError(f"{flag}: empty; give comma-separated values like {example}")
    if not all(items):
        raise MemoError(f"{flag} {text!r}: an empty item between commas; give values like {example}")
    return items


class FiniteRange(click.FloatRange):
    """click's FloatRange without NaN (which passes its bounds: an audit found ``--alpha nan`` refused in the
    API's words, ``WhatifRequest.alpha``, instead of the option's)."""

    def convert(self, value, param, ctx):
        v = super().convert(value, param, ctx)
        if v != v:
            self.fail(f"{value!r} is not a number; give one in {self._describe_range()}", param, ctx)
        return v
DEGREE = click.IntRange(1, MAX_GPUS)
BATCH = click.IntRange(1, MAX_BATCH)  # sequences per replica (the plan's own cap)


def layout_degree_options(f):
    """--tp, --cp, --ulysses, --dp, --zero, --sp/--no-sp and --tp-mode: fix what the search would
    otherwise enumerate (the what-if's and maxseq's; `memo_sim.search.request.tp_flavours_asked`
    says which TP flavours an unset --tp-mode searches)."""
    from memo_sim.tp import TP_MODES

    for deco in reversed((
        click.option("--tp", type=DEGREE, help="Fix the tensor-parallel degree."),
        click.option("--cp", type=DEGREE, help="Fix the (ring) context-parallel degree."),
        click.option("--ulysses", type=DEGREE, help="Fix the Ulysses sequence-parallel degree."),
        click.option("--dp", type=DEGREE, help="Fix the data-parallel degree."),
        click.option("--zero", type=click.IntRange(0, 3), help="Fix the ZeRO stage."),
        click.option("--sp/--no-sp", default=None, help="Fix Megatron sequence parallelism on or off."),
        click.option("--tp-mode", default=None, type=click.Choice(list(TP_MODES) + ["all"]),
                     help="Tensor-parallel flavour: Megatron TP, METP for the FFN (metp_ffn), METP for the FFN and "
                          "the two-level MHA (metp), async TP (async_tp: Megatron TP+SP with its collectives "
                          "overlapped with the GEMMs, under a framework that runs it: torchtitan, compiled), or all "
                          "of them ranked together "
                          "(default: all; megatron when --tp is given, so --tp 8 asks about Megatron TP8)."),
    )):
        f = deco(f)
    return f


def moe_layout_options(f):
    """--ep, --etp, --moe-dispatcher and --moe-balance (the what-if's and maxseq's): a mixture of experts'
    degrees to fix and how its tokens are sent and fall on the expert ranks."""
    from memo_sim.layout.moe_dispatchers import DISPATCHER_NAMES

    for deco in reversed((
        click.option("--ep", type=DEGREE, help="Fix the expert-parallel degree (MoE models; default: searched)."),
        click.option("--etp", type=DEGREE,
                     help="Fix the expert tensor-parallel degree (MoE models; default: 1 or the TP degree)."),
        click.option("--moe-dispatcher", default="alltoall", show_default=True, type=click.Choice(list(DISPATCHER_NAMES)),
                     help="MoE token dispatcher: alltoall, allgather (Megatron-Core's --moe-token-dispatcher-type) or "
                          "deepep (--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep)."),
        click.option("--moe-balance", default="dropless", show_default=True, callback=moe_balance_option,
                     help="How routed tokens fall on the expert ranks: forced (every expert the same tokens: "
                          "torchtitan's debug.moe_force_load_balance), random (random router logits, uniform random "
                          "loads: Megatron-Core's --moe-router-force-load-balancing), "
                          "dropless (a uniform router's loads), capacity:F (each expert padded/dropped to F x its "
                          "share) or loads:FILE (dropless with a router's measured per-expert token counts, JSON, "
                          "one list per MoE layer)."),
    )):
        f = deco(f)
    return f


def refuse_plan_gemm_format(plan_file, plan, profile, profile_flag: bool = True) -> None:
    """A plan file whose GEMM format its profile's GPU does not run (no peak for it, or too old a compute capability:
    `memo_sim.cost.gemm_format.check_gemm_format`), refused in one line naming the plan's field and the fix, before
    anything is priced: the plan's format, not a flag given here (a review: explain and check-plan of an FP8 plan on an
    A100 said "add fp8 under gpu.peak_flops ... or --precision", flags those commands do not take). simulate, the
    sweeps, explain and check-plan run it; ``profile_flag``: the command takes --profile (explain and check-plan read
    the plan's own), which the fix then names."""
    from memo_sim.search.plan_check import gemm_format_problem  # noqa: PLC0415

    why = gemm_format_problem(plan, profile, profile_flag)  # the words the executor's contract refuses it with
    if why:
        raise MemoError(f"{plan_file}: {why}")


def refuse_unwritable_out(out_dir, command: str) -> None:
    """Fail now, before the work, where --out cannot be written: one line naming --out, exit status 2. The check is
    the write's own (`memo_sim.fileio.OutputFolder` creates its stage where `commit` writes: inside --out, or beside
    it where the command creates it) and the stage is removed at once, so a refused or later-failing command leaves
    nothing behind. Every command that does long work before it writes --out calls it first (whatif, export, the
    sweeps; README: an unwritable --out "is refused before the work")."""
    from memo_sim.fileio import OutputFolder  # noqa: PLC0415

    OutputFolder(out_dir, command).discard()
