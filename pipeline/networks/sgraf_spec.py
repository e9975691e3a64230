"""The declarations of SGRAF's two pairwise networks (`--network sgr`, `--network saf`; Diao et al.,
AAAI 2021), torch-free: their own options (``SGRAFOptions``, the authors' defaults), read by
``TrainConfig`` and by the networks in ``sgraf``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.core.registry import NetworkSpec


@dataclass(frozen=True)
class SGRAFOptions:
    """SGRAF's own options (`--network-option NAME=VALUE`); the defaults are the authors'."""

    sim_dim: int = 256         # size of a similarity vector (--sim_dim)
    sgr_steps: int = 3         # SGR's reasoning steps (--sgr_step)
    smooth: float = 9.0        # λ of the cross-attention's softmax (hard-coded in model.py)
    dropout: float = 0.4       # of the word embeddings and the self-attentions
    caption_chunk: int = 0     # captions scored at once (0: by the memory budget)

    def __post_init__(self):
        if self.sim_dim < 1 or self.sgr_steps < 1 or self.caption_chunk < 0:
            raise ValueError("sim_dim and sgr_steps must be >= 1, caption_chunk >= 0")
        if not 0 <= self.dropout < 1 or not math.isfinite(self.smooth):
            raise ValueError("dropout must be in [0, 1) and smooth finite")


SGR = NetworkSpec("pairwise", model="pipeline.networks.sgraf:SGR", Options=SGRAFOptions)
SAF = NetworkSpec("pairwise", model="pipeline.networks.sgraf:SAF", Options=SGRAFOptions)
