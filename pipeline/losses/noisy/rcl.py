"""``rcl``: RCL's complementary contrastive loss (docs/PROTOCOL.md, "Noisy correspondence"; the base
class and the trainer's contract: ``pipeline.losses.noisy.base``). Equal to the authors' ``CCL``
(penghu-cs/RCL, RCL-SGRAF/model.py) at its defaults; golden test: tests/test_rcl_golden.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pipeline.core.values import declare
from pipeline.losses.base import Batch, with_positives
from pipeline.losses.noisy.base import NoisyPairLoss

# h of a negative's p, given p, log(1 − p + eps) and q, as the authors' CCL (eps: their 1e-10)
RCL_VARIANTS = {
    "log": lambda p, log_rest, q: -log_rest,                       # −log(1 − p + eps)
    "gce": lambda p, log_rest, q: -torch.expm1(q * log_rest) / q,  # (1 − (1 − p + eps)^q) / q
    "abs": lambda p, log_rest, q: p,
    "exp": lambda p, log_rest, q: torch.exp(p - 1),                # exp(−(1 − p))
    "tan": lambda p, log_rest, q: torch.tan(p),
    "infonce": None,                                               # −log p_ii: the non-robust reference
}


class ComplementaryContrastiveLoss(NoisyPairLoss):
    """``rcl`` (RCL, TPAMI 2023): complementary contrastive learning, as the authors' ``CCL``.
    Per query (an image over the batch's captions, then a caption over the images),
    ``p_ij = exp(S_ij / tau) / (Σ_k exp(S_ik / tau) + eps)`` over its counted candidates; the
    loss pushes the negatives' p down, ``Σ_{j negative} h(p_ij)``, and never pulls a (possibly
    mismatched) positive up directly. ``variant`` is h (their ``--loss``):

        log      −log(1 − p + eps)           (default)
        gce      (1 − (1 − p + eps)^q) / q   (q: their ``--margin``, 0.2 in their scripts)
        abs      p
        exp      exp(−(1 − p))
        tan      tan(p)
        infonce  −log p_ii                   (their ``infoNCE``: plain InfoNCE on the positive)

    Summed over a query's negatives, averaged over the B queries, the two directions added.

    - ``eps``: their 1e-10, in the softmax's denominator and in ``log``/``gce``; 0 gives the
      clean formulas. Computed in log space: no overflow of exp(S / tau) (theirs: float32
      overflows at S / tau > 88), and 1 − p of a row's largest p taken from the other entries,
      exact where p is near 1 (theirs subtracts; they agree to 1e-9 while 1 − p > ~1e-6).
    - ``ratio`` (their ``--ratio``): in (0, 1), each query counts ⌊ratio·B⌋ of its off-diagonal
      entries, drawn uniformly (``torch.rand_like`` of the scores, the global RNG) — the same
      draw for image i and for caption i, as theirs; ≤ 0 or ≥ 1 (default −1): all of them. The
      softmax always runs over every candidate.
    - ``mask_same_image``: false by default, as theirs (only the diagonal is a positive; other
      captions of the query's image are negatives); true leaves same-image pairs out of both the
      softmax and the sum."""

    name = "rcl"

    @dataclass(frozen=True)
    class Options(NoisyPairLoss.Options):
        mask_same_image: bool = declare(False, "Theirs: only the diagonal is a positive.")
        tau: float = declare(0.05, "The softmax temperature.", above=0)
        variant: str = declare("log", "h, the cost of a negative's p (their --loss).",
                               choices=tuple(RCL_VARIANTS))
        q: float = declare(0.2, "GCE's exponent (1: the mean absolute error, towards 0: -log); gce only.",
                           above=0, high=1)
        ratio: float = declare(-1.0, "The share of each query's negatives pushed, drawn (<= 0 or >= 1: all).")
        eps: float = declare(1e-10, "Their eps, in the softmax's denominator and in log / gce.", low=0)

    def value(self, batch: Batch) -> torch.Tensor:
        scores, negatives = batch.scores, batch.negatives
        counted = with_positives(negatives)
        logits = (scores / self.tau).masked_fill(~counted, -math.inf)
        pushed = negatives & self._drawn(scores)  # the same draw in both directions, as theirs
        return self._direction(logits, pushed) + self._direction(logits.T, pushed)

    def _drawn(self, scores: torch.Tensor) -> torch.Tensor:
        """(B, B) bool: the off-diagonal entries each row counts (``ratio``), drawn as theirs."""
        size = len(scores)
        if self.ratio <= 0 or self.ratio >= 1:
            return ~torch.eye(size, dtype=torch.bool, device=scores.device)
        draw = torch.rand_like(scores, requires_grad=False)
        draw.fill_diagonal_(-1.0)  # below every draw in [0, 1): never picked (theirs: row min − 1)
        picked = draw.topk(int(self.ratio * size), dim=1).indices
        return torch.zeros_like(draw, dtype=torch.bool).scatter_(1, picked, True)

    def _direction(self, logits: torch.Tensor, pushed: torch.Tensor) -> torch.Tensor:
        log_z = self._log_sum(logits)
        log_p = logits - log_z
        if self.variant == "infonce":
            return -log_p.diagonal().mean()
        p = log_p.exp().masked_fill(~pushed, 0.0)  # no gradient through an entry left out
        cost = RCL_VARIANTS[self.variant](p, self._log_complement(logits, log_z, p, pushed), self.q)
        return cost.masked_fill(~pushed, 0.0).sum(dim=1).mean()

    def _log_sum(self, logits: torch.Tensor) -> torch.Tensor:
        """(B, 1) log(Σ_j exp(logits_ij) + eps), without overflow."""
        log_z = torch.logsumexp(logits, dim=1, keepdim=True)
        return self._plus_eps(log_z)

    def _plus_eps(self, log_x: torch.Tensor) -> torch.Tensor:
        return torch.logaddexp(log_x, log_x.new_tensor(math.log(self.eps))) if self.eps else log_x

    def _log_complement(self, logits, log_z, p, pushed) -> torch.Tensor:
        """log(1 − p + eps) on the pushed entries, to full precision where p is near 1: only a
        row's largest p can exceed 1/2, and its 1 − p is (Σ_{k≠j} exp(logits_ik) + eps) / Z, the
        row without it (theirs subtracts, so there their value carries p's rounding / (1 − p))."""
        top = logits.masked_fill(~pushed, -math.inf).argmax(dim=1, keepdim=True)
        others = logits.scatter(1, top, -math.inf)
        others = torch.where(pushed.any(dim=1, keepdim=True), others, 0.0)  # a row with none: unused
        log_rest_of_top = self._log_sum(others) - log_z
        is_top = torch.zeros_like(pushed).scatter_(1, top, True)
        return self._plus_eps(torch.where(is_top, log_rest_of_top, torch.log1p(-p.masked_fill(is_top, 0.0))))
