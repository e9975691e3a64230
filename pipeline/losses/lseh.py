"""``lseh`` (LSEH): VSE++'s hardest-negative hinge with a semantic margin, larger for a negative
whose caption is more relevant to the query's (the batch's caption–caption relevance).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.core.values import declare
from pipeline.losses.base import Batch
from pipeline.losses.hinge import HardestNegativeHinge, hinge_costs


class SemanticHardNegativeLoss(HardestNegativeHinge):
    """``lseh``: VSE++'s hardest-negative hinge with the per-pair margin
    ``margin + lambda_ * relevance[i, j]`` (relevance zeroed on same-image pairs).

    With ``mask_same_image=False`` same-image pairs are negatives with margin ``margin``;
    ``zero_margin_same_image=True`` (only with ``mask_same_image=False``) gives them margin 0
    — the whole per-pair margin zeroed, as the LSEH reference code does.
    ``warmup_epochs=E`` sums the hinges (with their per-pair margins) for epochs 0 … E-1, as ``mh``.
    """

    name = "lseh"

    uses_relevance = True

    @dataclass(frozen=True)
    class Options(HardestNegativeHinge.Options):
        margin: float = declare(0.185, "The hinge margin.", low=0)
        lambda_: float = declare(0.025, "The weight of the semantic margin.", low=0)
        zero_margin_same_image: bool = declare(False, "Same-image pairs get margin 0 (needs "
                                                      "mask_same_image false), as the LSEH code.")

        def __post_init__(self):
            if self.zero_margin_same_image and self.mask_same_image:
                raise ValueError("zero_margin_same_image needs mask_same_image=false (with the mask, "
                                 "same-image pairs are no negatives at all)")

    def value(self, batch: Batch) -> torch.Tensor:
        semantic = batch.relevance.masked_fill(batch.same_image, 0.0)
        margins = self.margin + self.lambda_ * semantic
        if self.zero_margin_same_image:
            margins = margins.masked_fill(batch.same_image, 0.0)
        return self.reduce(*hinge_costs(batch.scores, batch.negatives, margins))
