"""The spellings of ``--device`` each memo-exec command takes, and their words in a help or an error (torch-free:
the command line's help and its refusals read them before torch is imported; `memo_exec.device.check_device_name`
checks a spelling against them)."""

from __future__ import annotations

DEVICE_FORMS = ("auto", "cpu", "cuda", "cuda:N")  # run, validate, calibrate (N: a GPU index, 0, 1, ...)
TRACE_FORMS = ("meta",) + DEVICE_FORMS  # memo-exec trace records on meta by default
AUTO_WORDS = "default auto: cuda if available, else cpu"


def device_forms_text(forms: tuple[str, ...] = DEVICE_FORMS) -> str:
    """``forms`` as the words of a --device help or error ("auto, cpu, cuda or cuda:N (N: a GPU index ...)")."""
    words = f"{', '.join(forms[:-1])} or {forms[-1]}" if len(forms) > 1 else forms[0]
    return words + (" (N: a GPU index, 0, 1, ...)" if "cuda:N" in forms else "")
