"""``decl``: DECL's evidential loss (docs/PROTOCOL.md, "Noisy correspondence", ``decl``; the base
class and the trainer's contract: ``pipeline.losses.noisy.base``). The default is the authors'
code (QinYang79/DECL, ``model/DECL.py``, ``model/SGRAF.py``, ``train.py``, ``opts.py``): the golden
bundles of tests/test_decl_golden.py (scripts/golden_decl.py) hold its values."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.core.values import declare
from pipeline.losses.base import Batch, with_positives
from pipeline.losses.noisy.base import NoisyPairLoss

DECL_EVIDENCE_LOSSES = ("mse", "log", "digamma")
DECL_CLEAN_RULES = ("evidence", "uncertainty")


class EvidentialLoss(NoisyPairLoss):
    """``decl`` (DECL, ACM MM 2022): deep evidential learning with the robust dynamic hinge.

    Scores T = tanh(S) (``score_is_sigmoid``: S = σ(raw) is read back as raw = logit S first);
    evidence e = exp(T / tau); image i is a Dirichlet over the batch's captions, α_i· = e_i· + 1,
    caption j one over the images, α_·j = e_·j + 1 (only counted pairs: the positive and the
    negatives). Per query, label y = 1 on its positive if the pair is judged clean, else 0 (all 1
    in the warm-up epochs, and in a call without ``sample_ids``):

    - evidence loss (``evidence_loss``): ``mse`` Σ_j (y_j − α_j/S)² + α_j(S − α_j)/(S²(S + 1))
      (theirs), ``log`` y_i (log S − log α_i), ``digamma`` y_i (ψ(S) − ψ(α_i)); plus
      ``kl_weight`` · KL(Dir(α̃) ‖ Dir(1)), α̃ = (α − 1)(1 − y) + 1 (× min(1, epoch /
      ``anneal_epochs``) when that is > 0). The mean over the queries of the two directions' sum.
    - robust dynamic hinge on T: per pair i, (the sum of image i's ``neg`` largest hinges
      [margin + T_ij − T_ii]_+ + caption i's over the images) / neg, summed over the clean pairs,
      × ``hinge_weight``. neg = max(int(batch_size − eta · step), mu), B − 1 when B < neg; ``step``
      counts the training calls (theirs: warm-up included), ``batch_size`` is the run's (None: the
      largest batch seen). Both live in the loss's state dict: a resumed run continues them.
    - the division, before each epoch after the warm-up: ``evidence`` (theirs) judges a pair clean
      when the argmax of its image's row of the joint evidence e + eᵀ is its own caption (clean
      score: that row's normalised entry); ``uncertainty``: u = K/S_i2t + K/S_t2i below the pass
      batch's mean (clean score −u).
    """

    name = "decl"
    sample_pass = True

    @dataclass(frozen=True)
    class Options(NoisyPairLoss.Options):
        mask_same_image: bool = declare(False, "Theirs: only the diagonal is a positive.")
        tau: float = declare(0.1, "The evidence's temperature.", above=0)
        margin: float = declare(0.2, "The robust dynamic hinge's margin.", low=0)
        hinge_weight: float = declare(0.8, "The hinge's weight (0: off).", low=0)
        kl_weight: float = declare(0.1, "The KL term's weight (0: off).", low=0)
        anneal_epochs: int = declare(0, "The KL weight grows over this many epochs (0: at once).", low=0)
        eta: float = declare(0.025, "The hardest-negative count shrinks by this per training call.", low=0)
        mu: int = declare(5, "The hardest-negative count's floor.", low=1)
        batch_size: int | None = declare(None, "The run's batch size (null: the largest batch seen).", low=1)
        warmup_epochs: int = declare(5, "Epochs every pair counts as clean.", low=0)
        evidence_loss: str = declare("mse", "The evidence loss.", choices=DECL_EVIDENCE_LOSSES)
        clean_rule: str = declare("evidence", "The division's rule.", choices=DECL_CLEAN_RULES)
        score_is_sigmoid: bool = declare(False, "The network's score is sigmoid(raw): read back as logit S.")

    def __init__(self, **options):
        super().__init__(**options)
        self.step, self.largest_batch = 0, 0  # the training calls so far, the largest batch they had
        self.register_buffer("clean", torch.ones(0, dtype=torch.bool))

    # ------------------------------------------------------------------ state
    def get_extra_state(self) -> dict:
        return {"step": self.step, "largest_batch": self.largest_batch}

    def set_extra_state(self, state: dict) -> None:
        self.step, self.largest_batch = int(state["step"]), int(state["largest_batch"])

    def prepare(self, num_samples: int) -> None:
        if len(self.clean) != num_samples:
            self.clean = torch.ones(num_samples, dtype=torch.bool, device=self.clean.device)

    # ------------------------------------------------------------------ the loss
    def raw(self, scores: torch.Tensor) -> torch.Tensor:
        """The score their evidence and hinge read: S, or logit S for a sigmoid score."""
        return torch.logit(scores, eps=1e-7) if self.score_is_sigmoid else scores

    def evidence(self, scores: torch.Tensor) -> torch.Tensor:
        """e = exp(tanh(raw) / tau) (their SGRAF.forward_sim's evidences)."""
        return torch.exp(torch.tanh(self.raw(scores)) / self.tau)

    def hardness(self, size: int, step: int) -> int:
        """neg: the hardest negatives each query sums at training call ``step`` (1-based)."""
        nominal = self.batch_size or max(self.largest_batch, size)
        neg = max(int(nominal - self.eta * step), self.mu)  # their float expression, truncated
        return size - 1 if size < neg else neg

    def warming_up(self) -> bool:
        return self.epoch < self.warmup_epochs

    def starts(self) -> dict[str, int]:
        """The division from the first epoch after the warm-up; the KL term, annealed, from epoch 1
        (``kl_scale`` is 0 at epoch 0)."""
        begins = {}
        if self.warmup_epochs:
            begins[f"the division into clean and noisy pairs (after warmup_epochs {self.warmup_epochs})"] = \
                self.warmup_epochs
        if self.anneal_epochs and self.kl_weight:
            begins[f"the KL term (annealed over anneal_epochs {self.anneal_epochs}, 0 in epoch 1)"] = 1
        return begins

    def value(self, batch: Batch) -> torch.Tensor:
        size = len(batch.scores)
        step = self.step + 1
        if torch.is_grad_enabled() and batch.scores.requires_grad:  # a training call: it counts
            self.step, self.largest_batch = step, max(self.largest_batch, size)
        counted = with_positives(batch.negatives)
        clean = self.judged_clean(batch)
        labels = torch.eye(size, dtype=torch.bool, device=clean.device) & clean[:, None]
        alpha = (self.evidence(batch.scores) + 1).masked_fill(~counted, 0.0)
        loss = (self._evidence(alpha, counted, labels) + self._evidence(alpha.T, counted.T, labels)).mean()
        neg = self.hardness(size, step)
        if self.hinge_weight and neg > 0:
            tanh = torch.tanh(self.raw(batch.scores))
            per_pair = robust_dynamic_hinge(tanh, batch.negatives, self.margin, neg)
            loss = loss + self.hinge_weight * (per_pair * clean.to(per_pair.dtype)).sum()
        return loss

    def judged_clean(self, batch: Batch) -> torch.Tensor:
        """(B,) bool: the division's verdict on the batch's pairs (all clean in the warm-up)."""
        size, device = len(batch.scores), batch.scores.device
        if self.warming_up() or batch.sample_ids is None:
            return torch.ones(size, dtype=torch.bool, device=device)
        known, ids = len(self.clean), batch.sample_ids
        # on the CPU only: reading the range on a GPU would be a host sync every step
        if known == 0 or (ids.device.type == "cpu" and size
                          and not 0 <= int(ids.min()) <= int(ids.max()) < known):
            raise ValueError(f"sample_ids must be caption ids in [0, {known}) "
                             "(prepare(num_captions) sets the range)")
        return self.clean[ids.to(self.clean.device)].to(device)

    def kl_scale(self) -> float:
        if not self.anneal_epochs:
            return self.kl_weight
        return self.kl_weight * min(1.0, self.epoch / self.anneal_epochs)

    def _evidence(self, alpha, counted, labels) -> torch.Tensor:
        """(B,) per query (row): the evidence loss of its Dirichlet α (uncounted entries 0)."""
        total = alpha.sum(1)
        y = labels.to(alpha.dtype)
        if self.evidence_loss == "mse":
            fit = ((y - alpha / total[:, None]) ** 2 * counted).sum(1) \
                + (alpha * (total[:, None] - alpha) / (total * total * (total + 1))[:, None]).sum(1)
        else:
            positive = alpha.diagonal()
            if self.evidence_loss == "log":
                fit = total.log() - positive.log()
            else:
                fit = torch.digamma(total) - torch.digamma(positive)
            fit = fit * y.diagonal()
        scale = self.kl_scale()
        if scale == 0:
            return fit
        wrong = torch.where(labels, torch.ones_like(alpha), alpha)  # α̃: the true positive's α set to 1
        return fit + scale * _kl_to_uniform(wrong, counted)

    # ------------------------------------------------------------------ the division
    def sample_statistic(self, scores, image_ids=None) -> torch.Tensor:
        """(2, B): clean score and verdict of each pair of one cache-order batch. Pairs of the same
        image (other than the positive) are left out: such batches group an image's captions,
        where the authors' shuffled ones rarely hold two pairs of one image."""
        scores = scores[0].double()
        size, device = len(scores), scores.device
        positives = torch.eye(size, dtype=torch.bool, device=device)
        if image_ids is None:
            counted = torch.ones_like(positives)
        else:
            ids = torch.as_tensor(image_ids, device=device)
            counted = (ids[:, None] != ids[None, :]) | positives
        evidence = self.evidence(scores).masked_fill(~counted, 0.0)
        if self.clean_rule == "evidence":
            joint = evidence + evidence.T
            norm = joint.diagonal() / joint.sum(1)
            judged = joint.masked_fill(~counted, -math.inf).argmax(1) == torch.arange(size, device=device)
            return torch.stack([norm, judged.to(norm.dtype)])
        alpha = (evidence + 1).masked_fill(~counted, 0.0)
        k = counted.sum(1).to(alpha.dtype)
        u = k / alpha.sum(1) + k / alpha.sum(0)
        return torch.stack([-u, (u < u.mean()).to(u.dtype)])

    def begin_epoch(self, epoch, sample_ids, statistics, seed):
        if epoch < self.warmup_epochs:
            return None
        judged = np.asarray(statistics[1]) > 0.5
        ids = torch.as_tensor(np.asarray(sample_ids), device=self.clean.device)
        self.clean[ids] = torch.as_tensor(judged, device=self.clean.device)
        return np.asarray(statistics[0], np.float64), judged


def robust_dynamic_hinge(scores, negatives, margin: float, neg: int) -> torch.Tensor:
    """(B,) their ``RDH_loss``: per pair i, (the sum of the ``neg`` largest hinges of image i over
    the captions + those of caption i over the images) / neg; non-negatives count 0."""
    positive = scores.diagonal()
    to_captions = (margin + scores - positive[:, None]).clamp(min=0).masked_fill(~negatives, 0.0)
    to_images = (margin + scores - positive[None, :]).clamp(min=0).masked_fill(~negatives, 0.0)
    return (to_captions.topk(neg, dim=1).values.sum(1) + to_images.topk(neg, dim=0).values.sum(0)) / neg


def _kl_to_uniform(alpha, counted) -> torch.Tensor:
    """(B,) KL(Dir(α_i) ‖ Dir(1)) over each row's counted entries (their ``KL``)."""
    ones = counted.to(alpha.dtype)
    k = ones.sum(1)
    a = torch.where(counted, alpha, torch.ones_like(alpha))
    total = (a * ones).sum(1)
    return (torch.lgamma(total) - torch.lgamma(k) - (torch.lgamma(a) * ones).sum(1)
            + ((a - 1) * (torch.digamma(a) - torch.digamma(total)[:, None]) * ones).sum(1))
