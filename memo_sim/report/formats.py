"""Output formats of every command that prints tables: ``--format table|json|csv|md``.

A command builds its answer as a verdict line, notes and `Table`s and hands them to `emit`,
which writes them in the asked format: the terminal's aligned text (`render_table`), CSV (one
block per table, a ``# title`` line before each, the answer's other lines as ``#`` lines where the text prints
them; a column of numbers as numbers in one unit named in its header,
to the digits the table prints, a missing one empty: `csv_numbers`; JSON carries the numbers exact) or Markdown
(a heading and a pipe table per table). JSON is the command's own object (``--json`` stays an alias of
``--format json``).
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field

import click

from memo_sim.report.table import render_table
from memo_sim.units import fmt_params  # noqa: F401  (re-exported: the reports' one parameter-count format)

FORMATS = ("table", "json", "csv", "md")


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    title: str = ""


@dataclass
class Answer:
    """What a command prints: a one-line verdict first, then tables and notes in order."""

    verdict: str = ""
    parts: list = field(default_factory=list)  # str (a line of text) or Table

    def line(self, text: str) -> None:
        self.parts.append(text)

    def table(self, headers: list[str], rows: list[list[str]], title: str = "") -> None:
        self.parts.append(Table(headers, rows, title))


def format_options(f):
    """``--format`` and its alias ``--json``, appended to a command's options."""
    f = click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON (same as --format json).")(f)
    f = click.option("--format", "out_format", default="table", show_default=True, type=click.Choice(FORMATS),
                     help="Output format: aligned text (table), JSON, CSV or Markdown (md).")(f)
    return f


def resolve_format(out_format: str, as_json: bool) -> str:
    """The output format asked: ``--json`` is ``--format json``; with another ``--format`` beside it, one line."""
    if as_json and out_format not in ("table", "json"):
        from memo_sim.errors import MemoError  # noqa: PLC0415

        raise MemoError(f"--json and --format {out_format} ask for two formats; give one of them")
    return "json" if as_json else out_format


def render(answer: Answer, fmt: str) -> str:
    """The answer as text in ``fmt`` (table, csv or md)."""
    out: list[str] = []
    if fmt == "csv":
        out += _csv_comments(answer.verdict or "")
        for p in answer.parts:
            if isinstance(p, Table):
                buf = io.StringIO()
                w = csv.writer(buf, lineterminator="\n")
                headers, rows = csv_numbers(p.headers, p.rows)
                w.writerow([_csv_header(h) for h in headers])
                w.writerows(rows)
                out += _csv_comments(p.title)
                out.append(buf.getvalue().rstrip("\n"))
            else:  # a line of the answer, where the table format prints it (a review: whatif --train-tokens lost it)
                out += _csv_comments(p)
        return "\n".join(out)
    if fmt == "md":
        if answer.verdict:
            out.append(f"**{answer.verdict}**\n")
        for p in answer.parts:
            if isinstance(p, Table):
                if p.title.strip():
                    out.append(f"\n{p.title.strip()}")
                out.append("\n" + markdown_table(p.headers, p.rows) + "\n")
            else:
                out.append(p)
        return "\n".join(out)
    if answer.verdict:
        out.append(answer.verdict)
    for p in answer.parts:
        if isinstance(p, Table):
            if p.title:
                out.append(p.title)
            out.append(render_table(p.headers, p.rows))
        else:
            out.append(p)
    return "\n".join(out)


# a table cell's number with its unit, as `memo_sim.units` prints them: the CSV's column in one unit
_CELL = re.compile(r"\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)\s*(us|ms|s|B|KiB|MiB|GiB|TiB|%)\s*")
_PLAIN = re.compile(r"\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)\s*")  # a number without a unit (a count, TGS, alpha)
_MISSING = ("", "-")  # how a table cell says "no number" (`memo_sim.report.sweep_text.run_cells`, the what-if's rows)
_BASE = {"us": ("s", 1e-6), "ms": ("s", 1e-3), "s": ("s", 1.0), "B": ("bytes", 1), "KiB": ("bytes", 1024),
         "MiB": ("bytes", 1024**2), "GiB": ("bytes", 1024**3), "TiB": ("bytes", 1024**4), "%": ("%", 1.0)}
_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")  # smallest first; ``B`` is written ``bytes`` in a header


def _significant(digits: str) -> int:
    """The significant digits of a printed number (``102.44`` -> 5, ``0.50`` -> 2, ``512`` -> 3)."""
    return max(1, len(digits.replace("-", "").replace(".", "").lstrip("0")))


def csv_numbers(headers: list[str], rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """A table's columns whose every value is a number with a unit (``53.98 ms``, ``2.63 s``; ``4.13 GiB``;
    ``45.3%``) as plain numbers in one unit, named in the header (``iter (s)``, ``peak GPU (GiB)``, ``MFU (%)``):
    a CSV reader gets numbers, not the aligned table's words. A column of numbers without a unit loses its
    thousands separators. A missing number (``-``) is an empty cell in every number column, with or without a
    unit. The numbers are the table's, to its printed digits (``--json`` carries them exact): the tables hold
    text (`Table`), so a byte column is written in the largest binary unit its cells print (``4.13 GiB`` stays
    4.13, ``102.44 MiB`` beside it is 0.10004 GiB: its own significant digits), never as an integer of bytes
    the printed digits do not hold (a review: 2.12 GiB was written 2276332667 where the JSON says 2275605504)."""
    out = [list(r) for r in rows]
    heads = list(headers)
    for j in range(len(headers)):
        cells = [str(r[j]) for r in rows if j < len(r) and str(r[j]).strip() not in _MISSING]
        if cells and all(_PLAIN.fullmatch(c) for c in cells):
            for r in out:
                if j < len(r):
                    m = _PLAIN.fullmatch(str(r[j]))
                    r[j] = m.group(1).replace(",", "") if m else ""
            continue
        matched = [_CELL.fullmatch(c) for c in cells]
        units = {_BASE[m.group(2)][0] for m in matched if m}
        if not matched or not all(matched) or len(units) != 1:
            continue
        unit = units.pop()
        if unit == "bytes":  # the largest unit printed in the column
            col = max((m.group(2) for m in matched), key=_BYTE_UNITS.index)
            heads[j] = f"{headers[j]} ({'bytes' if col == 'B' else col})"
        else:
            heads[j] = f"{headers[j]} ({unit})"
        for r in out:
            m = _CELL.fullmatch(str(r[j])) if j < len(r) else None
            if not m:
                if j < len(r):
                    r[j] = ""
                continue
            digits = m.group(1).replace(",", "")
            v = float(digits) * _BASE[m.group(2)][1]
            if unit != "bytes":
                r[j] = f"{v:.6g}" if unit == "s" else f"{v:g}"
            elif m.group(2) == col:
                r[j] = digits
            else:
                r[j] = f"{v / _BASE[col][1]:.{_significant(digits)}g}"
    return heads, out


def _csv_comments(text: str) -> list[str]:
    """A text part of the answer as CSV comment lines, as the verdict and each table's title are written: ``# `` before
    each of its lines, indentation kept, blank lines dropped (a CSV reader that skips ``#`` lines, e.g. pandas'
    ``comment="#"``, reads the tables alone)."""
    return [f"# {ln.rstrip()}" for ln in str(text).splitlines() if ln.strip()]


def _csv_header(h: str) -> str:
    """A CSV column name: the rank column's ``#`` reads ``rank`` (a header starting with ``#`` is what a CSV
    reader that skips the ``# title`` comment lines drops with them)."""
    return "rank" if h.strip() == "#" else h


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    def cell(c: str) -> str:
        return str(c).replace("|", "\\|")
    lines = ["| " + " | ".join(cell(h) or " " for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def plural(n: int, word: str, words: str | None = None) -> str:
    """``1 candidate``, ``2 candidates``."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def emit(answer: Answer, fmt: str, obj: dict | list | None = None) -> None:
    """Print the answer: ``obj`` as JSON for ``json``, else the rendered answer."""
    if fmt == "json":
        click.echo(json.dumps(obj, indent=1))
    else:
        click.echo(render(answer, fmt))
