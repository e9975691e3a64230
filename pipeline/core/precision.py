"""A run's numeric precision, part by part: what a run records, what reports compare, and the default.

The parts (``Precision``):
- ``network``: the training step's forward and backward: ``fp32``, ``bf16`` or ``fp16`` autocast
  (``runtime.train_dtype``), with ``+tf32`` where a GPU's matrix products may use TF32;
- ``loss``: every built-in loss turns autocast off and computes in fp32 (float64 for float64 input,
  ``losses.base``); a pairwise network's scores reach it in the network's precision;
- ``evaluation``: validation and ``vse evaluate`` run in IEEE fp32 (``runtime.full_fp32``).

``label`` is the one string of a results row (``network/loss/evaluation``, e.g. ``bf16/fp32/fp32``).
Runs of different labels are not one method: reports show the column, comparisons refuse
(``mixed``).

The default does not depend on the machine's model. On a CPU it is fp32 everywhere: bf16 only
when asked for by name (``--cpu-amp``), so a command gives the same numerics on a laptop and on a
server with native bf16. On a GPU (``--amp`` unset) it follows the authors' numerics, fp32, except
where mixed precision was measured inside the fp32 seed noise (``mixed_precision_measured``); the
record says which (bf16 on compute capability 8.0+, fp16 before). See docs/PROTOCOL.md, "Numeric
precision", for the measurements behind each case. A run's config.json records the options as they
were applied (``applied``) and this record (``config.recorded_config``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

RECORD_KEY = "precision"       # the checkpoint's, config.json's and the validation records' entry
OPTIONS = ("amp", "cpu_amp")   # the training options that choose the step's precision
COLUMN = "precision"           # the results row's column
UNRECORDED = "unrecorded"      # a run saved before precision was recorded


@dataclass(frozen=True)
class Precision:
    network: str
    loss: str = "fp32"
    evaluation: str = "fp32"

    @property
    def label(self) -> str:
        return f"{self.network}/{self.loss}/{self.evaluation}"

    def as_dict(self) -> dict:
        return {**asdict(self), "label": self.label}


def of_step(train_dtype, device_type: str, tf32: bool | None = None) -> Precision:
    """The precision of a run whose step autocasts to ``train_dtype`` (None: fp32) on ``device_type``."""
    import torch

    name = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[train_dtype]
    if device_type == "cuda" and (tf32 if tf32 is not None else tf32_products()):
        name += "+tf32"
    return Precision(network=name)


def tf32_products() -> bool:
    """Whether a GPU's fp32 matrix products may run in TF32 (PyTorch's switch, or the cuBLAS override)."""
    import torch

    override = os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") == "1"
    return bool(torch.backends.cuda.matmul.allow_tf32) or override


def label_of(state_or_record: dict | None) -> str:
    """The label a checkpoint or validation record holds; ``UNRECORDED`` before it was recorded."""
    entry = (state_or_record or {}).get(RECORD_KEY)
    return entry["label"] if isinstance(entry, dict) and "label" in entry else UNRECORDED


def mixed(labels: dict) -> str | None:
    """None when every run (name → label) has one precision, else the line saying which differ."""
    groups: dict[str, list[str]] = {}
    for name, label in labels.items():
        groups.setdefault(str(label), []).append(str(name))
    if len(groups) < 2:
        return None
    parts = [f"{label}: {', '.join(sorted(names)[:3])}{' …' if len(names) > 3 else ''}"
             for label, names in sorted(groups.items())]
    return "runs of different precision (network/loss/evaluation) — " + "; ".join(parts)


def mixed_precision_measured(config) -> bool:
    """Mixed precision on a GPU (``--amp``) is the default only where it was measured inside the fp32
    seed noise: the dual networks, whose losses score fp32 products of the embeddings (the fast loop:
    MH and LSEH, fp32 against CPU bf16 over 3 seeds each, bench/results/precision_fast_cpu). A CPU
    is never in mixed precision by default (``--cpu-amp`` by name), whatever this says. Not for the
    pairwise networks (SGR, SAF): bf16 scores rounded to a few distinct values tie MH's hardest
    negative, and the run trains another method (bench/results/precision_saf_cpu; PROTOCOL, "Numeric
    precision"). Their score layer now stays fp32 under autocast, which trained as fp32 over one
    epoch (that folder's bf16-scores-fp32 arm) but not over three: MH gained under bf16 in every seed
    on SGR and SAF while LSEH did not move (bench/results/precision_sgraf_cpu, precision.md), so they
    stay fp32."""
    from pipeline.core.registry import NETWORKS

    return NETWORKS.spec(config.network).kind != "pairwise"


def applied(options: dict, device_type: str) -> dict:
    """``OPTIONS`` as a device applies them: --amp on a GPU only, --cpu-amp on a CPU only
    (``runtime.train_dtype``); what a run's config.json records."""
    return {"amp": bool(options["amp"]) and device_type == "cuda",
            "cpu_amp": bool(options["cpu_amp"]) and device_type == "cpu"}
