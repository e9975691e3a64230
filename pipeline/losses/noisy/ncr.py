"""``ncr``: NCR's co-teaching with soft margins (Huang et al., NeurIPS 2021; docs/PROTOCOL.md, "Noisy
correspondence"; the base class and the trainer's contract: ``pipeline.losses.noisy.base``).

The formulas are those of the authors' code (XLearning-SCU/2021-NeurIPS-NCR, NCR/model.py's
``ContrastiveLoss`` modes and ``SGRAF.train``/``predict``, NCR/co_train.py's ``warmup``, ``eval_train``,
``split_prob`` and ``train``); tests/test_ncr_golden.py compares this file to that code
(scripts/golden_ncr.py makes the bundles).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.core.values import declare
from pipeline.losses.base import Batch
from pipeline.losses.noisy.base import NoisyPairLoss, Phase

SOFT_MARGINS = ("exponential", "linear", "sin")  # their --soft_margin choices
SCHEDULES = ("alternate", "joint")


class NoisyCorrespondenceRectifier(NoisyPairLoss):
    """``ncr`` (NCR, NeurIPS 2021): co-teaching of two networks A and B with soft margins.

    Every hinge here is c_s[i, j] = [M_s[i, j] + S_ij − S_ii]_+ (image i's row) and
    c_im[i, j] = [M_im[i, j] + S_ij − S_jj]_+ (caption j's column), zero off the negatives (by
    default only the diagonal is left out, as theirs: ``mask_same_image`` false).

    ``schedule="alternate"`` (theirs; ``epoch_plan``), each epoch:
    - warm-up (``warmup_epochs`` epochs): A trains a whole pass over the pairs, then B does, on
      Σ_i mean_j c_s[i, j] + Σ_j mean_i c_im[i, j] at margin α (``warmup_sum``: the sums instead);
    - then, co-divide: before the epoch each network's per-pair loss mean_j c_s[i, j] +
      mean_j c_im[j, i] (eval mode, margin α) is min-max normalised and fitted by a GMM; w = the
      posterior of the low-mean component; judged clean: w > ``p_threshold`` (``split_prob``:
      when none is below it, the lowest 1 % are judged noisy);
    - co-rectify: A trains a pass over B's clean pairs (the labeled stream), B fixed in eval mode,
      then B over A's. Each step also takes a batch of the other network's noisy pairs (the
      unlabeled stream, cycled), which trains (a second optimizer step) only from co-training
      epoch (epochs − warmup_epochs) // 2 on (their ``epoch >= num_epochs // 2``). Labels: a clean
      pair's y = w + (1 − w)·p_own, a noisy pair's y = (p_A + p_B) / 2, with p = ``predict`` (eval
      mode); both streams train on the hardest negative, Σ_i max_j c_s + Σ_j max_i c_im, with
      margins α·s(y).
    - Their labels broadcast against the (B, B) matrix (``per_pair_labels`` false, the default):
      a clean batch's margin matrix is s(w_i + (1 − w_i)·p_j) in both directions (w by row, the
      prediction by column), a noisy batch's s(y_i) by row in both directions; ``per_pair_labels``
      gives each pair its own y_i: row i's hinges at s(y_i), column j's at s(y_j).
    ``schedule="joint"`` (vse's earlier reading): both networks train in every step on one batch
    of every pair, the sum of their losses; after the warm-up each pair's margin is α·s(w) when
    the other network's w > p_threshold, else α·s of the mean clamped positive score of both, in
    the hardest-negative hinge of both directions.

    Soft margin s(y): ``exponential`` (b^y − 1)/(b − 1), b = ``soft_margin_base`` (theirs: 10),
    ``linear`` y, ``sin`` sin(πy − π/2)/2 + 1/2. At test time the two networks' scores are
    averaged (``CoTrained``). The division reported each epoch is network A's."""

    name = "ncr"
    networks = 2
    sample_pass = True
    sample_pass_shuffled = True  # their eval_train reads the shuffled training loader

    @dataclass(frozen=True)
    class Options(NoisyPairLoss.Options):
        mask_same_image: bool = declare(False, "Theirs: only the diagonal is a positive.")
        margin: float = declare(0.2, "α, the margin every soft margin scales.", low=0)
        warmup_epochs: int = declare(1, "Epochs of warm-up (no division).", low=0)
        p_threshold: float = declare(0.5, "Judged clean: a clean probability (the GMM's posterior) above "
                                          "this.", low=0, high=1)
        soft_margin: str = declare("exponential", "s(y) (their --soft_margin).", choices=SOFT_MARGINS)
        soft_margin_base: float = declare(10.0, "b of the exponential soft margin (not 1).", above=0)
        schedule: str = declare("alternate", "alternate (theirs) or joint.", choices=SCHEDULES)
        per_pair_labels: bool = declare(False, "Each pair's margin from its own label (theirs broadcast).")
        warmup_sum: bool = declare(False, "The warm-up sums the hinges (theirs: row and column means).")

        def __post_init__(self):
            if self.soft_margin_base == 1:
                raise ValueError("soft_margin_base must not be 1")

    def __init__(self, **options):
        super().__init__(**options)
        self.base = self.soft_margin_base
        self.register_buffer("clean_probability", torch.ones(self.networks, 0, dtype=torch.float64))
        self.register_buffer("judged_clean", torch.ones(self.networks, 0, dtype=torch.bool))

    def starts(self) -> dict[str, int]:
        """Co-divide and co-rectify after the warm-up (the noisy stream then starts within the run:
        from co-training epoch (epochs - warmup_epochs) // 2)."""
        return {f"the co-divide and co-rectify (after warmup_epochs {self.warmup_epochs})":
                self.warmup_epochs} if self.warmup_epochs else {}

    def prepare(self, num_samples: int) -> None:
        if self.clean_probability.shape[1] != num_samples:
            shape, device = (self.networks, num_samples), self.clean_probability.device
            self.clean_probability = torch.ones(shape, dtype=torch.float64, device=device)
            self.judged_clean = torch.ones(shape, dtype=torch.bool, device=device)

    # ------------------------------------------------------------------ their ContrastiveLoss
    def soft_margins(self, labels: torch.Tensor) -> torch.Tensor:
        """α·s(y), s = ``soft_margin``."""
        if self.soft_margin == "linear":
            return self.margin * labels
        if self.soft_margin == "sin":
            return self.margin * (torch.sin(math.pi * labels - math.pi / 2) / 2 + 1 / 2)
        return self.margin * ((self.base ** labels - 1) / (self.base - 1))

    @staticmethod
    def costs(scores, negatives, margin_s, margin_im) -> tuple[torch.Tensor, torch.Tensor]:
        """(c_s, c_im), (B, B): the hinges of image i's row and of caption j's column, zero off the
        negatives; the margins are numbers or broadcast against (B, B)."""
        positive = scores.diagonal()
        cost_s = (margin_s + scores - positive[:, None]).clamp(min=0)
        cost_im = (margin_im + scores - positive[None, :]).clamp(min=0)
        return cost_s.masked_fill(~negatives, 0.0), cost_im.masked_fill(~negatives, 0.0)

    def warmup_value(self, scores, negatives) -> torch.Tensor:
        """Their mode "warmup": Σ_i mean_j c_s + Σ_j mean_i c_im at margin α (``warmup_sum``: sums)."""
        cost_s, cost_im = self.costs(scores, negatives, self.margin, self.margin)
        if self.warmup_sum:
            return cost_s.sum() + cost_im.sum()
        return cost_s.mean(1).sum() + cost_im.mean(0).sum()

    def per_pair_loss(self, scores, negatives) -> torch.Tensor:
        """Their mode "eval_loss", (B,): pair i's mean hinge of its row plus that of its column."""
        cost_s, cost_im = self.costs(scores, negatives, self.margin, self.margin)
        return cost_s.mean(1) + cost_im.mean(0)

    def predict(self, scores, negatives) -> torch.Tensor:
        """Their ``SGRAF.predict`` (mode "predict"), (B,): α − (mean row hinge + mean column hinge)/2,
        clamped to [0, α], divided by the mean of its B // 10 + 1 largest values, clamped to [0, 1].
        Where those are all 0 (theirs: 0/0), 0."""
        p = self.confidence(scores, negatives)
        top = p.topk(len(p) // 10 + 1).values.mean()
        return torch.where(top > 0, p / top, 0.0).clamp(0, 1)

    def confidence(self, scores, negatives) -> torch.Tensor:
        """(B,) α − (mean row hinge + mean column hinge)/2 at margin α, clamped to [0, α]: their
        ``predict`` before its normalisation (BiCro's ``predict_clean`` ranks its anchors by it)."""
        cost_s, cost_im = self.costs(scores, negatives, self.margin, self.margin)
        return (self.margin - (cost_s.mean(1) + cost_im.mean(0)) / 2).clamp(min=0, max=self.margin)

    def hardest_value(self, scores, negatives, labels_s, labels_im) -> torch.Tensor:
        """Their mode "train", hard_negative: Σ_i max_j c_s + Σ_j max_i c_im, margins α·s(labels)."""
        margins = self.soft_margins(labels_s), self.soft_margins(labels_im)
        cost_s, cost_im = self.costs(scores, negatives, *margins)
        return cost_s.amax(dim=1).sum() + cost_im.amax(dim=0).sum()

    # ------------------------------------------------------------------ the division
    def sample_statistic(self, scores, image_ids=None) -> torch.Tensor:
        negatives = self.pair_masks(scores.shape[1], image_ids, scores.device)[1]
        return torch.stack([self.per_pair_loss(s, negatives) for s in scores])

    def begin_epoch(self, epoch, sample_ids, statistics, seed):
        if epoch < self.warmup_epochs:
            return None
        ids = torch.as_tensor(sample_ids, device=self.clean_probability.device)
        for k in range(self.networks):
            state = int(np.random.SeedSequence([seed, epoch, k]).generate_state(1)[0])
            w, judged = divide(statistics[k], self.p_threshold, np.random.RandomState(state),
                               fit=self.clean_probabilities)
            self.clean_probability[k, ids] = torch.as_tensor(w, device=ids.device)
            self.judged_clean[k, ids] = torch.as_tensor(judged, device=ids.device)
        return (self.clean_probability[0, ids].cpu().numpy(), self.judged_clean[0, ids].cpu().numpy())

    def clean_probabilities(self, losses: np.ndarray, random_state) -> np.ndarray:
        """Each pair's clean probability from one network's per-pair losses: the GMM's posterior."""
        return gmm_clean_probability(losses, random_state)

    # ------------------------------------------------------------------ schedule "alternate"
    def epoch_plan(self, epoch, epochs, sample_ids):
        if self.schedule == "joint":
            return None
        if epoch < self.warmup_epochs:
            every = np.arange(len(sample_ids))
            return [Phase(k, "warmup", (every,)) for k in range(self.networks)]
        noisy_trains = epoch - self.warmup_epochs >= (epochs - self.warmup_epochs) // 2
        ids = torch.as_tensor(sample_ids, device=self.judged_clean.device)
        judged = self.judged_clean[:, ids].cpu().numpy()
        return [Phase(k, "clean+noisy" if noisy_trains else "clean",
                      (np.flatnonzero(judged[1 - k]), np.flatnonzero(~judged[1 - k])))
                for k in range(self.networks)]

    def phase_targets(self, phase, streams, predict):
        if phase.kind == "warmup":
            return [(0, None)]
        k = phase.member
        ids, image_ids = streams[0]
        own = self.predict(predict(k, 0), self.pair_masks(len(ids), image_ids, ids.device)[1])
        w = self.clean_probability[1 - k, ids.to(self.clean_probability.device)].to(own)
        if self.per_pair_labels:
            y = w + (1 - w) * own
            updates = [(0, (y[:, None], y[None, :]))]
        else:  # their (B, 1) probabilities times (B,) predictions: a (B, B) label matrix
            y = w[:, None] * 1 + (1 - w[:, None]) * own[None, :]
            updates = [(0, (y, y))]
        if phase.kind == "clean+noisy" and len(streams) > 1 and streams[1] is not None:
            ids, image_ids = streams[1]
            negatives = self.pair_masks(len(ids), image_ids, ids.device)[1]
            y = (self.predict(predict(k, 1), negatives) + self.predict(predict(1 - k, 1), negatives)) / 2
            updates.append((1, (y[:, None], y[None, :] if self.per_pair_labels else y[:, None])))
        return updates

    def phase_loss(self, phase, scores, target, image_ids=None):
        if scores.ndim != 2 or scores.shape[0] != scores.shape[1] or len(scores) == 0:
            raise ValueError(f"scores must be (B, B) with B >= 1, got {tuple(scores.shape)}")
        dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
        with torch.autocast(device_type=scores.device.type, enabled=False):
            scores = scores.to(dtype)
            negatives = self.pair_masks(len(scores), image_ids, scores.device)[1]
            if target is None:
                return self.warmup_value(scores, negatives)
            return self.hardest_value(scores, negatives, target[0].to(dtype), target[1].to(dtype))

    # ------------------------------------------------------------------ schedule "joint"
    def value(self, batch: Batch) -> torch.Tensor:
        """Both networks on one batch (``scored`` on stacked scores): the ``joint`` schedule's step."""
        stacked = batch.stacked
        total = 0
        for k in range(self.networks):
            if self.epoch < self.warmup_epochs:
                total = total + self.warmup_value(stacked[k], batch.negatives)
                continue
            if batch.sample_ids is None:
                margins = torch.full((len(stacked[k]),), self.margin, dtype=stacked.dtype,
                                     device=stacked.device)
            else:
                margins = self.soft_margins(self.labels(stacked, k, batch.sample_ids))
            total = total + _hardest_hinges(stacked[k], batch.negatives, margins).sum()
        return total

    def labels(self, stacked, k: int, sample_ids) -> torch.Tensor:
        """``joint``: network k's labels of the batch's pairs (their caption ids), from the other
        network's division: its w where judged clean, else the mean clamped positive score."""
        other = (k + 1) % self.networks
        known = self.clean_probability.shape[1]
        # on the CPU only: reading the range on a GPU would be a host sync every step
        if known == 0 or (sample_ids.device.type == "cpu" and len(sample_ids)
                          and not 0 <= int(sample_ids.min()) <= int(sample_ids.max()) < known):
            raise ValueError(f"sample_ids must be caption ids in [0, {known}) "
                             "(prepare(num_captions) sets the range)")
        w = self.clean_probability[other, sample_ids.to(self.clean_probability.device)]
        w = w.to(device=stacked.device, dtype=stacked.dtype)
        with torch.no_grad():
            predicted = stacked.detach().diagonal(dim1=1, dim2=2).clamp(0, 1).mean(0)
        return torch.where(w > self.p_threshold, w, predicted)


def _hardest_hinges(scores, negatives, margins) -> torch.Tensor:
    """(B,) per pair i: [m_i − S_ii + max_j S_ij]_+ + [m_i − S_ii + max_j S_ji]_+ over its negatives
    (zero in a direction with none): the ``joint`` schedule's hinge."""
    positive = scores.diagonal()
    hardest_caption = scores.masked_fill(~negatives, -math.inf).amax(dim=1)
    hardest_image = scores.masked_fill(~negatives, -math.inf).amax(dim=0)
    to_captions = (margins - positive + hardest_caption).clamp(min=0)
    to_images = (margins - positive + hardest_image).clamp(min=0)
    return (torch.where(negatives.any(1), to_captions, 0.0) + torch.where(negatives.any(0), to_images, 0.0))


def gmm_clean_probability(losses: np.ndarray, random_state=None) -> np.ndarray:
    """Their ``eval_train``'s split of one network: the per-pair losses min-max normalised, a
    two-component GMM (max_iter 10, tol 1e-2, reg_covar 5e-4; ``random_state`` as scikit-learn
    takes it: theirs passes none, so numpy's global state), and each pair's posterior of the
    component with the smaller mean. Every loss equal (theirs: 0/0, then the GMM refuses NaN):
    every pair 1."""
    from sklearn.mixture import GaussianMixture

    losses = np.asarray(losses, dtype=np.float64)
    span = losses.max() - losses.min()
    if not span > 0:
        return np.ones_like(losses)
    normed = (losses - losses.min()) / span
    gmm = GaussianMixture(n_components=2, max_iter=10, tol=1e-2, reg_covar=5e-4, random_state=random_state)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # NCR's 10 iterations often stop before sklearn's tolerance
        gmm.fit(normed[:, None])
        probability = gmm.predict_proba(normed[:, None])
    return probability[:, int(np.argmin(gmm.means_[:, 0]))]


def split_prob(probability: np.ndarray, threshold: float) -> np.ndarray:
    """Their ``split_prob``: judged clean where the probability > threshold; when every one is
    above it, the threshold becomes the (n // 100)-th smallest probability (the lowest 1 % noisy)."""
    probability = np.asarray(probability)
    if probability.min() > threshold:
        threshold = np.sort(probability)[len(probability) // 100]
    return probability > threshold


def divide(losses: np.ndarray, threshold: float, random_state=None,
           fit=None) -> tuple[np.ndarray, np.ndarray]:
    """(w, judged clean) of one network's per-pair losses, w by ``fit(losses, random_state)``
    (default: the GMM's). Every loss equal: w = 1 and every pair judged clean (nothing to rank;
    their code stops on the GMM's NaN input there)."""
    losses = np.asarray(losses, dtype=np.float64)
    w = (fit or gmm_clean_probability)(losses, random_state)
    if not losses.max() > losses.min():
        return w, np.ones(len(losses), dtype=bool)
    return w, split_prob(w, threshold)
