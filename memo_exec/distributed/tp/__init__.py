"""Tensor-parallel flavours, keyed by `memo_sim.layout.parallel.Layout.tp_mode`.

A flavour is a class registered with ``@register_tp("name")`` (see `base.TPFlavour` for what it
receives and must provide). Flavours are discovered, not listed: `flavour_for` imports every
module of this package and of the packages in ``PLUGIN_PACKAGES`` (``memo_exec.metp``,
``memo_exec.sppo``) once, so a new flavour is a new module in one of them, never an edit here.
``megatron`` (Megatron-LM column/row parallelism, with or without its sequence parallelism) is
`megatron.MegatronTP`. A plan whose ``tp_mode`` has no registered flavour is refused before
anything is allocated.
"""

from __future__ import annotations

import importlib
import pkgutil

from memo_exec.errors import ExecError

PLUGIN_PACKAGES = ("memo_exec.distributed.tp", "memo_exec.metp", "memo_exec.sppo")

_REGISTRY: dict[str, type] = {}
_BROKEN: dict[str, str] = {}  # plugin module -> why it did not import
_discovered = False


def register_tp(name: str):
    """Class decorator: run plans whose ``layout.tp_mode`` is ``name`` with this flavour."""
    def deco(cls):
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"TP flavour {name!r} registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return deco


def discover() -> None:
    """Import every module of the plugin packages (each registers what it defines)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for pkg_name in PLUGIN_PACKAGES:
        try:
            pkg = importlib.import_module(pkg_name)
        except ModuleNotFoundError as e:
            if e.name == pkg_name:  # the package does not exist (yet)
                continue
            raise
        for info in pkgutil.iter_modules(getattr(pkg, "__path__", []), pkg_name + "."):
            if pkg_name == __name__:
                importlib.import_module(info.name)
                continue
            try:  # another part's module that does not import must not stop Megatron plans
                importlib.import_module(info.name)
            except Exception as e:  # noqa: BLE001 - reported when its flavour is asked for
                _BROKEN[info.name] = f"{type(e).__name__}: {e}"


def registered() -> tuple[str, ...]:
    discover()
    return tuple(sorted(_REGISTRY))


def flavour_for(tp_mode: str) -> type:
    """The registered flavour class for ``tp_mode`` (ExecError naming the field otherwise)."""
    discover()
    try:
        return _REGISTRY[tp_mode]
    except KeyError:
        broken = f" (modules that did not import: {'; '.join(f'{k}: {v}' for k, v in _BROKEN.items())})" \
            if _BROKEN else ""
        raise ExecError(f"layout.tp_mode {tp_mode!r}: the executor runs {', '.join(sorted(_REGISTRY))}; "
                        f"plan with tp_mode megatron{broken}") from None
