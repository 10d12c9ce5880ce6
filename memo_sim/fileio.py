"""Atomic file writes: a failed run never leaves a half-written plan, trace or report."""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import yaml

from memo_sim.errors import MemoError

# libyaml's parser where PyYAML was built with it (the same documents, about 9x faster on the framework
# and profile files every command reads at start-up), else PyYAML's own
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class NotAFileError(MemoError):
    """An output path that names something other than a regular file (a device, a named pipe, a socket): the
    atomic write (a temporary file renamed over it) would replace that node with a file, so it is refused."""


def _kind(mode: int) -> str | None:
    """What a file of ``mode`` (``st_mode``) is, in words, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, words in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                        (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


def write_target(path: str | os.PathLike) -> tuple[Path, str | None]:
    """``(the file a write of path replaces, why that is refused or None)``, changing nothing. A symbolic link is
    followed (``os.path.realpath``) and its target is written, the link kept, as ``open(path, "w")`` would (a
    review: ``--out link.json`` replaced the link with a file and left its target as it was); a link that loops is
    refused. An existing target that is not a regular file (a folder, a device such as a copy of /dev/null, a named
    pipe, a socket) is refused: the rename of `atomic_write_bytes` would replace that node with a plain file (a
    review: ``--out fakenull``, a character device, became a regular file)."""
    p = Path(path)
    if os.path.islink(p):
        p = Path(os.path.realpath(p))
        if os.path.islink(p):  # realpath stops at a link it cannot resolve (a loop)
            return p, "is a symbolic link that loops; give the path of a file"
    try:
        mode = os.stat(p).st_mode
    except OSError:  # not there yet (the write creates it), or unreachable (the write says why, naming it)
        return p, None
    kind = _kind(mode)
    if kind is None:
        return p, None
    if kind == "a folder":
        return p, "is a folder; give the path of a file"
    return p, (f"is {kind}, not a regular file; memo writes an output by renaming a new file over the old one, "
               f"which would replace it: give the path of a regular file")


def check_output_file(path: str | os.PathLike, field: str, fix: str = "") -> Path:
    """Refuse, before any work and writing nothing (as root, an empty probe file made and removed in the first
    existing folder on the way, `_root_can_create_in`), an output file that `atomic_write_bytes` could not write: one
    line naming ``field`` (the option, e.g. ``--report``) and the fix (``fix`` added to it, e.g. "or pass
    --no-record"): a target that is not a regular file (`write_target`), or a folder on the way that is a file or
    that this process cannot write in (``os.access``: no permission, or a read-only mount). Returns the file a write
    replaces."""
    target, why = write_target(path)
    if why:
        raise NotAFileError(f"{field} {path}: {why}{fix}")
    folder = target.parent
    while not folder.exists() and folder != folder.parent:  # the first folder there: the write creates the rest
        folder = folder.parent
    if not folder.is_dir():
        raise MemoError(f"{field} {path}: cannot write there ({folder} is a file, not a folder); choose a path you "
                        f"can write{fix}")
    if not os.access(folder, os.W_OK | os.X_OK) or not _root_can_create_in(folder):
        raise MemoError(f"{field} {path}: cannot write there ({folder} is read-only or not ours to write in); "
                        f"choose a path you can write{fix}")
    return target


def _root_can_create_in(folder: Path) -> bool:
    """``os.access`` answers yes to root for any folder, /proc and /sys included, where no file can be made (a review:
    `memo-exec trace --out /proc/nope/x.json` failed after recording its trace). As root, create and remove one
    empty file there to find out; otherwise `os.access` already answered."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return True
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".memo-write-probe-")
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def check_output_folder(out: str | os.PathLike, field: str) -> None:
    """Refuse, before any work and creating nothing, an output folder that cannot be made or written: one line
    naming ``field`` in the words of `OutputFolder`'s own check (which probes by creating its stage, so a command
    that checks its files first leaves nothing behind when one of them is refused)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise MemoError(f"{field} {out}: exists and is not a folder; choose a folder")
    folder = out
    while not folder.exists() and folder != folder.parent:  # the first folder there: the command creates the rest
        folder = folder.parent
    why = (f"{folder} is a file, not a folder" if not folder.is_dir() else
           None if os.access(folder, os.W_OK | os.X_OK) else f"{folder} is read-only or not ours to write in")
    if why:
        raise MemoError(f"{field} {out}: cannot write there ({why}); choose a folder you can write")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same folder and a rename; the file
    gets the permissions a plain ``open`` would give it (0666 less the umask). A symbolic link's target is
    written (the link kept); a path that is not a regular file is refused (`write_target`): a folder with the
    operating system's error (IsADirectoryError), a device, named pipe or socket with `NotAFileError`, before
    anything is written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    target, why = write_target(path)
    if why and os.path.isdir(target):  # as the rename would fail over it, naming the path asked for
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if why:
        raise NotAFileError(f"{path}: {why}")
    if target != path:  # a link: write its target, in the target's folder (the rename stays on one file system)
        try:
            _atomic_write(target, data)
        except OSError as e:
            raise _named(e, path) from None
        return path
    return _atomic_write(path, data)


def _atomic_write(path: Path, data: bytes) -> Path:
    """The temporary file in ``path``'s folder, written, synced and renamed over ``path``."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise _named(e, path) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and e.errno is not None:  # the file asked for, not the temporary one
            raise _named(e, path) from None
        raise
    return path


def _named(e: OSError, path: str | os.PathLike) -> OSError:
    """``e`` (an operating-system error) naming ``path``: its errno's class (PermissionError, ...), its words."""
    return OSError(e.errno, e.strerror or str(e), str(path))


def read_utf8(path: str | os.PathLike, error: type[MemoError] = MemoError) -> str:
    """A text file's contents as UTF-8 (a leading byte-order mark is dropped). A file that is not
    UTF-8 raises ``error`` naming the file and the first bad byte; a missing one FileNotFoundError."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None


class DuplicateKeyError(yaml.YAMLError):
    """A key given twice in one mapping of a YAML document: ``args`` its dotted path and the lines of both."""

    def __str__(self) -> str:
        where, lines = self.args
        return f"{where} is given twice{lines}; YAML keeps the last one silently: delete one of them"


_MERGE = "tag:yaml.org,2002:merge"


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` of ``text`` (libyaml's safe loader where present); raises `yaml.YAMLError`, and
    `DuplicateKeyError` where one mapping gives a key twice (YAML keeps the last silently, hiding the value a
    reader of the file sees first: a review's profile with ``hbm_bandwidth`` twice)."""
    loader = _SAFE_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_twice(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _refuse_twice(root: yaml.Node) -> None:
    """Raise `DuplicateKeyError` at the first mapping of the composed document ``root`` that gives a scalar key
    twice (merge keys aside)."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, where = stack.pop()
        if id(node) in seen:  # an alias of a node walked already
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            inner = []
            for k, v in node.value:
                key = (k.tag, k.value) if isinstance(k, yaml.ScalarNode) and k.tag != _MERGE else None
                path = f"{where}.{k.value}" if where and key else (str(k.value) if key else where)
                if key is not None and key in first:
                    raise DuplicateKeyError(path, f" (lines {first[key]} and {k.start_mark.line + 1})")
                if key is not None:
                    first[key] = k.start_mark.line + 1
                inner.append((v, path))
            stack.extend(reversed(inner))  # the file's order: the first mapping with a key twice is named
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(reversed([(v, f"{where}[{i}]") for i, v in enumerate(node.value)]))


def read_json(path: str | os.PathLike, error: type[MemoError] = MemoError, what: str = "file") -> Any:
    """A UTF-8 JSON file's contents; a missing file or bad JSON raises ``error`` in one line."""
    try:
        return json.loads(read_utf8(path, error))
    except FileNotFoundError:
        raise error(f"{path}: no such {what}; check the path") from None
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg}: line {e.lineno}, column {e.colno}); fix the file there, or "
                    f"write it again with the command that made it") from None
    except RecursionError:
        raise error(f"{path}: nested too deeply to be a {what}; check the file") from None


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=False) + "\n")


def save_png(fig: Any, path: str | os.PathLike, dpi: int = 120, tight: bool = True) -> Path:
    """Render a matplotlib figure to PNG in memory (cropped to its content unless ``tight`` is
    false), then write it atomically."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight" if tight else None)
    return atomic_write_bytes(path, buf.getvalue())


MANIFEST = "manifest.json"  # written last into a command's --out: the list of files that belong together


class OutputFolder:
    """A command's outputs, written as one set (`output_folder`).

    ``stage`` is a fresh folder (``.NAME.XXXX.partial``) in the folder `commit` writes: inside ``out`` where it
    exists, else beside it (where `commit` creates it), so that creating it before any work tests exactly the
    place the set goes (an ``out`` that cannot be written, or that has clearly too little free space for
    ``need_bytes``, fails at once: one line naming --out, exit status 2; a read-only parent of a writable
    ``out`` does not matter) and every move is within one file system. The command writes there; `commit`
    first marks ``out``'s manifest ``"complete": false`` (an interrupt from here on leaves a folder that says it
    is incomplete), moves each staged file into ``out`` (``os.replace``: atomic per file) and writes the new
    manifest, complete, last; an operating-system error there (a folder where a file goes) is one line naming
    --out and the file, exit status 2. A failure or interrupt before `commit` removes the stage and leaves
    ``out``'s files exactly as they were (a caller that keeps a failed stage, memo-exec's launcher, keeps it hidden
    in ``out``)."""

    def __init__(self, out: str | os.PathLike, command: str, need_bytes: int = 0) -> None:
        self.out = Path(out)
        self.command = command
        self.removed: list[str] = []  # the earlier outputs `commit` removed (`_earlier`)
        if self.out.exists() and not self.out.is_dir():
            raise MemoError(f"--out {self.out}: exists and is not a folder; choose a folder")
        # the one folder `commit` writes: --out, or where it creates --out (a review: the stage beside an existing
        # read-only --out passed this check, and the run failed after its work naming a temporary file)
        where = self.out if self.out.is_dir() else self.out.parent
        try:
            where.mkdir(parents=True, exist_ok=True)
            self.stage = Path(tempfile.mkdtemp(prefix=f".{self.out.name or 'out'}.", suffix=".partial", dir=where))
        except OSError as e:  # the user's choice of folder, checked before any work: bad input
            # a file on the way (afile/sub): mkdir says "File exists" of it; say which path is a file
            file = next((p for p in (where, *where.parents) if p.exists() and not p.is_dir()), None)
            why = f"{file} is a file, not a folder" if file is not None else (e.strerror or e)
            raise MemoError(f"--out {self.out}: cannot write there ({why}); choose a folder you can write") from None
        self._check_space(need_bytes)

    def _check_space(self, need_bytes: int) -> None:
        """Refuse before any work when the file system holding ``out`` has clearly less room than
        the outputs' estimate (``need_bytes``, a lower estimate: a refusal is never a false alarm)."""
        if need_bytes <= 0:
            return
        free = disk_free_bytes(self.stage)
        if free is not None and free < need_bytes:
            self.discard()
            raise MemoError(f"--out {self.out}: {free:,} bytes free there and the outputs take at least "
                            f"{need_bytes:,} bytes; free some space or choose another folder")

    def path(self, staged: str | os.PathLike) -> Path:
        """Where a staged file ends up once committed."""
        return self.out / Path(staged).name

    def commit(self) -> list[Path]:
        """Move the staged set into ``out`` (the moved paths); `removed` lists the earlier outputs removed. An
        empty stage still removes this command's earlier outputs (a what-if that found no plan leaves no earlier
        plan.json to be simulated for it), and leaves a folder with none of them untouched."""
        entries = sorted(self.stage.iterdir())
        previous = _manifest(self.out / MANIFEST)
        if not entries and not self._earlier(previous, set(), remove=False)[1]:
            self.discard()
            return []
        try:
            return self._commit(entries, previous)
        except OSError as e:  # writing into the user's folder (a folder where a file goes, read-only): bad input
            raise MemoError(f"--out {self.out}: cannot write {e.filename or self.out} ({e.strerror or e}); "
                            f"{_write_fix(e)}") from None

    def _commit(self, entries: list[Path], previous: dict | None) -> list[Path]:
        import shutil

        self.out.mkdir(parents=True, exist_ok=True)
        for f in entries:  # a folder where a file goes (or a file where a folder goes): refused before any move
            dest = self.out / f.name
            if dest.is_dir() != f.is_dir() and (dest.exists() or dest.is_symlink()):
                code = errno.EISDIR if dest.is_dir() else errno.ENOTDIR
                raise OSError(code, os.strerror(code), str(dest))
        # from here until the new manifest, --out is a mix of old and new files: say so in it
        atomic_write_json(self.out / MANIFEST, {"command": self.command, "complete": False, "files": []})
        moved = []
        for f in entries:  # files, and folders of files (a folder replaces the one of the same name)
            dest = self.out / f.name
            if f.is_dir() and dest.is_dir():
                shutil.rmtree(dest)
            try:
                os.replace(f, dest)
            except OSError as e:
                raise _named(e, dest) from None
            moved.append(dest)
        files = [p for d in moved for p in ([d] if d.is_file() else sorted(d.rglob("*"))) if p.is_file()]
        names = {str(p.relative_to(self.out)) for p in files}
        kept, removed = self._earlier(previous, names)
        self.removed = removed
        atomic_write_json(self.out / MANIFEST, {
            "command": self.command, "options": _invoked_options(), "written_utc": _utc_now(), "complete": True,
            "files": [_entry(self.out, p, self.command) for p in files] + kept,
            **({"removed_stale": removed} if removed else {})})
        self.discard()
        return moved

    def _earlier(self, previous: dict | None, written: set[str],
                 remove: bool = True) -> tuple[list[dict], list[str]]:
        """What the folder's previous manifest listed and this set did not rewrite: an earlier output of this
        same command (a figure another option set made), untouched since it was written (its size and
        modification time as the manifest recorded them), is stale and removed, so that one command's re-run
        leaves its own outputs only; a file changed since (a hand-edited plan), another command's, or one whose
        path leaves the folder, is never removed: listed as it is, with its command. ``remove=False``: the same
        lists, nothing removed."""
        if not previous:
            return [], []
        kept, removed = [], []
        root = self.out.resolve()
        for e in previous.get("files") or []:
            name = e.get("name") if isinstance(e, dict) else None
            if not isinstance(name, str) or name in written or Path(name).is_absolute():
                continue
            f = self.out / name
            if not f.is_file() or root not in f.resolve().parents:
                continue
            by = e.get("command") or previous.get("command")
            st = f.stat()
            if by == self.command and (e.get("bytes"), e.get("mtime_ns")) == (st.st_size, st.st_mtime_ns):
                if remove:
                    f.unlink()
                removed.append(name)
            else:
                kept.append({**_entry(self.out, f, by), **({"changed_since_written": True}
                                                           if by == self.command else {})})
        return kept, removed

    def discard(self) -> None:
        import shutil

        shutil.rmtree(self.stage, ignore_errors=True)


def _write_fix(e: OSError) -> str:
    """The fix of an operating-system error met writing into --out."""
    if e.errno == errno.EISDIR:
        return "a folder has that name: move it away or choose another --out"
    if e.errno == errno.ENOTDIR:
        return "a file has that name: move it away or choose another --out"
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return "free some space or choose another --out"
    return "check its permissions or choose another --out"


def _entry(out: Path, p: Path, command: str | None) -> dict:
    """A manifest's line for file ``p`` of folder ``out``: its name, size, modification time and command."""
    st = p.stat()
    return {"name": str(p.relative_to(out)), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "command": command}


def _manifest(path: Path) -> dict | None:
    """A folder's manifest as written (None: none, or not one of ours)."""
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and m.get("complete") is True else None


def _invoked_options() -> dict | None:
    """The options of the command running (click's parsed values, those JSON holds), for the manifest."""
    try:
        import click  # noqa: PLC0415
    except ImportError:
        return None
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return None
    return {k: v for k, v in ctx.params.items() if isinstance(v, (str, int, float, bool, type(None)))
            or (isinstance(v, (list, tuple)) and all(isinstance(x, (str, int, float, bool)) for x in v))}


def _utc_now() -> str:
    from datetime import datetime, timezone  # noqa: PLC0415

    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def disk_free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes on the file system holding ``path`` (None where the system cannot tell)."""
    import shutil

    try:
        return int(shutil.disk_usage(path).free)
    except OSError:
        return None


class output_folder:  # noqa: N801 - used as a context manager, like open()
    """``with output_folder(out, command) as f:`` write into ``f.stage``; committed on success,
    discarded on any exception (KeyboardInterrupt included), see `OutputFolder`."""

    def __init__(self, out: str | os.PathLike, command: str, need_bytes: int = 0) -> None:
        self.folder = OutputFolder(out, command, need_bytes)

    def __enter__(self) -> OutputFolder:
        return self.folder

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            try:
                self.folder.commit()
            except BaseException:  # --out says it is incomplete (its manifest); the stage goes
                self.folder.discard()
                raise
        else:
            self.folder.discard()
            where = getattr(exc, "filename", None) if isinstance(exc, OSError) else None
            if isinstance(where, str) and self.folder.stage in Path(where).parents:  # the user's path, not the stage
                raise _named(exc, self.folder.out / Path(where).relative_to(self.folder.stage)) from None
        return False
