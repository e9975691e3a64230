"""ConVSE's cross-modal losses: ``csn`` (InfoNCE over each row and column of S / tau) and ``cmn``
(ConVSE++: the hinge of the hardest negative, over tau). The mean over the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pipeline.core.values import declare
from pipeline.losses.base import Batch, VseLoss, with_positives


class CrossModalInfoNCELoss(VseLoss):
    """``csn`` (ConVSE): -log softmax of the positive over each row of S / tau plus the
    same over each column (cross-modal negatives only), each averaged over the batch."""

    name = "csn"

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        tau: float = declare(0.1, "The temperature.", above=0)

    def value(self, batch: Batch) -> torch.Tensor:
        logits = (batch.scores / self.tau).masked_fill(~with_positives(batch.negatives),
                                                       -math.inf)
        to_captions = -torch.log_softmax(logits, dim=1).diagonal()
        to_images = -torch.log_softmax(logits, dim=0).diagonal()
        return to_captions.mean() + to_images.mean()


class HardestNegativeContrastiveLoss(VseLoss):
    """``cmn`` (ConVSE++): ``[(S_ic* + a - S_ii) / tau]_+ + [(S_i*i + a - S_ii) / tau]_+``
    with the hardest negative caption c* and image i*, averaged over the batch."""

    name = "cmn"

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        margin: float = declare(0.2, "The margin a.", low=0)
        tau: float = declare(0.1, "The temperature.", above=0)

    def value(self, batch: Batch) -> torch.Tensor:
        scores = batch.scores.masked_fill(~batch.negatives, -math.inf)
        positive = batch.scores.diagonal()
        hardest_caption = scores.amax(dim=1)
        hardest_image = scores.amax(dim=0)
        cost = (torch.relu((hardest_caption + self.margin - positive) / self.tau)
                + torch.relu((hardest_image + self.margin - positive) / self.tau))
        return cost.mean()
