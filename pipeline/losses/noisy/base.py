"""Losses for training on noisy pairs (docs/PROTOCOL.md, "Noisy correspondence"): RCL's
complementary contrastive loss, DECL's evidential loss and NCR's co-teaching.

They are ``VseLoss`` subclasses on the batch's score matrix, so they train any network, dual or
pairwise. What NCR and DECL need beyond a batch is declared on the class and served by the
trainer (``training.trainer``), never by the loss reaching into it:

- ``networks`` (NCR: 2): the trainer builds that many copies of the network, trained together
  (``networks.cotrain.CoTrained``); the loss gets their score matrices stacked, (k, B, B), and at
  test time their scores are averaged.
- ``sample_pass``: before each epoch the trainer runs the networks (eval mode, no gradient) over
  the training pairs in cache order (or, with ``sample_pass_shuffled``, NCR's, in an order drawn
  from (seed, epoch)), batches of the run's batch size, and hands the loss each
  pair's ``sample_statistic`` (NCR: its mean hinges under each network; DECL: its uncertainty),
  in the order of the training captions. ``begin_epoch`` turns them into per-sample state and
  the division of clean from noisy pairs, which the trainer measures against the noise index.
- ``epoch_plan`` (NCR): the epoch as phases (``Phase``), each one network training on streams
  of pairs (NCR: A's pass over B's clean pairs with B's noisy ones cycled alongside, then B's);
  the trainer runs each step as ``phase_targets`` (eval mode, no gradient) then one optimizer
  step per update on ``phase_loss`` (``training.trainer.planned_step``). None: the usual epoch.
- Per-sample state lives in buffers of one entry per caption of the cache (``prepare``), keyed by
  the caption id the batch carries (``sample_ids``): it is in the loss's state dict, so the
  checkpoint holds it and a resumed run continues with it exactly.

``rcl`` is the authors' CCL (penghu-cs/RCL), golden-tested against their file
(tests/test_rcl_golden.py). ``ncr`` is the authors' NCR (XLearning-SCU/2021-NeurIPS-NCR),
golden-tested against their files (tests/test_ncr_golden.py); ``decl``: see its module.
docs/PROTOCOL.md lists what remains different.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.losses.base import VseLoss


@dataclass(frozen=True)
class Phase:
    """One pass of an epoch in a loss's ``epoch_plan``: network ``member`` trains, the others stay
    fixed (eval mode). Its steps walk ``streams[0]`` (positions into the training pairs) once, in
    batches of the run's size, in an order drawn from (seed, epoch, phase); each step also takes
    the next batch of every later stream, drawn the same way and drawn afresh when used up
    (NCR's unlabeled loader, cycled). The phase ends early at a batch of one pair (NCR's code
    breaks there: BatchNorm needs two). ``kind`` is the loss's own name for what the step does."""

    member: int
    kind: str
    streams: tuple = ()


class NoisyPairLoss(VseLoss):
    """Base of the losses that need the trainer beyond a batch (see the module's text)."""

    networks = 1          # copies of the network trained together
    sample_pass = False   # wants ``sample_statistic`` of every training pair before each epoch
    sample_pass_shuffled = False  # the pass's batches in an order drawn from (seed, epoch), not cache order

    def prepare(self, num_samples: int) -> None:
        """Told once, before a checkpoint is loaded: the number of captions in the cache (the
        range of ``sample_ids``). Per-sample buffers are made here."""

    def sample_statistic(self, scores: torch.Tensor, image_ids=None) -> torch.Tensor:
        """(rows, B): each pair's statistic in a batch of (k, B, B) scores (``sample_pass``)."""
        raise NotImplementedError

    def begin_epoch(self, epoch: int, sample_ids: np.ndarray, statistics: np.ndarray, seed: int):
        """The statistics of the training pairs (``sample_ids`` order) before ``epoch``: update the
        per-sample state; return (clean score, judged clean) per pair, or None (no division)."""
        return None

    def epoch_plan(self, epoch: int, epochs: int, sample_ids: np.ndarray) -> list[Phase] | None:
        """The phases of ``epoch`` (of ``epochs``; after ``begin_epoch``), or None: every network
        trains in each step on the epoch's batches of every pair (``scored`` on stacked scores).
        A plan is a function of the epoch and the loss's state, so a resumed run makes it again."""
        return None

    def phase_targets(self, phase: Phase, streams: list, predict) -> list:
        """Before a step of ``phase``: [(stream, target), ...], the updates of the step in order,
        each an optimizer step of ``phase.member`` on that stream's batch toward ``target``
        (``phase_loss``). ``streams``: (sample_ids, image_ids) of each stream's batch;
        ``predict(member, stream)``: that network's (B, B) scores of the batch, eval mode, no
        gradient."""
        raise NotImplementedError

    def phase_loss(self, phase: Phase, scores: torch.Tensor, target, image_ids=None) -> torch.Tensor:
        """The loss of one update: the trained network's (B, B) scores of the stream's batch."""
        raise NotImplementedError

    def forward(self, img_emb, cap_emb, image_ids=None, relevance=None, sample_ids=None) -> torch.Tensor:
        if self.networks > 1:
            raise ValueError(f"loss {self.name} trains {self.networks} networks together: it takes their "
                             f"stacked scores ({self.networks}, B, B) through scored(), not one pair of "
                             "embeddings")
        return self._embedded(img_emb, cap_emb, image_ids, relevance, sample_ids=sample_ids)

    def scored(self, scores, image_ids=None, relevance=None, sample_ids=None) -> torch.Tensor:
        """As ``VseLoss.scored``; with ``networks`` = k > 1, ``scores`` are the k networks' stacked
        (k, B, B) score matrices (``Batch.stacked``; ``Batch.scores`` is the first network's)."""
        if self.networks == 1:
            return self._scored(scores, image_ids, relevance, sample_ids=sample_ids)
        if scores.ndim != 3 or scores.shape[0] != self.networks or scores.shape[1] != scores.shape[2] \
                or scores.shape[1] == 0:
            raise ValueError(f"scores must be ({self.networks}, B, B) with B >= 1, got {tuple(scores.shape)}")
        return self._scored(scores[0], image_ids, relevance, stacked=scores, sample_ids=sample_ids)


def division_metrics(clean_score: np.ndarray, judged_clean: np.ndarray, truly_clean: np.ndarray) -> dict:
    """Precision and recall of the pairs judged clean, and the AUC of the clean score, against the
    noise index's truth. Undefined ones are None: no pair judged clean (precision), no clean pair
    (recall), one class only (AUC: every pair clean, a run without noise)."""
    judged, truth = np.asarray(judged_clean, bool), np.asarray(truly_clean, bool)
    hits = float(np.sum(judged & truth))
    precision = hits / int(judged.sum()) if judged.sum() else None
    recall = hits / int(truth.sum()) if truth.sum() else None
    if truth.all() or not truth.any():
        auc = None
    else:
        from sklearn.metrics import roc_auc_score

        auc = float(roc_auc_score(truth, np.asarray(clean_score, np.float64)))
    return {"division_precision": precision, "division_recall": recall, "division_auc": auc}

