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

from pipeline.core.cpuinfo import NATIVE_BF16_FLAGS, cpu_native_bf16  # noqa: F401  (re-exported)
from pipeline.core.errors import VseError


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """``auto`` → the local CUDA device when there is one, else CPU.  ``cuda`` under torchrun is
    this process's GPU (``LOCAL_RANK``); an explicit ``cuda:N`` is refused there (every rank
    would land on GPU N: choose GPUs with CUDA_VISIBLE_DEVICES).  A CUDA device becomes the
    current one, so no CUDA state (context, caching allocator, NCCL) opens on GPU 0 by default."""
    if isinstance(name, torch.device):
        return name
    name = (name or "auto").lower()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if name != "cuda" and not name.startswith("cuda:"):
        raise VseError(f"unknown device {name!r} (expected auto, cpu, cuda or cuda:N)")
    if not torch.cuda.is_available():
        raise VseError(f"--device {name} was asked for but no CUDA device is visible")
    count = torch.cuda.device_count()
    if name == "cuda":
        index = int(os.environ.get("LOCAL_RANK", "0")) % count  # two ranks may share a GPU (tests)
    else:
        if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1:
            raise VseError(f"--device {name} under torchrun would put every process on one GPU: give "
                           "--device cuda (each process takes cuda:LOCAL_RANK) and choose the GPUs "
                           "with CUDA_VISIBLE_DEVICES")
        suffix = name.removeprefix("cuda:")
        if not suffix.isdigit():
            raise VseError(f"unknown device {name!r} (expected auto, cpu, cuda or cuda:N)")
        index = int(suffix)
        if index >= count:
            raise VseError(f"--device {name}: only {count} CUDA device(s) are visible "
                           f"(cuda:0..cuda:{count - 1})")
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def amp_dtype(device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``device``: bf16 on GPUs of compute capability 8.0 and up
    (Ampere+: native bf16), fp16 with loss scaling below (V100, T4: their bf16 is emulated,
    slow), None on CPU (no autocast).  ``torch.cuda.is_bf16_supported()`` is not asked: it
    answers True on pre-Ampere GPUs too."""
    if device.type != "cuda":
        return None
    major, _ = torch.cuda.get_device_capability(device)
    return torch.bfloat16 if major >= 8 else torch.float16


# Set to 1, --cpu-amp runs on a CPU without native bf16 too (emulated, slow: to test code paths).
EMULATED_BF16_ENV = "VSE_ALLOW_EMULATED_BF16"

def train_dtype(device: torch.device, amp: bool, cpu_amp: bool = False) -> torch.dtype | None:
    """The autocast dtype of a training step: ``amp_dtype`` on a GPU (``amp``); bf16 on a CPU
    with native bf16 when asked (``cpu_amp``, refused on a CPU without it); else None (fp32)."""
    if device.type == "cuda":
        return amp_dtype(device) if amp else None
    if cpu_amp:
        if not cpu_native_bf16() and os.environ.get(EMULATED_BF16_ENV) != "1":
            raise VseError("--cpu-amp: this CPU has no native bf16 (no avx512_bf16 or amx_bf16 flag): "
                           "bf16 would be emulated, slower than fp32")
        return torch.bfloat16
    return None


def autocast(device: torch.device, enabled: bool = True, dtype: torch.dtype | None = None):
    """Mixed precision: on a GPU ``amp_dtype`` unless ``dtype`` is given; on a CPU only bf16 asked
    for by ``dtype`` (``train_dtype``); otherwise a no-op."""
    if not enabled:
        return contextlib.nullcontext()
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=dtype or amp_dtype(device))
    if device.type == "cpu" and dtype == torch.bfloat16:
        return torch.autocast(device_type="cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def needs_grad_scaler(device: torch.device, enabled: bool = True) -> bool:
    """fp16 autocast needs loss scaling; bf16 and fp32 do not."""
    return enabled and amp_dtype(device) == torch.float16


FP32_SWITCHES = (torch.backends.cuda.matmul, torch.backends.cudnn.conv, torch.backends.cudnn.rnn)


@contextlib.contextmanager
def full_fp32(device: torch.device):
    """IEEE fp32 on GPU: no autocast and no TF32 (which PyTorch allows by default in cuDNN
    convolutions and RNNs), so a model's embeddings on a GPU match the CPU's to float rounding.
    A no-op on CPU."""
    if device.type != "cuda":
        yield
        return
    saved = [switch.fp32_precision for switch in FP32_SWITCHES]
    try:
        for switch in FP32_SWITCHES:
            switch.fp32_precision = "ieee"
        yield
    finally:
        for switch, value in zip(FP32_SWITCHES, saved):
            switch.fp32_precision = value


def precision(device: torch.device, amp: bool):
    """How a model is evaluated: mixed precision if ``amp``, else full fp32 (``full_fp32``)."""
    return autocast(device) if amp else full_fp32(device)


def configure_kernels(device: torch.device, deterministic: bool = False, fixed_shapes: bool = False) -> str:
    """cuDNN / cuBLAS choices of a training run on a GPU; returns a phrase for the set-up line.

    ``deterministic``: reproducible kernels — cuDNN's deterministic algorithms without
    autotuning, PyTorch's deterministic implementations (embedding and index_select
    backward sort instead of adding atomically) and a fixed cuBLAS workspace.  They cost
    speed (see README "On a GPU"); ops with no deterministic CUDA kernel (e.g. adaptive
    average pooling's backward in a fine-tuned CNN) warn instead of failing.
    Otherwise ``fixed_shapes`` (RC mode: every crop has the same size) turns on
    ``cudnn.benchmark``, which times the convolution algorithms once per input shape and
    keeps the fastest.  A no-op on CPU, whose kernels are deterministic already."""
    if device.type != "cuda":
        return ""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True, warn_only=True)
        return "deterministic kernels"
    torch.backends.cudnn.benchmark = fixed_shapes
    return "cudnn.benchmark" if fixed_shapes else ""


def describe(device: torch.device, amp: bool, cpu_amp: bool = False) -> str:
    """``cuda:0 (NVIDIA H100, compute 9.0), bf16 autocast`` / ``cpu, fp32``: the set-up line."""
    if device.type != "cuda":
        if cpu_amp:
            return f"{device}, bf16 autocast ({'native' if cpu_native_bf16() else 'EMULATED, slow'} bf16)"
        native = device.type == "cpu" and cpu_native_bf16()
        return f"{device}, fp32" + (" (this CPU has native bf16: --cpu-amp uses it)" if native else "")
    major, minor = torch.cuda.get_device_capability(device)
    dtype = amp_dtype(device) if amp else None
    mode = {torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast + loss scaling"}.get(dtype, "fp32")
    return f"{device} ({torch.cuda.get_device_name(device)}, compute {major}.{minor}), {mode}"


def pin_memory(device: torch.device) -> bool:
    return device.type == "cuda"


def default_workers() -> int:
    """DataLoader workers: leave one core for the main process."""
    return max(0, min(8, (os.cpu_count() or 1) - 1))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def device_rng_state(device: torch.device) -> torch.Tensor | None:
    """This process's CUDA generator state (None on CPU).  Under torchrun every rank has its
    own; ``rng_state`` keeps all of them, one per rank."""
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def rng_state(device_states: list | None = None) -> dict:
    """All RNG states needed to resume a run exactly (as tensors, so weights_only loads it).
    ``device_states``: the CUDA generator state of each rank, in rank order."""
    state = {
        "torch": torch.get_rng_state(),
        "numpy": torch.from_numpy(np.frombuffer(_numpy_state_bytes(), dtype=np.uint8).copy()),
        "python": torch.tensor(list(_python_state_ints()), dtype=torch.int64),
    }
    if device_states and all(s is not None for s in device_states):
        state["device"] = list(device_states)
    return state


def set_rng_state(state: dict, device: torch.device | None = None, rank: int = 0) -> None:
    """Restore ``rng_state``'s states; the CUDA generator of ``device`` gets rank ``rank``'s.
    A checkpoint of a CPU run leaves the CUDA generator as seeded.  Checkpoints of older
    versions kept rank 0's states of every visible GPU (``cuda``): the device's own is used."""
    torch.set_rng_state(state["torch"])
    _set_numpy_state_bytes(state["numpy"].numpy().tobytes())
    _set_python_state_ints(state["python"].tolist())
    if device is None or device.type != "cuda":
        return
    per_rank, legacy = state.get("device"), state.get("cuda")
    if per_rank and rank < len(per_rank):
        torch.cuda.set_rng_state(per_rank[rank], device)
    elif not per_rank and legacy and rank == 0 and device.index < len(legacy):
        torch.cuda.set_rng_state(legacy[device.index], device)


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


def release_run_memory() -> None:
    """Free now what a finished run left behind in reference cycles (a failed or pruned run's
    traceback holds its frames, so its trainer; a library's own cycles), instead of at the
    interpreter's next full collection: a loop of runs in one process (`vse sweep`, `vse tune`)
    may not reach one for several runs, and each run holds its data (a preloaded grid cache is
    1-2 GB) and model until then. Called after each run of such a loop (issue 49).

    Then glibc's malloc is asked to hand the freed heap back to the system: a run's many small
    tensors of per-batch shapes leave it fragmented, and it kept 0.5-0.7 GB of freed memory after
    each run of the SGR sweep, more with each run (bench/results/run_memory_sweep.json)."""
    import gc

    gc.collect()
    _malloc_trim()


def _malloc_trim() -> None:
    """glibc's ``malloc_trim(0)``; nothing where the C library has none (macOS, musl)."""
    import ctypes
    import ctypes.util

    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)
