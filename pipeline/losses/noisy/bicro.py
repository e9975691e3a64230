"""``bicro``: BiCro's soft correspondence labels from bidirectional cross-modal similarity
consistency (Yang et al., CVPR 2023; docs/PROTOCOL.md, "Noisy correspondence", ``bicro``) on NCR's
co-training (``pipeline.losses.noisy.ncr``, whose schedule, division and hinges it reuses; the
trainer's contract: ``pipeline.losses.noisy.base``).

The formulas are those of the authors' code (xu5zhao/BiCro: model.py's ``ContrastiveLoss`` modes
``warmup_sele`` and ``predict_clean``, ``SIM_PAIR``, ``SIM_SELE`` and ``SGRAF.predict``; co_train.py's
``train``); tests/test_bicro_golden.py compares this file to that code (scripts/golden_bicro.py
makes the bundle).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.core.values import declare
from pipeline.losses.noisy.ncr import NoisyCorrespondenceRectifier

DIVISIONS = ("gmm", "bmm")
BMM_CLIP = 1e-4   # their fit's clip of the losses into (0, 1)
BMM_FLOOR = 1e-12  # their eps_nan


class BidirectionalConsistency(NoisyCorrespondenceRectifier):
    """``bicro`` (BiCro, CVPR 2023): NCR's co-training (``schedule="alternate"``: warm-up, GMM
    co-divide, each network trained on the other's clean pairs, the other's noisy pairs from
    co-training epoch (epochs − warmup_epochs) // 2 on, hardest-negative hinges with soft margins
    α·s(y)), with BiCro's warm-up and labels:

    - warm-up (their ``warmup_sele``): per batch, the sum of the ⌊``warmup_rate``·B⌋ smallest
      per-pair losses (NCR's mean row hinge + mean column hinge, margin α);
    - labels, from the fixed (other) network in eval mode, per batch: anchors, the B // 10 + 1
      pairs of highest confidence (``confidence``: NCR's prediction before its normalisation;
      ties in a stable order), label 1. Every pair n: its image's most similar anchor image
      a (cosine), c_i2t = the ratio of cos(image n, image a) and cos(caption n, caption a), the
      smaller over the larger (their ``SIM_SELE``); c_t2i the same from the caption side. A clean
      pair's y = 0.5 + (c_i2t + c_t2i)/4, a noisy pair's (c_i2t + c_t2i)/2 (its anchors: its own
      batch's, see below); a value at or under ``noise_threshold`` becomes 0 (their noise_soft's
      ``--noise_tem``; 0, their default ``--noise_train train``: off); clamped to [0, 1].
    - their labels are a (B,) vector against the (B, B) hinges: caption j's label is the margin
      of every hinge of column j, in both directions (``per_pair_labels``: row i's hinges at
      s(y_i), column j's at s(y_j)). Their clean batch's labels go to the non-anchor pairs by
      position (their ``scatter_``: the k-th non-anchor pair takes the consistency of the batch's
      k-th pair); ``own_consistency`` gives each its own.
    - a step of the noisy stream trains before the clean stream's (theirs: ``loss_u``, then
      ``loss_l``), both labelled before either.
    - the division (``division``): NCR's GMM (their run.py's ``--fit_type gmm``) or their Beta
      mixture (``bmm``, their scripts'; ``bmm_clean_probability``).

    The image and caption vectors of the consistency: theirs are the network's mean region and
    mean word embeddings (``glo_emb``); a loss here sees the networks' scores only
    (``phase_targets``), so image n's vector is its row of the batch's scores less the row's mean
    and caption n's its column less its mean (``profiles``), and a noisy batch's anchors are its
    own (theirs: the clean batch's anchors, compared in embedding space). docs/PROTOCOL.md says
    why."""

    name = "bicro"

    @dataclass(frozen=True)
    class Options(NoisyCorrespondenceRectifier.Options):
        warmup_epochs: int = declare(10, "Epochs of warm-up (their --warmup_epoch).", low=0)
        schedule: str = declare("alternate", "NCR's alternate co-training (the only one BiCro has).",
                                choices=("alternate",))
        warmup_rate: float = declare(0.5, "The share of each warm-up batch's pairs, those of lowest loss, "
                                          "that train (their --warmup_rate).", above=0, high=1)
        noise_threshold: float = declare(0.0, "Labels at or under this become 0 (their --noise_tem under "
                                              "--noise_train noise_soft; 0: off, their default).", low=0,
                                         high=1)
        own_consistency: bool = declare(False, "Each non-anchor pair its own consistency (theirs: by "
                                               "position).")
        division: str = declare("gmm", "The clean probability: NCR's GMM (their --fit_type gmm, run.py) "
                                       "or their Beta mixture (bmm, their scripts).", choices=DIVISIONS)

        def __post_init__(self):
            super().__post_init__()
            if self.warmup_sum:
                raise ValueError("warmup_sum is NCR's warm-up; bicro's warm-up is warmup_rate's selection")

    def clean_probabilities(self, losses, random_state) -> np.ndarray:
        if self.division == "bmm":
            return bmm_clean_probability(losses)
        return super().clean_probabilities(losses, random_state)

    # ------------------------------------------------------------------ their ContrastiveLoss
    def warmup_value(self, scores, negatives) -> torch.Tensor:
        """Their mode ``warmup_sele``: the sum of the ⌊warmup_rate·B⌋ smallest per-pair losses."""
        per_pair = self.per_pair_loss(scores, negatives)
        return per_pair.topk(int(len(per_pair) * self.warmup_rate), largest=False).values.sum()

    def anchors(self, scores, negatives) -> tuple[torch.Tensor, torch.Tensor]:
        """Their mode ``predict_clean``: (anchor pairs, the others) by confidence, ascending."""
        order = torch.argsort(self.confidence(scores, negatives), stable=True)
        count = len(order) // 10 + 1
        return order[-count:], order[:-count]

    # ------------------------------------------------------------------ their SGRAF.predict
    def labels_of(self, scores, negatives, images, captions, noisy_images=None, noisy_captions=None):
        """(clean batch's labels, noisy batch's or None) from one network's eval-mode ``scores``
        of the clean batch, its pairs' image and caption vectors (B, D) and those of a noisy batch,
        compared with the clean batch's anchors."""
        anchor, rest = self.anchors(scores, negatives)
        consistency = 0.5 + bidirectional_consistency(images[anchor], captions[anchor], images, captions) / 2
        consistency = self._thresholded(consistency)
        y = torch.zeros(len(scores), dtype=scores.dtype, device=scores.device)
        y[anchor] = 1.0
        y[rest] = (consistency[rest] if self.own_consistency else consistency[:len(rest)]).clamp(0, 1)
        if noisy_images is None:
            return y.clamp(0, 1), None
        noisy = bidirectional_consistency(images[anchor], captions[anchor], noisy_images, noisy_captions)
        return y.clamp(0, 1), self._thresholded(noisy).clamp(0, 1)

    def _thresholded(self, y: torch.Tensor) -> torch.Tensor:
        return y * (y > self.noise_threshold) if self.noise_threshold else y

    # ------------------------------------------------------------------ NCR's phases, BiCro's labels
    def phase_targets(self, phase, streams, predict):
        if phase.kind == "warmup":
            return [(0, None)]
        other = 1 - phase.member  # their net2: fixed, eval mode
        updates = []
        if phase.kind == "clean+noisy" and len(streams) > 1 and streams[1] is not None:
            scores = predict(other, 1)
            negatives = self.pair_masks(len(scores), streams[1][1], scores.device)[1]
            images, captions = profiles(scores)
            noisy = self.labels_of(scores, negatives, images, captions, images, captions)[1]
            updates.append((1, self.margin_labels(noisy)))  # theirs: loss_u's step first
        scores = predict(other, 0)
        negatives = self.pair_masks(len(scores), streams[0][1], scores.device)[1]
        clean = self.labels_of(scores, negatives, *profiles(scores))[0]
        return updates + [(0, self.margin_labels(clean))]

    def margin_labels(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(labels of the row hinges, of the column hinges) for ``phase_loss``: theirs, caption j's
        label in column j of both; ``per_pair_labels``: row i's y_i, column j's y_j."""
        return (y[:, None] if self.per_pair_labels else y[None, :]), y[None, :]


def profiles(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, captions) vectors of a batch's pairs from its (B, B) scores: image i's row less its
    mean, caption j's column less its mean (their cosine is the correlation of two profiles)."""
    return scores - scores.mean(1, keepdim=True), scores.T - scores.T.mean(1, keepdim=True)


def bidirectional_consistency(anchor_images, anchor_captions, images, captions) -> torch.Tensor:
    """(n,) their (SIM_SELE(sim_img, sim_text) + SIM_SELE(sim_text, sim_img)) / 2: for each pair,
    the anchor nearest its image (cosine; ties: the first) gives r = cos(image) / cos(caption) to
    that anchor, the smaller of r and 1/r; then the same from the nearest anchor to its caption."""
    sim_images = _cosines(images, anchor_images)
    sim_captions = _cosines(captions, anchor_captions)
    return (_ratio_at_nearest(sim_images, sim_captions) + _ratio_at_nearest(sim_captions, sim_images)) / 2


def _cosines(items, anchors, eps: float = 1e-8) -> torch.Tensor:
    """(n, a) their ``SIM_PAIR``: dot products over the product of the norms, that clamped at eps."""
    norms = items.norm(dim=1)[:, None] * anchors.norm(dim=1)[None, :]
    return items @ anchors.T / norms.clamp(min=eps)


def _ratio_at_nearest(nearest_by, other) -> torch.Tensor:
    top, at = nearest_by.max(dim=1, keepdim=True)
    value = other.gather(1, at)
    ratio = top / value
    return torch.where(ratio < 1, ratio, value / top).squeeze(1)


def bmm_clean_probability(losses: np.ndarray, iterations: int = 10) -> np.ndarray:
    """Their ``eval_train`` under ``--fit_type bmm``: the per-pair losses min-max normalised, their
    ``BetaMixture1D`` (two Beta components starting at Beta(1, 2) and Beta(2, 1), weights 1/2;
    ``iterations`` EM steps of weighted moment matching on the losses clipped to [1e-4, 1 − 1e-4],
    responsibilities floored at 1e-12) and each pair's posterior of component 0 (the one starting
    at low losses), read at the clipped loss (theirs: at the unclipped one; see PROTOCOL). Every
    loss equal: every pair 1."""
    from scipy import stats

    losses = np.asarray(losses, dtype=np.float64)
    span = losses.max() - losses.min()
    if not span > 0:
        return np.ones_like(losses)
    x = np.clip((losses - losses.min()) / span, BMM_CLIP, 1 - BMM_CLIP)
    alphas, betas, weight = np.array([1.0, 2.0]), np.array([2.0, 1.0]), np.array([0.5, 0.5])

    def weighted(values):
        return np.array([weight[k] * stats.beta.pdf(values, alphas[k], betas[k]) for k in range(2)])

    with np.errstate(all="ignore"):  # as theirs: a degenerate fit gives NaN, not a stop
        for _ in range(iterations):
            r = weighted(x)
            r[r <= BMM_FLOOR] = BMM_FLOOR
            r /= r.sum(axis=0)
            for k in range(2):
                mean = np.sum(r[k] * x) / np.sum(r[k])
                variance = np.sum(r[k] * (x - mean) ** 2) / np.sum(r[k])
                alphas[k] = mean * ((mean * (1 - mean)) / variance - 1)
                betas[k] = alphas[k] * (1 - mean) / mean
            weight = r.sum(axis=1)
            weight /= weight.sum()
        likelihood = weighted(x)
        return likelihood[0] / (likelihood.sum(axis=0) + BMM_FLOOR)
