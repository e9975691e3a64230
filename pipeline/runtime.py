"""The one place that decides device, precision and data-loading settings.

Every other module asks here instead of probing ``torch.cuda`` itself, so that a run on a
laptop, on one GPU and under ``torchrun`` behaves the same way apart from speed.
"""

from __future__ import annotations

import contextlib
import os
import random

import numpy as np
import torch

from .errors import VseError


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` → the local CUDA device when there is one (per-rank under torchrun), else CPU."""
    name = (name or "auto").lower()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise VseError("--device cuda was asked for but no CUDA device is visible")
        if name == "cuda":
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device(name)
    if name == "cpu":
        return torch.device("cpu")
    raise VseError(f"unknown device {name!r} (expected auto, cpu, cuda or cuda:N)")


def autocast(device: torch.device, enabled: bool = True, dtype: torch.dtype | None = None):
    """Mixed precision on GPU (bf16 where supported, else fp16); a no-op on CPU."""
    if not enabled or device.type != "cuda":
        return contextlib.nullcontext()
    if dtype is None:
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast(device_type="cuda", dtype=dtype)


def needs_grad_scaler(device: torch.device, enabled: bool = True) -> bool:
    """fp16 autocast needs loss scaling; bf16 and fp32 do not."""
    return enabled and device.type == "cuda" and not torch.cuda.is_bf16_supported()


def pin_memory(device: torch.device) -> bool:
    return device.type == "cuda"


def default_workers() -> int:
    """DataLoader workers: leave one core for the main process."""
    return max(0, min(8, (os.cpu_count() or 1) - 1))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict:
    """All RNG states needed to resume a run exactly (as tensors, so weights_only loads it)."""
    state = {
        "torch": torch.get_rng_state(),
        "numpy": torch.from_numpy(np.frombuffer(_numpy_state_bytes(), dtype=np.uint8).copy()),
        "python": torch.tensor(list(_python_state_ints()), dtype=torch.int64),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    _set_numpy_state_bytes(state["numpy"].numpy().tobytes())
    _set_python_state_ints(state["python"].tolist())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _numpy_state_bytes() -> bytes:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    header = np.array([pos, has_gauss], dtype=np.int64).tobytes()
    return header + np.float64(cached).tobytes() + np.asarray(keys, dtype=np.uint32).tobytes()


def _set_numpy_state_bytes(raw: bytes) -> None:
    pos, has_gauss = np.frombuffer(raw[:16], dtype=np.int64)
    cached = np.frombuffer(raw[16:24], dtype=np.float64)[0]
    keys = np.frombuffer(raw[24:], dtype=np.uint32)
    np.random.set_state(("MT19937", keys, int(pos), int(has_gauss), float(cached)))


def _python_state_ints():
    version, internal, gauss = random.getstate()
    yield version
    yield -1 if gauss is None else 1
    yield from internal


def _set_python_state_ints(values) -> None:
    version, has_gauss, *internal = values
    random.setstate((version, tuple(internal), None))
