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
            self.data = load_tokens(self.path)
            if self.data.size < seq + 1:
                raise ExecError(f"--tokens {self.path}: {self.data.size} tokens, need at least seq+1 = {seq + 1}")
            top = int(self.data.max())
            if top >= vocab or int(self.data.min()) < 0:
                raise ExecError(f"--tokens {self.path}: token id {top} outside the model's vocabulary [0, {vocab})")

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


def load_tokens(path: Path) -> np.ndarray:
    if not path.is_file():
        raise ExecError(f"--tokens {path}: no such file")
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
