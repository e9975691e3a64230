"""What the golden-bundle generators (scripts/golden_*.py) share: the commit of an upstream
checkout, and running its CUDA-minded code on a CPU. Their code is imported at run time from a
checkout outside this repository and never enters it."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import numpy as np
import torch


def commit_of(checkout: Path, given: str | None = None) -> str:
    """``given``, else the checkout's HEAD (a git work tree), else 'unknown'."""
    if given:
        return given
    try:
        return subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@contextlib.contextmanager
def cuda_as_identity(available: bool = False):
    """Inside the block ``Tensor.cuda()`` returns the tensor itself and ``torch.cuda.is_available()``
    answers ``available`` (True where their code builds a mask only under CUDA)."""
    saved = torch.cuda.is_available, torch.Tensor.cuda
    torch.cuda.is_available = lambda: available
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.cuda.is_available, torch.Tensor.cuda = saved


def write_bundles(out: Path, prefix: str, cases: dict, meta: dict) -> None:
    """OUT/{prefix}_{case}.npz for each case: its arrays and the provenance ``meta`` (repo, commit,
    sha256 of the files read)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, values in cases.items():
        path = out / f"{prefix}_{name}.npz"
        np.savez_compressed(path, **values, **meta)
        print(f"{path}: {len(values)} arrays, {path.stat().st_size} bytes")
