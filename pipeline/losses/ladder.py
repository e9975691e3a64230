"""``ladder`` (CVSE++'s ladder loss): VSE++'s hardest-negative hinge, then per level a hinge
between the query's more and less relevant negatives (the batch's caption–caption relevance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pipeline.core import values
from pipeline.core.values import declare
from pipeline.losses.base import Batch, VseLoss
from pipeline.losses.hinge import hinge_costs

LADDER_DEFAULTS = {  # levels → (thetas, margins, betas), from the CVSE++ paper
    2: ([0.63], [0.2, 0.01], [1.0, 0.25]),
    3: ([0.63, 0.56], [0.2, 0.01, 0.01], [1.0, 0.25, 0.125]),
}


class LadderLoss(VseLoss):
    """``ladder`` (CVSE++) with hard contrastive sampling.

    Level 1 is VSE++'s hardest-negative hinge (margin ``margins[0]``, weight ``betas[0]``).
    Level l >= 2 splits each query's negatives at ``thetas[l-2]`` into "more relevant"
    (relevance >= theta) and "less relevant" and adds ``betas[l-1]`` times
    ``[margins[l-1] - min_more S + max_less S]_+``, both directions; queries with an empty
    side are skipped.  Defaults by ``levels`` (2 or 3) are the paper's.
    ``positive_in_more_relevant=True`` counts the positive pair in every "more relevant" set,
    as the reference code does (its relevance diagonal is 1 >= theta): a query with no more
    relevant negative still gets ``[margins[l-1] - S_qq + max_less S]_+``.
    """

    name = "ladder"

    uses_relevance = True

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        levels: int = declare(2, "L, the levels (2 or 3 have the paper's defaults).", low=2)
        thetas: list | tuple | None = declare(None, "L - 1 relevance thresholds in [-1, 1] (default: the "
                                                    "paper's).")
        margins: list | tuple | None = declare(None, "L margins >= 0 (default: the paper's).")
        betas: list | tuple | None = declare(None, "L weights >= 0 (default: the paper's).")
        positive_in_more_relevant: bool = declare(False, "Count the positive in every more-relevant set, "
                                                         "as the reference code.")

        def __post_init__(self):
            """The paper's thetas, margins and betas of ``levels`` where none are given, as lists."""
            levels, given = self.levels, (self.thetas, self.margins, self.betas)
            defaults = LADDER_DEFAULTS.get(levels)
            if defaults is None and None in given:
                raise ValueError(f"levels={levels} has no defaults: give thetas, margins and betas")
            names, bounds = ("thetas", "margins", "betas"), ((-1, 1), (0, None), (0, None))
            thetas, margins, betas = (
                values.finite_list(default if value is None else value, name, *low_high)
                for name, value, default, low_high in zip(names, given, defaults or given, bounds))
            if (len(thetas), len(margins), len(betas)) != (levels - 1, levels, levels):
                raise ValueError(f"levels={levels} needs {levels - 1} thetas, {levels} margins and "
                                 f"{levels} betas, got {len(thetas)}, {len(margins)}, {len(betas)}")
            for name, value in (("thetas", thetas), ("margins", margins), ("betas", betas)):
                object.__setattr__(self, name, value)

    def value(self, batch: Batch) -> torch.Tensor:
        to_captions, to_images = hinge_costs(batch.scores, batch.negatives, self.margins[0])
        total = self.betas[0] * (to_captions.amax(dim=1).sum() + to_images.amax(dim=0).sum())
        positives = torch.eye(len(batch.scores), dtype=torch.bool, device=batch.scores.device)
        for theta, margin, beta in zip(self.thetas, self.margins[1:], self.betas[1:]):
            more = batch.negatives & (batch.relevance >= theta)
            if self.positive_in_more_relevant:
                more = more | positives
            less = batch.negatives & (batch.relevance < theta)
            total = total + beta * (_ladder_hinges(batch.scores, more, less, margin, dim=1)
                                    + _ladder_hinges(batch.scores, more, less, margin, dim=0))
        return total


def _ladder_hinges(scores, more, less, margin, dim):
    """Sum over queries along ``dim`` of ``[margin - min_more S + max_less S]_+``."""
    least_relevant_score = scores.masked_fill(~more, math.inf).amin(dim=dim)
    most_confusing_score = scores.masked_fill(~less, -math.inf).amax(dim=dim)
    cost = (margin - least_relevant_score + most_confusing_score).clamp(min=0)
    return torch.where(more.any(dim=dim) & less.any(dim=dim), cost, 0.0).sum()
