"""Training tokens: seeded synthetic ids by default, or windows of a token file (.npy or .bin)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from memo_exec.errors import ExecError


class TokenSource:
    """Yields (inputs, targets) of shape [batch, seq]; targets are the inputs shifted by one."""

    def __init__(self, vocab: int, batch: int, seq: int, seed: int = 0, path: str | Path | None = None) -> None:
        self.vocab, self.batch, self.seq, self.seed = vocab, batch, seq, seed
        self.path = Path(path) if path is not None else None
        self.data: np.ndarray | None = None
        if self.path is not None:
            self.data = check_tokens(self.path, vocab, seq)

    def describe(self) -> str:
        return f"file {self.path} ({self.data.size} tokens)" if self.path else f"synthetic (seed {self.seed})"

    def batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        b, s = self.batch, self.seq
        if self.data is None:
            g = torch.Generator(device="cpu").manual_seed(self.seed * 1_000_003 + step)
            toks = torch.randint(0, self.vocab, (b, s + 1), generator=g)
        else:
            n = self.data.size - s - 1
            rows = []
            for j in range(b):
                start = ((step * b + j) * s) % (n + 1)
                rows.append(torch.from_numpy(self.data[start:start + s + 1].astype(np.int64)))
            toks = torch.stack(rows)
        return toks[:, :-1].contiguous(), toks[:, 1:].contiguous()


def check_tokens(path: str | Path, vocab: int, seq: int) -> np.ndarray:
    """The token ids of the ``--tokens`` file ``path`` (flat), refused in one line naming --tokens where a run of
    ``seq`` tokens a sequence and a vocabulary of ``vocab`` cannot train on them: a file that is missing, unreadable,
    not ids (`load_tokens`), shorter than seq+1 ids, or holding an id below 0 or from ``vocab`` on (the lowest id
    named where one is negative, else the highest). The one check of every path: `TokenSource` (each executor, each
    rank) and ``memo-exec run``'s launching process before it stages --out or starts --nproc's ranks (a review: a
    short file was refused inside torchrun's ranks, leaving a hidden stage folder with torchrun's traceback)."""
    path = Path(path)
    data = load_tokens(path)
    if data.size < seq + 1:
        raise ExecError(f"--tokens {path}: {data.size} tokens, need at least seq+1 = {seq + 1} (the plan's sequence "
                        f"of {seq} and its next-token targets); give a longer token file")
    lo, hi = int(data.min()), int(data.max())
    if lo < 0 or hi >= vocab:
        bad = lo if lo < 0 else hi
        raise ExecError(f"--tokens {path}: token id {bad} outside the model's vocabulary [0, {vocab}); give a file of "
                        f"ids from 0 to {vocab - 1} (the plan's model vocab)")
    return data


def load_tokens(path: Path) -> np.ndarray:
    if not path.is_file():
        raise ExecError(f"--tokens {path}: no such file")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        raise ExecError(f"--tokens {path}: cannot be read ({e.strerror or e}); give a token file you can read"
                        ) from None
    if path.stat().st_size == 0:
        raise ExecError(f"--tokens {path}: the file is empty; give a .npy array or a .bin file of token ids")
    if path.suffix == ".npy":
        try:
            arr = np.load(path, mmap_mode="r")
        except (ValueError, OSError, EOFError) as e:
            raise ExecError(f"--tokens {path}: not a .npy array ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                            ) from None
        if arr.dtype.kind not in "iu":
            raise ExecError(f"--tokens {path}: token ids must be integers, got {arr.dtype}")
        return np.asarray(arr).reshape(-1)
    if path.suffix == ".bin":
        if path.stat().st_size % 2:
            raise ExecError(f"--tokens {path}: {path.stat().st_size} bytes is not a whole number of uint16 ids")
        raw = np.memmap(path, dtype=np.uint16, mode="r")
        return np.asarray(raw)
    raise ExecError(f"--tokens {path}: use a .npy array of ids or a .bin file of uint16 ids")
