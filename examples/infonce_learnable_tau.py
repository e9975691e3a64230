"""InfoNCE with a learnable temperature (as CLIP): an example of a `vse` loss plug-in.

    vse check-loss examples/infonce_learnable_tau.py:LearnableTemperatureInfoNCE
    vse train --features cache/x.h5 --run-dir runs/x \
        --loss examples/infonce_learnable_tau.py:LearnableTemperatureInfoNCE --loss-option tau=0.05

A plug-in is any torch.nn.Module called as ``loss(img, cap, image_ids=None, relevance=None)``
on a batch of B pairs (row i of both is a positive pair) that returns a scalar.  Its
parameters (here the temperature) are trained with the model and saved in the checkpoints.
It may declare, as the built-in losses do: ``similarity`` ("cosine", "order" or
"order-norm": how the model's embeddings are scored, also at evaluation), ``uses_relevance``
(True: the trainer needs --relevance and passes the B × B caption relevance) and
``collapse_value(global_batch)`` (the value of a collapsed model, for a warning).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


class LearnableTemperatureInfoNCE(nn.Module):
    """Symmetric InfoNCE over S / tau, averaged over both directions, tau = exp(-log_scale)
    learned (scale capped at ``max_scale``); captions of the query's own image are left out
    of the softmax when ``image_ids`` are given."""

    similarity = "cosine"
    uses_relevance = False

    def __init__(self, tau: float = 0.07, max_scale: float = 100.0):
        super().__init__()
        if not tau > 0 or not max_scale > 0:
            raise ValueError(f"tau and max_scale must be > 0, got {tau!r} and {max_scale!r}")
        self.log_scale = nn.Parameter(torch.tensor(math.log(1.0 / tau)))
        self.max_scale = float(max_scale)

    def forward(self, img, cap, image_ids=None, relevance=None):
        logits = self.log_scale.exp().clamp(max=self.max_scale) * (img @ cap.T)
        positives = torch.eye(len(img), dtype=torch.bool, device=img.device)
        if image_ids is not None:  # other captions of the same image are no negatives
            same_image = image_ids[:, None] == image_ids[None, :]
            logits = logits.masked_fill(same_image & ~positives, -math.inf)
        targets = torch.arange(len(img), device=img.device)
        return (F.cross_entropy(logits, targets) + F.cross_entropy(logits.T, targets)) / 2
