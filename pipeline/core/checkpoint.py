"""Checkpoints: written atomically, loaded with ``weights_only=True`` (never executes code).

A checkpoint is a dict of tensors and plain values: model weights, optimizer and scheduler
state, progress counters, RNG states, the effective config and the vocabulary words — all
that is needed to rebuild the model or to resume training exactly.
"""

from __future__ import annotations

import io
import re
import warnings
import zipfile
from pathlib import Path

import torch

from pipeline.core.errors import VseError
from pipeline.core.fsutil import write_atomic

CHECKPOINT_FORMAT = "vse-checkpoint"
REQUIRED_KEYS = ("format", "model", "model_config", "vocab", "train_config", "epoch", "iteration")


def save_checkpoint(state: dict, path) -> None:
    state = {"format": CHECKPOINT_FORMAT, **state}
    # Serialised in memory first: torch.save writing to a full disk raises a RuntimeError
    # ("unexpected pos …"), a plain write raises OSError(ENOSPC) → a one-line VseError.
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_atomic(path, buffer.getbuffer())


def load_checkpoint(path, map_location="cpu") -> dict:
    """Load and validate; a missing, truncated, tampered or foreign file gives a VseError."""
    path = Path(path)
    if not path.is_file():
        raise VseError("checkpoint not found", path)
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": not the user's concern
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError, … here
        other = _other_kind_of_file(path)
        if other:
            raise VseError(other, path) from exc
        first = _load_error(exc)
        if type(exc).__name__ == "UnpicklingError":
            raise VseError("refusing to load checkpoint: it holds objects other than tensors"
                           f" and plain values ({first})", path) from exc
        raise VseError(f"corrupt or truncated checkpoint ({first})", path) from exc
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise VseError("not a vse checkpoint", path)
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise VseError(f"checkpoint lacks {', '.join(missing)}", path)
    return state


def _other_kind_of_file(path: Path) -> str | None:
    """What a file torch cannot load is when it is plainly not a checkpoint (another vse
    file, an npz, no PyTorch file at all), so that the message says so instead of
    suggesting a tampered or truncated checkpoint."""
    from pipeline.core.formats import VERSIONED
    from pipeline.core.fsutil import output_format

    found = output_format(path)
    for fmt in VERSIONED:
        if found == fmt.tag:
            return f"is {fmt.noun}, not a checkpoint" + (f"; give it as {fmt.option}" if fmt.option else "")
    if found and found != CHECKPOINT_FORMAT:  # a checkpoint whose contents torch refused: said below
        return f"is a vse file of format {found!r}, not a checkpoint"
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
        if names and all(name.endswith(".npy") for name in names):
            return "is an npz of arrays, not a checkpoint (saved embeddings go to --embeddings)"
        return None
    with open(path, "rb") as fh:
        head = fh.read(4)
    if not head.startswith((b"PK", b"\x80")):  # a torch zip (maybe cut short) or a legacy pickle
        return "is not a PyTorch checkpoint file"
    return None


def _load_error(exc: Exception) -> str:
    """The informative sentence of torch.load's error: for a refused object torch leads with
    advice (ANSI-styled) and names the culprit on a 'WeightsUnpickler error:' line."""
    text = str(exc)
    refused = re.search(r"WeightsUnpickler error:\s*(\S.*)", text)
    line = refused.group(1) if refused else (text.strip().splitlines() or [type(exc).__name__])[0]
    return line.split(". ")[0][:160]
