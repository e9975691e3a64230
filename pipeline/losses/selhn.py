"""``selhn``: selectively hard negative mining (Li et al., TCSVT 2024; docs/PROTOCOL.md, "SelHN").
Equal to the authors' ``TripletSelHNLoss`` (AAA-Zheng/RVSEPP, loss.py) at its defaults; golden
test: tests/test_poly_selhn_golden.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pipeline.core.values import declare
from pipeline.losses.base import Batch, VseLoss
from pipeline.losses.hinge import hinge_costs


class SelectiveHardNegativeLoss(VseLoss):
    """``selhn`` (SelHN): per query, VSE++'s hardest-negative hinge, or VSE0's hinges averaged
    over the query's negatives when its positive is within ``epsilon`` of its hardest negative.

    For a query (an image over the batch's captions, then a caption over the images) with hinges
    ``h_j = [margin + S_ij − S_ii]_+`` over its negatives j, and gap
    ``g = |S_ii − max_j S_ij|`` (scores detached: the choice carries no gradient), its cost is
    ``mean_j h_j`` if ``g < epsilon`` else ``max_j h_j``. The mean over the B queries of each
    direction; the two directions averaged. Early in training, when positives and negatives
    are alike, most queries take the mean: the method is its own warm-up (no warm-up option).

    - ``mask_same_image``: false by default, as theirs (only the diagonal is a positive); true
      leaves same-image pairs out of the hinges, the hardest negative and the mean's count.
    - A query with no negative costs 0 (theirs: B = 1 divides 0 by 0)."""

    name = "selhn"

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        mask_same_image: bool = declare(False, "Theirs: only the diagonal is a positive.")
        margin: float = declare(0.2, "The hinge margin (their --margin).", low=0)
        epsilon: float = declare(0.01, "A query whose positive is within epsilon of its hardest negative "
                                       "averages its hinges (their --epsilon).", low=0)

    def collapse_value(self, global_batch: int) -> float | None:
        """Every score equal: every hinge is the margin, every gap 0: the loss is the margin."""
        return self.margin or None

    def value(self, batch: Batch) -> torch.Tensor:
        scores, negatives = batch.scores, batch.negatives
        to_captions, to_images = hinge_costs(scores, negatives, self.margin)
        positive = scores.detach().diagonal()
        hardest = scores.detach().masked_fill(~negatives, -math.inf)
        close = [(positive - hardest.amax(dim=dim)).abs() < self.epsilon for dim in (1, 0)]
        image_queries = chosen(to_captions, negatives, close[0], dim=1)
        caption_queries = chosen(to_images, negatives, close[1], dim=0)
        return (image_queries.mean() + caption_queries.mean()) / 2


def chosen(hinges: torch.Tensor, negatives: torch.Tensor, close: torch.Tensor, dim: int) -> torch.Tensor:
    """Per query along ``dim``: the mean of its hinges over its negatives where ``close``, else
    their maximum (0 for a query without negatives)."""
    averaged = hinges.sum(dim=dim) / negatives.sum(dim=dim).clamp(min=1)
    return torch.where(close, averaged, hinges.amax(dim=dim))
