"""The declarations of SGRAF's two pairwise networks (`--network sgr`, `--network saf`; Diao et al.,
AAAI 2021), torch-free: their own options (``SGRAFOptions``, the authors' defaults), read by
``TrainConfig`` and by the networks in ``sgraf``."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.registry import NetworkSpec
from pipeline.core.values import declare


@dataclass(frozen=True)
class SGRAFOptions:
    """SGRAF's own options (`--network-option NAME=VALUE`); the defaults are the authors'."""

    sim_dim: int = declare(256, "Size of a similarity vector (the authors' --sim_dim).", low=1)
    sgr_steps: int = declare(3, "SGR's graph-reasoning steps (--sgr_step).", low=1)
    smooth: float = declare(9.0, "λ of the cross-attention's softmax (hard-coded in the authors' model.py).")
    dropout: float = declare(0.4, "Dropout of the word embeddings and the self-attentions.", low=0, below=1)
    caption_chunk: int = declare(0, "Captions scored at once (0: as many as the memory budget allows).",
                                 low=0)


SGR = NetworkSpec("pairwise", model="pipeline.networks.sgraf:SGR", Options=SGRAFOptions)
SAF = NetworkSpec("pairwise", model="pipeline.networks.sgraf:SAF", Options=SGRAFOptions)
