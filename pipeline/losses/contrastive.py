"""The contrastive losses over a batch's softmax or sigmoid: ``mvn`` (multi-view NT-Xent over the
2B items, ConVSE's reference code), ``infonce`` (CLIP's loss, a learned scale) and ``siglip``
(SigLIP's sigmoid loss, a learned scale and bias).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from pipeline.core import values
from pipeline.core.values import declare
from pipeline.losses.base import Batch, VseLoss, with_positives


class MultiViewNTXentLoss(VseLoss):
    """``mvn``: NT-Xent over the 2B items (B images, B captions).

    Each item's positive is its pair's other modality; its negatives are the other 2B - 2
    items of both modalities (minus same-image items when masked).  The value is the mean
    over the 2B anchors, as ConVSE's reference code (``SimCLR_loss``): half the scale of
    ``csn``, which sums its two directions' means.
    """

    name = "mvn"

    needs_embeddings = True  # image–image and caption–caption terms: no score matrix holds them

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        tau: float = declare(0.1, "The temperature.", above=0)

    def value(self, batch: Batch) -> torch.Tensor:
        size = len(batch.img)
        items = torch.cat([batch.img, batch.cap])
        logits = (items @ items.T) / self.tau
        pair = torch.eye(size, dtype=torch.bool, device=items.device)
        positive = torch.zeros_like(pair).repeat(2, 2)
        positive[:size, size:] = pair
        positive[size:, :size] = pair
        excluded = (~batch.negatives).repeat(2, 2) & ~positive  # self and same-image items
        logits = logits.masked_fill(excluded, -math.inf)
        partner = (torch.arange(2 * size, device=items.device) + size) % (2 * size)  # each row's positive
        # a gather by index, not a boolean mask: no host sync (the same values, in the same order)
        terms = -torch.log_softmax(logits, dim=1).gather(1, partner[:, None])
        return terms.mean()


class CLIPInfoNCELoss(VseLoss):
    """``infonce`` (CLIP; open_clip's ``ClipLoss``): the mean of the two directions' cross-entropy
    of ``exp(t) · S`` with the diagonal as labels. The log-scale ``t`` is learned, starts at
    log(1/0.07) and is clamped to [0, log 100] after every optimiser step (``after_step``), as
    open_clip's training loop does (``max_scale`` >= 1, and 1 <= ``init_scale`` <= ``max_scale``).
    Same-image pairs are left out of the softmax unless
    ``mask_same_image=False`` (open_clip: they are negatives)."""

    name = "infonce"

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        init_scale: float = declare(1 / 0.07, "The learned scale's start, in [1, max_scale].")
        max_scale: float = declare(100.0, "The scale is clamped to [1, max_scale] after each step.", low=1)

    def __init__(self, **options):
        super().__init__(**options)
        self.max_log_scale, init_log_scale = _clamped_log_scale(self.init_scale, self.max_scale)
        self.logit_scale = nn.Parameter(torch.tensor(init_log_scale))

    def after_step(self) -> None:
        """After each optimiser step: the scale back into [1, max_scale]."""
        with torch.no_grad():
            self.logit_scale.clamp_(0, self.max_log_scale)

    def value(self, batch: Batch) -> torch.Tensor:
        logits = (self.logit_scale.to(batch.scores.dtype).exp() * batch.scores).masked_fill(
            ~with_positives(batch.negatives), -math.inf)
        to_captions = -torch.log_softmax(logits, dim=1).diagonal()
        to_images = -torch.log_softmax(logits, dim=0).diagonal()
        return (to_captions.mean() + to_images.mean()) / 2


class SigmoidPairLoss(VseLoss):
    """``siglip`` (SigLIP; open_clip's ``SigLipLoss``): ``-Σ_ij log σ(z_ij (exp(t') S_ij + b)) / B``,
    z = +1 on the diagonal and −1 elsewhere. ``t'`` starts at log 10, the bias ``b`` at −10, both
    learned; ``t'`` is clamped to [0, log 100] after every step as ``infonce``'s. Same-image pairs
    other than the diagonal are left out of the sum unless ``mask_same_image=False``."""

    name = "siglip"

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        init_scale: float = declare(10.0, "The learned scale's start, in [1, max_scale].")
        init_bias: float = declare(-10.0, "The learned bias's start.")
        max_scale: float = declare(100.0, "The scale is clamped to [1, max_scale] after each step.", low=1)

    def __init__(self, **options):
        super().__init__(**options)
        self.max_log_scale, init_log_scale = _clamped_log_scale(self.init_scale, self.max_scale)
        self.logit_scale = nn.Parameter(torch.tensor(init_log_scale))
        self.logit_bias = nn.Parameter(torch.tensor(self.init_bias))

    after_step = CLIPInfoNCELoss.after_step

    def value(self, batch: Batch) -> torch.Tensor:
        dtype = batch.scores.dtype
        logits = self.logit_scale.to(dtype).exp() * batch.scores + self.logit_bias.to(dtype)
        positives = torch.eye(len(logits), dtype=torch.bool, device=logits.device)
        signs = torch.where(positives, 1.0, -1.0).to(dtype)
        counted = positives | batch.negatives
        return -torch.nn.functional.logsigmoid(signs * logits).masked_fill(~counted, 0.0).sum() / len(logits)


def _clamped_log_scale(init_scale: float, max_scale: float) -> tuple[float, float]:
    """(log max_scale, log init_scale) of a learned logit scale kept in [1, max_scale] (``after_step``;
    max_scale >= 1 is declared): init_scale inside that range (one outside it would be moved after the
    first step)."""
    return math.log(max_scale), math.log(values.within(init_scale, "init_scale", low=1, high=max_scale))
