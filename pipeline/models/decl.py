"""``decl``: DECL's evidential loss (docs/PROTOCOL.md, "Noisy correspondence"; the base class and
the trainer's contract: ``pipeline.models.noisy_losses``)."""

from __future__ import annotations

import math

import torch

from pipeline.models.losses import Batch, _finite, _is_int_at_least, _positive
from pipeline.models.noisy_losses import NoisyPairLoss, _counted

DECL_EVIDENCE_LOSSES = ("log", "digamma")


class EvidentialLoss(NoisyPairLoss):
    """``decl`` (DECL, ACM MM 2022): deep evidential learning on the batch.

    - Evidence ``e_ij = exp(tanh(S_ij) / tau)``; each image is a Dirichlet over the batch's
      captions, α = e + 1 (its row), and each caption one over the images (its column). Same-image
      pairs other than the diagonal are left out of both (as from every loss here).
    - The evidence loss of the true pair (``evidence_loss``): ``log``, ``log S − log α_ii``
      (Type-II likelihood), or ``digamma``, ``ψ(S) − ψ(α_ii)``; S = Σ_j α_ij.
    - KL(Dir(α̃) ‖ Dir(1)) on the wrong evidence (α̃: the positive's α set to 1), weighted
      ``min(1, epoch / anneal_epochs)``.
    - The robust dynamic hinge: per query, the sum of its ``k`` largest hinges
      ``[margin − S_ii + S_ij]_+``; k starts at all the negatives and halves every epoch
      (``topk_decay``) down to 1 (VSE0 → VSE++). After ``warmup_epochs`` it counts only the pairs
      judged clean: uncertainty ``u = K / S`` (both directions averaged) below the batch's mean.
    All terms are averaged over the queries of a direction, the two directions added.
    The division before each epoch: clean score −u, judged clean as in the batch rule."""

    name = "decl"
    sample_pass = True

    def __init__(self, tau: float = 0.05, margin: float = 0.2, evidence_loss: str = "log",
                 anneal_epochs: int = 10, warmup_epochs: int = 1, topk_decay: float = 0.5,
                 hinge_weight: float = 1.0, mask_same_image: bool = True):
        super().__init__(mask_same_image)
        self.tau, self.margin = _positive(tau, "tau"), _finite(margin, "margin")
        if evidence_loss not in DECL_EVIDENCE_LOSSES:
            raise ValueError(f"evidence_loss must be one of {', '.join(DECL_EVIDENCE_LOSSES)}, "
                             f"got {evidence_loss!r}")
        if not _is_int_at_least(anneal_epochs, 1) or not _is_int_at_least(warmup_epochs, 0):
            raise ValueError("anneal_epochs must be an integer >= 1 and warmup_epochs >= 0, got "
                             f"{anneal_epochs!r}, {warmup_epochs!r}")
        self.decay = _positive(topk_decay, "topk_decay")
        if self.decay > 1:
            raise ValueError(f"topk_decay must be in (0, 1], got {topk_decay!r}")
        self.evidence_loss, self.anneal_epochs = evidence_loss, anneal_epochs
        self.warmup_epochs = warmup_epochs
        self.hinge_weight = _finite(hinge_weight, "hinge_weight")

    def _alphas(self, scores, counted):
        """(α of each image over captions, α of each caption over images), uncounted entries 0."""
        evidence = torch.exp(torch.tanh(scores) / self.tau)
        alpha = (evidence + 1).masked_fill(~counted, 0.0)
        return alpha, alpha.T

    def uncertainty(self, scores, counted) -> torch.Tensor:
        """(B,) per pair: K / S averaged over its two directions."""
        alpha_i2t, alpha_t2i = self._alphas(scores, counted)
        k_i2t, k_t2i = counted.sum(1).to(scores.dtype), counted.T.sum(1).to(scores.dtype)
        return (k_i2t / alpha_i2t.sum(1) + k_t2i / alpha_t2i.sum(1)) / 2

    def topk(self, size: int) -> int:
        return max(1, int(math.floor((size - 1) * self.decay ** self.epoch)))

    def value(self, batch: Batch) -> torch.Tensor:
        scores = batch.scores
        counted = _counted(batch.negatives)
        alpha_i2t, alpha_t2i = self._alphas(scores, counted)
        weight = min(1.0, self.epoch / self.anneal_epochs)
        loss = self._evidence(alpha_i2t, counted, weight) + self._evidence(alpha_t2i, counted.T, weight)
        if self.hinge_weight:
            clean = torch.ones(len(scores), dtype=torch.bool, device=scores.device)
            if self.epoch >= self.warmup_epochs:
                with torch.no_grad():
                    u = self.uncertainty(scores, counted)
                    clean = u < u.mean()
            loss = loss + self.hinge_weight * self._hinge(scores, batch.negatives, clean)
        return loss

    def _evidence(self, alpha, counted, weight: float) -> torch.Tensor:
        total = alpha.sum(1)
        positive = alpha.diagonal()
        if self.evidence_loss == "log":
            fit = total.log() - positive.log()
        else:
            fit = torch.digamma(total) - torch.digamma(positive)
        if weight == 0:
            return fit.mean()
        eye = torch.eye(len(alpha), dtype=torch.bool, device=alpha.device)
        wrong = torch.where(eye, torch.ones_like(alpha), alpha)  # α̃: the positive's evidence removed
        return fit.mean() + weight * _kl_to_uniform(wrong, counted).mean()

    def _hinge(self, scores, negatives, clean) -> torch.Tensor:
        k = self.topk(len(scores))
        positive = scores.diagonal()
        to_captions = (self.margin + scores - positive[:, None]).clamp(min=0).masked_fill(~negatives, 0.0)
        to_images = (self.margin + scores - positive[None, :]).clamp(min=0).masked_fill(~negatives, 0.0)
        per_image = to_captions.topk(min(k, len(scores)), dim=1).values.sum(1)
        per_caption = to_images.topk(min(k, len(scores)), dim=0).values.sum(0)
        kept = clean.to(scores.dtype)
        return (per_image * kept).mean() + (per_caption * kept).mean()

    # the division: each pair's uncertainty in its (fixed) batch
    def sample_statistic(self, scores, image_ids=None) -> torch.Tensor:
        counted = _counted(self.pair_masks(scores.shape[1], image_ids, scores.device)[1])
        u = self.uncertainty(scores[0].double(), counted)
        return torch.stack([u, (u < u.mean()).to(u.dtype)])

    def begin_epoch(self, epoch, sample_ids, statistics, seed):
        return -statistics[0], statistics[1] > 0.5


def _kl_to_uniform(alpha, counted) -> torch.Tensor:
    """(B,) KL(Dir(α_i) ‖ Dir(1)) over each row's counted entries."""
    ones = counted.to(alpha.dtype)
    k = ones.sum(1)
    a = torch.where(counted, alpha, torch.ones_like(alpha))
    total = (a * ones).sum(1)
    return (torch.lgamma(total) - torch.lgamma(k) - (torch.lgamma(a) * ones).sum(1)
            + ((a - 1) * (torch.digamma(a) - torch.digamma(total)[:, None]) * ones).sum(1))


