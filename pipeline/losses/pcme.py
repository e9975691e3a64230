"""Probabilistic embeddings: ``pcme`` (PCME, Chun et al., CVPR 2021) and ``pcmepp`` (PCME++, Chun,
ICLR 2024), as their authors' criteria (naver-ai/pcmepp, ``pcmepp/criterions/pcme.py``: the
Monte-Carlo soft contrastive loss; ``pcmepp/criterions/pcmepp.py``: the closed-form sampled distance
loss). docs/PROTOCOL.md gives the formulas and every difference.

Each embedding is a Gaussian, handed over as one vector ``[μ, v]`` (two halves, v the
log-variance: ``core.similarity.gaussian_halves``); both losses declare the similarity ``csd``, so
the network carries a variance head (``networks.vse_model``) and evaluation, ``vse embed`` and
search score by PCME++'s closed-form sampled distance. The authors' code calls its variance
output ``std``: PCME++ reads it as log σ² (``exp(std)`` is a variance), PCME as log σ (``exp(std)``
is a standard deviation); here the head gives log σ² to both, and ``pcme`` reads log σ = v / 2.

Both learn a shift ``b`` and a scale ``a`` of the match logit ``-a·d + b`` (start 5, 5). Only the
diagonal is a positive; same-image pairs are negatives, as the authors' code on precomputed
features (``matched = eye``), unless ``mask_same_image=true`` leaves them out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from pipeline.core.similarity import gaussian_halves
from pipeline.core.values import declare
from pipeline.losses.base import Batch, VseLoss

VIB_CEILING = 10000.0  # the authors ignore a KL term above this ("prevent loss explosion")


def vib_kl(mean: torch.Tensor, log_sigma: torch.Tensor) -> torch.Tensor:
    """The authors' VIB term ``-½ mean(1 + s - μ² - exp(s))`` (their ``kl_divergence``), 0 above
    ``VIB_CEILING``."""
    kl = -0.5 * (1 + log_sigma - mean.square() - log_sigma.exp()).mean()
    return kl.new_zeros(()) if kl > VIB_CEILING else kl  # as theirs: a NaN passes


class _ProbabilisticLoss(VseLoss):
    """What both share: the similarity of Gaussian embeddings, the learned shift and scale, the
    VIB regulariser and which pairs count."""

    similarity = "csd"
    needs_embeddings = True  # reads means and variances, not only S

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        mask_same_image: bool = declare(False, "Leave same-image pairs out (the authors' code on "
                                               "precomputed features counts them as negatives).")
        init_shift: float = declare(5.0, "The learned shift b of the logit -a·d + b, its start.")
        init_negative_scale: float = declare(5.0, "The learned scale a of the logit -a·d + b, its start.")

    def __init__(self, **options):
        super().__init__(**options)
        self.shift = nn.Parameter(torch.tensor([float(self.init_shift)]))
        self.negative_scale = nn.Parameter(torch.tensor([float(self.init_negative_scale)]))

    def logits(self, distance: torch.Tensor) -> torch.Tensor:
        dtype = distance.dtype
        return -self.negative_scale.to(dtype) * distance + self.shift.to(dtype)

    def counted(self, batch: Batch) -> torch.Tensor:
        """(B, B) bool: the pairs the loss counts (the diagonal and the negatives)."""
        negatives = batch.negatives
        return negatives | torch.eye(len(negatives), dtype=torch.bool, device=negatives.device)

    def vib(self, img_mean, img_log_sigma, cap_mean, cap_log_sigma) -> torch.Tensor:
        if not self.vib_beta:
            return img_mean.new_zeros(())
        return self.vib_beta * (vib_kl(img_mean, img_log_sigma) + vib_kl(cap_mean, cap_log_sigma))


class PCMELoss(_ProbabilisticLoss):
    """``pcme``: the soft contrastive loss over ``num_samples``² sampled pairs (authors'
    ``MCSoftContrastiveLoss``): z = μ + ε·exp(log σ), d = ||z_i - z_c|| (squared: ``squared``),
    NLL_ic = log K² - logsumexp_k(m·s_k - logsumexp(s_k, -s_k)) of the logits s = -a·d + b, m = ±1;
    the value 2·Σ_ic NLL_ic (the sum over pairs, both directions at once) + β·VIB."""

    name = "pcme"

    @dataclass(frozen=True)
    class Options(_ProbabilisticLoss.Options):
        num_samples: int = declare(8, "Samples drawn per embedding (K; K² sampled pairs per pair).", low=1)
        vib_beta: float = declare(0.001, "Weight of the VIB (KL to a unit Gaussian) term "
                                         "(configs/others/pcme.yaml).", low=0)
        squared: bool = declare(False, "The squared distance (their prob_distance squared_l2); "
                                       "false: non-squared (non_squared_l2, their default).")

    def noise(self, count: int, dim: int, like: torch.Tensor) -> torch.Tensor:
        """(count, K, dim) standard normal draws, from torch's generator as the authors' code."""
        return torch.randn(count, self.num_samples, dim, dtype=like.dtype, device=like.device)

    def draws(self, log_variance: torch.Tensor) -> torch.Tensor:
        """The (B, K, E) draws ε of a side's items: ``noise``'s rows dealt to the items in the order
        of their log-variances' sums, so that an item's draws do not depend on where the batch
        holds it (a permutation of i.i.d. draws that does not depend on them leaves them i.i.d.:
        the authors' distribution, and a value invariant to the batch's order)."""
        raw = self.noise(len(log_variance), log_variance.shape[1], log_variance)
        rank = log_variance.detach().sum(-1).argsort().argsort()
        return raw[rank]

    def value(self, batch: Batch) -> torch.Tensor:
        img_mean, img_var = gaussian_halves(batch.img)
        cap_mean, cap_var = gaussian_halves(batch.cap)
        img_log_sigma, cap_log_sigma = img_var / 2, cap_var / 2  # their "std" is log σ
        img = img_mean[:, None] + self.draws(img_var) * img_log_sigma.exp()[:, None]  # (B, K, E)
        cap = cap_mean[:, None] + self.draws(cap_var) * cap_log_sigma.exp()[:, None]
        size, samples = len(img), self.num_samples
        # (B, B, K, K) squared distances of every sample of image i and caption c, by one product
        flat_img, flat_cap = img.flatten(0, 1), cap.flatten(0, 1)
        squared = (flat_img.square().sum(-1)[:, None] + flat_cap.square().sum(-1)[None]
                   - 2 * flat_img @ flat_cap.T).clamp(min=0)
        squared = squared.view(size, samples, size, samples).transpose(1, 2)
        distance = squared if self.squared else squared.sqrt()
        logits = self.logits(distance).flatten(2)  # (B, B, K²)
        diagonal = torch.eye(size, dtype=torch.bool, device=logits.device)
        sign = torch.where(diagonal, 1.0, -1.0).to(logits.dtype)
        evidence = logits * sign[..., None] - torch.stack((logits, -logits)).logsumexp(0)
        nll = math.log(logits.shape[-1]) - evidence.logsumexp(-1)
        loss = 2 * nll.masked_fill(~self.counted(batch), 0.0).sum()
        return loss + self.vib(img_mean, img_log_sigma, cap_mean, cap_log_sigma)


class PCMEppLoss(_ProbabilisticLoss):
    """``pcmepp``: binary cross-entropy of the match logit of the closed-form sampled distance
    d = ||μ_i - μ_c||² + Σ σ²_i + Σ σ²_c (authors' ``ClosedFormSampledDistanceLoss``), the mean over
    the B² pairs, doubled (both directions at once), + β·VIB + α·(the same BCE in each direction with
    every pair whose logit reaches the positive's counted as a positive: pseudo-positives)."""

    name = "pcmepp"

    @dataclass(frozen=True)
    class Options(_ProbabilisticLoss.Options):
        vib_beta: float = declare(0.0001, "Weight of the VIB (KL to a unit Gaussian) term "
                                          "(configs/pcmepp.yaml).", low=0)
        smoothness_alpha: float = declare(0.1, "Weight of the pseudo-positive terms (configs/pcmepp.yaml).",
                                          low=0)

    def value(self, batch: Batch) -> torch.Tensor:
        img_mean, img_var = gaussian_halves(batch.img)
        cap_mean, cap_var = gaussian_halves(batch.cap)
        mean_distance = (img_mean[:, None] - cap_mean[None]).square().sum(-1)
        spread = (img_var.exp()[:, None] + cap_var.exp()[None]).sum(-1)
        logits = self.logits(mean_distance + spread)
        counted = self.counted(batch)
        matched = torch.eye(len(logits), dtype=logits.dtype, device=logits.device)
        loss = 2 * self._bce(logits, matched, counted) + self.vib(img_mean, img_var, cap_mean, cap_var)
        if self.smoothness_alpha:
            to_captions = self._bce(logits, self._pseudo_positives(logits, matched), counted)
            to_images = self._bce(logits.T, self._pseudo_positives(logits.T, matched.T), counted.T)
            loss = loss + self.smoothness_alpha * (to_captions + to_images)
        return loss

    @staticmethod
    def _bce(logits, targets, counted) -> torch.Tensor:
        terms = nn.functional.binary_cross_entropy_with_logits(logits, targets, reduction="none")
        return terms.masked_fill(~counted, 0.0).sum() / counted.sum()

    @staticmethod
    def _pseudo_positives(logits, matched) -> torch.Tensor:
        """The authors' ``_recompute_matched``: every pair of a row whose logit reaches that row's
        positive's becomes a positive (with its label)."""
        labels, positive = matched.max(dim=1)
        reached = logits >= logits.gather(1, positive[:, None])
        return torch.where(reached, labels[:, None].expand_as(matched), matched)
