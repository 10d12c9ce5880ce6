"""Errors a user can fix. The CLI prints them as one line and exits with code 2."""

import os
import signal
import threading


class MemoError(Exception):
    """Bad input or an impossible request; the message names the field and the fix."""


class NothingFits(MemoError):
    """A valid request no candidate fits: every layout the degrees allow holds more than the GPU (the
    what-if's exit status 3, as when its candidates are all over memory; 2 stays bad input)."""

    exit_code = 3


class ProfileError(MemoError):
    """A hardware profile file is malformed."""


class PlanError(MemoError):
    """A plan.json file is malformed or of an unknown schema version."""


class TraceError(MemoError):
    """A request trace (JSON) or a static-allocation CSV is malformed."""


def usage_line(e) -> str:
    """A click usage error (bad flag value, unknown option) as one line naming the flag and the fix."""
    msg = " ".join(e.format_message().split()).rstrip(".")
    cmd = e.ctx.command_path if e.ctx is not None else "the command"
    return f"error: {msg}{_value_hint(e, msg)}; see `{cmd} -h`"


def _value_hint(e, msg: str) -> str:
    """'' or the fix of a bad flag value: the nearest choice to a mistyped one (``--framework megatorn``), and
    that a batch counts sequences where a token count was given (``--global-batch 4M``)."""
    import difflib
    import re

    import click

    param = getattr(e, "param", None)
    kind = getattr(param, "type", None)
    if isinstance(kind, click.Choice):
        typed = re.search(r"'([^']*)' is not one of", msg)
        near = difflib.get_close_matches(typed.group(1), [str(c) for c in kind.choices], n=1, cutoff=0.6) if typed \
            else []
        return f"; did you mean {near[0]!r}" if near else ""
    if isinstance(kind, click.IntRange) and "batch" in (param.name or "") and re.search(r"'[\d.]+\s*[kKmMgG]'", msg):
        return f"; --{param.name.replace('_', '-')} counts sequences, not tokens (e.g. 256)"
    return ""


def parsed_or_one_line(make, say):
    """``make()`` (a click group's ``make_context``), a usage error of the group's own options
    (``memo-sim --bogus``) written as its commands' are: one line (``say(line)``), exit code 2 (click
    printed its usage, a hint and "Error: ..." on four lines). No arguments at all: click's help."""
    import click

    try:
        return make()
    except click.UsageError as e:
        if isinstance(e, getattr(click.exceptions, "NoArgsIsHelpError", ())):
            raise
        say(usage_line(e))
        raise SystemExit(2) from None


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (``kill``, a scheduler's stop, a closed terminal) raised as Ctrl-C is, so that the same
    clean-up runs: a staging folder discarded, a launcher's ranks stopped (a review: ``timeout`` sent SIGTERM to
    ``memo-exec run --nproc 2``, whose ranks ran on as orphans, and to a run that left its staging folder)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


TERMINATING = ("SIGTERM", "SIGHUP")
# the variables torchrun sets on its ranks: a rank keeps the default action, which its launcher reads as a rank
# killed by a signal (`memo_exec.distributed.launch.killed_rank`)
RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def _raise_terminated(installer: int):
    def handler(signum, frame):
        if os.getpid() != installer:  # a forked worker of this process (a pool's): the default action, as before
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Terminated(signum)

    return handler


def _catch_termination() -> dict:
    """Install `Terminated` for the signals of `TERMINATING` left at their default action, in the main thread of a
    process that is not a torchrun rank; returns the handlers to restore."""
    if threading.current_thread() is not threading.main_thread() or all(k in os.environ for k in RANK_ENV):
        return {}
    before = {}
    for name in TERMINATING:
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) == signal.SIG_DFL:
            before[sig] = signal.signal(sig, _raise_terminated(os.getpid()))
    return before


def guarded(run, say, leave):
    """``run()``, with Ctrl-C as the line ``interrupted`` and exit code 130, SIGTERM and SIGHUP as the line
    ``terminated (SIGTERM)`` and exit code 128 + the signal (`Terminated`: the clean-up of Ctrl-C runs), and an
    operating-system error as one line and exit code 1 (``say(line)`` writes a line, ``leave(code)`` exits): what
    both command-line tools promise for every command."""
    before = _catch_termination()
    try:
        return run()
    except Terminated as e:
        say(f"terminated ({signal.Signals(e.signum).name})")
        leave(128 + e.signum)
    except KeyboardInterrupt:
        say("interrupted")
        leave(EXIT_INTERRUPTED)
    except BrokenPipeError:  # the reader of our output went away (`| head`): click leaves quietly
        raise
    except OSError as e:
        say(environment_error_line(e))
        leave(1)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def environment_error_line(e: OSError) -> str:
    """An operating-system error (read-only or full disk, missing folder, permission) as one line."""
    where = f"{e.filename}: " if getattr(e, "filename", None) else ""
    return f"error: {where}{e.strerror or e}; check the path, its permissions and free space"


# -- the one boundary: pydantic's errors as one line ---------------------------------------------------
_FIXES = {
    "missing": "add it",
    "extra_forbidden": "remove it or check the spelling",
    "finite_number": "write a finite number",
    "float_type": "write a plain number",
    "float_parsing": "write a plain number",
    "int_type": "write a whole number",
    "int_parsing": "write a whole number",
    "int_from_float": "write a whole number",
    "bool_type": "write true or false",
    "string_type": "write a string",
    "string_too_short": "write a non-empty string",
    "literal_error": "use one of the values named",
    "enum": "use one of the values named",
    "dict_type": "write a mapping of fields",
    "model_type": "write a mapping of fields",
    "dataclass_type": "write a mapping of fields",
    "list_type": "write a list",
    "tuple_type": "write a list",
    "too_short": "give more items",
    "too_long": "give fewer items",
    "greater_than": "use a larger value",
    "greater_than_equal": "use a larger value",
    "less_than": "use a smaller value",
    "less_than_equal": "use a smaller value",
}


def _loc_text(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith(("function-", "tagged-union")) or part in ("int", "float", "str", "none"):
            continue  # pydantic's internal step names, not fields
        else:
            out += ("." if out else "") + str(part)
    return out or "(top)"


def _did_you_mean(source: str, where: str, name) -> str:
    """An unknown field's line, naming the known field it is nearest to."""
    line = f"{where}: unknown field; did you mean {str(name)!r}?"
    return f"{source}: {line}" if source else line


def validation_message(err, source: str, drop: int = 0, known: tuple[str, ...] = ()) -> str:
    """The first error of a pydantic ``ValidationError`` as one line: ``source: field: problem,
    got X; fix``. Messages of our own validators already carry their fix after a ``;``. ``drop``:
    leading parts of the error's location to leave out (a row index the source already names). ``known``: the
    top level's field names, of which the nearest is named for an unknown top-level field (a review: ``topk`` got
    no hint, top_k being optional, where a misspelt required field got one)."""
    errors = err.errors(include_url=False)
    e = errors[0]
    loc0 = tuple(e.get("loc", ()))
    if e.get("type") == "extra_forbidden" and known and len(loc0) == drop + 1:
        import difflib  # noqa: PLC0415

        near = difflib.get_close_matches(str(loc0[-1]), known, n=1, cutoff=0.75)
        if near:
            return _did_you_mean(source, _loc_text(loc0[drop:]), near[0])
    if e.get("type") == "missing":  # a misspelt field reads as a missing one beside an unknown one: name the typo
        import difflib  # noqa: PLC0415

        loc = tuple(e.get("loc", ()))
        for x in errors:
            xl = tuple(x.get("loc", ()))
            if (x.get("type") == "extra_forbidden" and xl[:-1] == loc[:-1] and loc
                    and difflib.get_close_matches(str(xl[-1]), [str(loc[-1])], n=1, cutoff=0.75)):
                return _did_you_mean(source, _loc_text(xl[drop:]), loc[-1])
    kind = e.get("type", "")
    msg = {"missing": "missing field", "extra_forbidden": "unknown field"}.get(
        kind, str(e.get("msg", "invalid")).replace("\n", " "))
    if kind in ("model_type", "dataclass_type", "dict_type"):  # not pydantic's words, which name our classes
        got = e.get("input")
        msg = "must be a mapping of fields" + (f", got a {type(got).__name__}" if got is not None else ", got null")
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    if "; " not in msg and e.get("type") != "value_error":
        got = e.get("input")
        if (e.get("type") not in ("missing", "extra_forbidden", "model_type", "dataclass_type", "dict_type")
                and not isinstance(got, (dict, list))):  # (a mapping's own words name what came: a review's "got
            # null, got None")
            shown = repr(got)
            msg += f", got {shown[:40] + '...' if len(shown) > 40 else shown}"
        fix = _FIXES.get(e.get("type", ""))
        if fix:
            msg += f"; {fix}"
    where = _loc_text(tuple(e.get("loc", ()))[drop:])
    if where == "(top)":  # the whole input: the source names it (an audit: "FILE: (top): hidden (250) must ...")
        return f"{source}: {msg}" if source else msg
    return f"{source}: {where}: {msg}" if source else f"{where}: {msg}"


def validated(model, raw, source: str, error: type[MemoError] = MemoError):
    """``model.model_validate(raw)`` (a pydantic model or TypeAdapter), a failure raised as
    ``error`` with one line naming ``source``, the field and the fix."""
    from pydantic import TypeAdapter, ValidationError

    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python(raw)
        return model.model_validate(raw)
    except ValidationError as e:
        fields = getattr(model, "model_fields", None) or {}
        known = tuple(dict.fromkeys([*fields, *(f.alias for f in fields.values() if getattr(f, "alias", None))]))
        raise error(validation_message(e, source, known=known)) from None
    except RecursionError:
        raise error(f"{source}: nested too deeply; write a plain mapping of fields") from None
