"""``poly``: PolyLoss, universal weighting metric learning (Wei et al., CVPR 2020;
docs/PROTOCOL.md, "PolyLoss"). Equal to the authors' ``ContrastiveLoss.polyloss``
(wayne980/PolyLoss, polyloss.py) at its defaults; golden test: tests/test_poly_selhn_golden.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pipeline.core import values
from pipeline.core.values import declare
from pipeline.losses.base import Batch, VseLoss


class PolyLoss(VseLoss):
    """``poly`` (PolyLoss): a polynomial weight of the positive and of the hardest informative
    negative, per query (an image over the batch's captions, then a caption over the images).

    A query with positive score ``p = S_ii`` and hardest negative ``n = max_j S_ij`` counts when
    ``p < 1 - epsilon`` and ``n + margin > p`` (it has an informative negative); it adds
    ``[P(p)]_+ + [N(n)]_+``, with the polynomials ``P`` = ``positive`` and ``N`` = ``negative``
    (coefficients, highest power first; the authors' ``0.2 p² − 0.7 p + 0.5`` and
    ``0.9 n² − 0.4 n + 0.03``). Both directions summed, divided by the batch size B.

    - A query whose positive is at or above ``1 - epsilon`` is left out (theirs then stops with
      an error: ``min()`` of an empty tensor). So a collapsed model (every score 1) has loss 0.
    - ``mask_same_image``: false by default, as theirs (only the diagonal is a positive);
      true leaves the other captions of the query's image out of its negatives."""

    name = "poly"

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        mask_same_image: bool = declare(False, "Theirs: only the diagonal is a positive.")
        margin: float = declare(0.2, "A query counts when its hardest negative + margin > its positive "
                                     "(their --margin).")
        positive: tuple | list = declare((0.2, -0.7, 0.5), "The positive's polynomial P, coefficients "
                                                           "highest power first: [P(S_ii)]_+.")
        negative: tuple | list = declare((0.9, -0.4, 0.03), "The hardest negative's polynomial N, "
                                                            "highest power first: [N(S_ij)]_+.")
        epsilon: float = declare(1e-5, "A query whose positive is >= 1 - epsilon is left out (theirs).",
                                 low=0)

        def __post_init__(self):
            """The coefficients as tuples of floats, at least one each."""
            for name in ("positive", "negative"):
                coefficients = tuple(values.finite_list(getattr(self, name), name))
                if not coefficients:
                    raise ValueError(f"{name} must hold at least one coefficient")
                object.__setattr__(self, name, coefficients)

    def value(self, batch: Batch) -> torch.Tensor:
        scores, negatives = batch.scores, batch.negatives
        positive = scores.diagonal()
        kept = positive < 1 - self.epsilon
        pulled = polynomial(self.positive, positive)
        total = scores.new_zeros(())
        for dim in (1, 0):  # image queries (rows), then caption queries (columns)
            hardest = scores.masked_fill(~negatives, -math.inf).amax(dim=dim)
            counted = kept & (hardest + self.margin > positive)  # -inf: no negative, left out
            pushed = polynomial(self.negative, torch.where(counted, hardest, 0.0))
            total = total + torch.where(counted, pulled + pushed, 0.0).sum()
        return total / len(scores)


def polynomial(coefficients: tuple, x: torch.Tensor) -> torch.Tensor:
    """``[Σ_k a_k x^(K-k)]_+`` (Horner), the coefficients highest power first."""
    value = torch.zeros_like(x)
    for coefficient in coefficients:
        value = value * x + coefficient
    return value.clamp(min=0)
