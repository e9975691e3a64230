"""``crcl``: CRCL's active complementary loss with self-refining correspondence labels (Qin et
al., NeurIPS 2023; docs/PROTOCOL.md, "Noisy correspondence", ``crcl``; the base class and the
trainer's contract: ``pipeline.losses.noisy.base``). Equal to the authors' ``CRCL.train_self``
(QinYang79/CRCL, CRCL_NeurIPS23/model/CRCL.py) at its defaults (CRCL_NeurIPS23/opts.py); golden
test: tests/test_crcl_golden.py (scripts/golden_crcl.py makes the bundle)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pipeline.core.values import declare
from pipeline.losses.base import Batch, with_positives
from pipeline.losses.noisy.base import NoisyPairLoss


class ActiveComplementaryLoss(NoisyPairLoss):
    """``crcl`` (CRCL, NeurIPS 2023): per query (image i over the batch's captions, then caption i
    over the images) ``p_ij = exp(S_ij / tau) / (Σ_k exp(S_ik / tau) + eps)`` over its counted
    candidates, and each pair's soft correspondence label y_i (a buffer of one entry per caption,
    1 at first):

        loss = mean_i y_i (−log p_ii − log p'_ii)
             + negative_weight · mean_i [Σ_{j neg} tan p_ij / (Σ_j tan p_ij)^(1 − y_i) + (same of p')]

    (p' the caption direction). Self-refining labels (their ``--mc``, ``moving_labels``): with
    p̂_i = (p_ii + p'_ii) / 2 (no gradient), y_i = the stored label in the ``warmup_epochs`` first
    epochs, then ``alpha`` · stored + (1 − alpha) · p̂_i; a label under ``floor`` is set to 0
    (their ``--confident``, 0.1; 0: off); each training call stores y_i, but in the last warm-up
    epoch, which stores p̂_i. Without ``moving_labels`` y_i = p̂_i. A call without ``sample_ids``,
    or under no gradient, reads the labels and stores nothing (no ``sample_ids``: every label 1).

    - ``eps``: their 1e-10 in the softmax's denominator; in log space, so no overflow of
      exp(S / tau) (theirs overflows float32 at S / tau > 88).
    - ``mask_same_image``: false by default, as theirs (only the diagonal is a positive); true
      leaves same-image pairs out of the softmax and of both sums.
    - Their training restarts the network ``--schedules`` times (6,6,6,25: four rounds of
      warm-up + that many epochs, the labels carried over): not here; a run is one round."""

    name = "crcl"

    @dataclass(frozen=True)
    class Options(NoisyPairLoss.Options):
        mask_same_image: bool = declare(False, "Theirs: only the diagonal is a positive.")
        tau: float = declare(0.05, "The softmax temperature (their --tau).", above=0)
        alpha: float = declare(0.8, "The labels' momentum (their --alpha).", low=0, high=1)
        warmup_epochs: int = declare(2, "Epochs the labels are read, not refined (their --warm_epoch).",
                                     low=0)
        floor: float = declare(0.1, "A label under this becomes 0 (their --confident; 0: off).", low=0,
                               high=1)
        moving_labels: bool = declare(True, "Self-refining labels (their --mc); false: y = p.")
        negative_weight: float = declare(5.0, "The complementary term's weight (theirs: 5).", low=0)
        eps: float = declare(1e-10, "Their eps in the softmax's denominator.", low=0)

    def __init__(self, **options):
        super().__init__(**options)
        self.register_buffer("labels", torch.ones(0, dtype=torch.float64))

    def prepare(self, num_samples: int) -> None:
        if len(self.labels) != num_samples:
            self.labels = torch.ones(num_samples, dtype=torch.float64, device=self.labels.device)

    def starts(self) -> dict[str, int]:
        return ({f"the label refinement (after warmup_epochs {self.warmup_epochs})": self.warmup_epochs}
                if self.warmup_epochs and self.moving_labels else {})

    def value(self, batch: Batch) -> torch.Tensor:
        scores, negatives = batch.scores, batch.negatives
        counted = with_positives(negatives)
        logits = (scores / self.tau).masked_fill(~counted, -math.inf)
        log_p, log_p_t = self.log_probabilities(logits), self.log_probabilities(logits.T)
        with torch.no_grad():
            p_hat = (log_p.diagonal().exp() + log_p_t.diagonal().exp()) / 2
        y = self.refine(batch.sample_ids, p_hat, training=scores.requires_grad and torch.is_grad_enabled())
        positive = -(log_p.diagonal() + log_p_t.diagonal())
        complement = complementary(log_p, negatives, counted, y) + complementary(log_p_t, negatives.T,
                                                                                 counted.T, y)
        return (y * positive).mean() + self.negative_weight * complement.mean()

    def log_probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """log p of each row: logits − log(Σ_j exp(logits_ij) + eps)."""
        log_z = torch.logsumexp(logits, dim=1, keepdim=True)
        if self.eps:
            log_z = torch.logaddexp(log_z, log_z.new_tensor(math.log(self.eps)))
        return logits - log_z

    def refine(self, sample_ids, p_hat: torch.Tensor, training: bool) -> torch.Tensor:
        """(B,) this call's labels y (their ``y``), stored back when ``training``."""
        if sample_ids is None:
            return torch.ones_like(p_hat)
        known = len(self.labels)
        if known == 0 or (sample_ids.device.type == "cpu" and len(sample_ids)
                          and not 0 <= int(sample_ids.min()) <= int(sample_ids.max()) < known):
            raise ValueError(f"sample_ids must be caption ids in [0, {known}) "
                             "(prepare(num_captions) sets the range)")
        ids = sample_ids.to(self.labels.device)
        stored = self.labels[ids].to(p_hat)
        if not self.moving_labels:
            y = p_hat.clone()
        elif self.epoch < self.warmup_epochs:
            y = stored
        else:
            y = self.alpha * stored + (1 - self.alpha) * p_hat
        if self.moving_labels and self.floor:
            y = torch.where(y < self.floor, torch.zeros_like(y), y)
        if training:
            kept = p_hat if self.epoch == self.warmup_epochs - 1 else y
            self.labels[ids] = kept.to(self.labels)
        return y


def complementary(log_p: torch.Tensor, negatives: torch.Tensor, counted: torch.Tensor,
                  y: torch.Tensor) -> torch.Tensor:
    """(B,) per query (row) Σ_{j neg} tan p_ij / (Σ_{j counted} tan p_ij)^(1 − y_i) (their
    ``loss_neg`` of one direction; uncounted entries have p = 0, so tan p = 0 there)."""
    tan = torch.tan(log_p.exp().masked_fill(~counted, 0.0))
    return tan.masked_fill(~negatives, 0.0).sum(1) / tan.sum(1) ** (1 - y)
