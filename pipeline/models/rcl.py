"""``rcl``: RCL's complementary contrastive loss (docs/PROTOCOL.md, "Noisy correspondence"; the base
class and the trainer's contract: ``pipeline.models.noisy_losses``)."""

from __future__ import annotations

import math

import torch

from pipeline.models.losses import Batch, _positive
from pipeline.models.noisy_losses import NoisyPairLoss

RCL_VARIANTS = ("log", "gce", "abs", "exp", "tan", "infonce")


class ComplementaryContrastiveLoss(NoisyPairLoss):
    """``rcl`` (RCL, TPAMI 2023): complementary contrastive learning. Per query, the softmax of
    S / tau over its counted candidates (the positive and the negatives) gives p_ij; the loss
    pushes every *negative's* p_ij down, ``Σ_{j negative} h(p_ij)``, which never pulls a
    (possibly mismatched) positive up directly. ``variant`` is h:

        log  −log(1 − p)          (the paper's default)
        gce  (1 − (1 − p)^q) / q  (between log, q → 0, and abs, q = 1)
        abs  p
        exp  exp(p) − 1
        tan  tan(π p / 2)
        infonce  −log p_ii        (plain InfoNCE on the positive: the non-robust reference)

    Summed over negatives, averaged over queries, the two directions added."""

    name = "rcl"

    def __init__(self, tau: float = 0.05, variant: str = "log", q: float = 0.5, mask_same_image: bool = True):
        super().__init__(mask_same_image)
        self.tau = _positive(tau, "tau")
        if variant not in RCL_VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(RCL_VARIANTS)}, got {variant!r}")
        self.variant, self.q = variant, _positive(q, "q")

    def value(self, batch: Batch) -> torch.Tensor:
        counted = batch.negatives | torch.eye(len(batch.scores), dtype=torch.bool, device=batch.scores.device)
        logits = (batch.scores / self.tau).masked_fill(~counted, -math.inf)
        return self._direction(logits, batch.negatives) + self._direction(logits.T, batch.negatives.T)

    def _direction(self, logits: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        log_p = torch.log_softmax(logits, dim=1)
        if self.variant == "infonce":
            return -log_p.diagonal().mean()
        p = log_p.exp()
        if self.variant == "log":
            cost = -(1 - p).clamp(min=1e-10).log()
        elif self.variant == "gce":
            cost = (1 - (1 - p).clamp(min=0) ** self.q) / self.q
        elif self.variant == "abs":
            cost = p
        elif self.variant == "exp":
            cost = p.exp() - 1
        else:  # tan
            cost = torch.tan(p.clamp(max=1 - 1e-6) * (math.pi / 2))
        return cost.masked_fill(~negatives, 0.0).sum(dim=1).mean()
