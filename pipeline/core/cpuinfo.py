"""What this CPU can compute natively, read from the flags it reports (torch-free: the training
options' defaults read it, ``config.TrainConfig``, as does ``runtime``)."""

from __future__ import annotations

import functools

# /proc/cpuinfo flags of native bf16 arithmetic: x86's AVX512-BF16 and AMX, Arm's BF16 extension.
NATIVE_BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}


@functools.lru_cache(maxsize=None)
def cpu_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bf16 natively, read from the flags it reports (never guessed from
    a model name); False where they cannot be read. Without it, bf16 is emulated and slower."""
    if cpuinfo is None:
        try:
            cpuinfo = open("/proc/cpuinfo", encoding="utf-8", errors="replace").read()
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features") and NATIVE_BF16_FLAGS & set(value.split()):
            return True
    return False
