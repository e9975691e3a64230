"""``ncr``: NCR's co-teaching with soft margins (docs/PROTOCOL.md, "Noisy correspondence"; the base
class and the trainer's contract: ``pipeline.models.noisy_losses``)."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from pipeline.models.losses import Batch, _finite, _hinge_costs, _is_int_at_least, _positive
from pipeline.models.noisy_losses import NoisyPairLoss, _hardest_hinges


class NoisyCorrespondenceRectifier(NoisyPairLoss):
    """``ncr`` (NCR, NeurIPS 2021): co-teaching of two networks A and B with soft margins.

    - Warm-up (``warmup_epochs``): each network trains on every pair with VSE++'s hardest-negative
      hinge (margin α); ``warmup_sum``: with the sum of hinges over all negatives instead (as
      ``mh``'s ``warmup_epochs``, for a network whose hardest-negative start collapses).
    - Co-divide, before each later epoch: each network's per-pair loss (the hardest-negative hinge
      of both directions, in cache-order batches) is min-max normalised and fitted by a
      two-component GMM (scikit-learn; NCR's max_iter 10, tol 1e-2, reg_covar 5e-4, seeded by
      the run's seed and the epoch); w = the posterior of the low-mean component.
    - Co-rectify: network A trains on B's division and B on A's. A pair is clean when the other
      network's w > ``p_threshold``; its label is then that w. A noisy pair's label is the two
      networks' mean prediction of it, the positive's score clamped to [0, 1].
    - The soft margin of a pair with label y: α (m^y − 1) / (m − 1), m = ``soft_margin_base``
      (NCR's exponential margin), in the hardest-negative hinge of both directions.
    - At test time the two networks' scores are averaged (``CoTrained``).
    The division reported each epoch is network A's (w, w > p_threshold)."""

    name = "ncr"
    networks = 2
    sample_pass = True

    def __init__(self, margin: float = 0.2, warmup_epochs: int = 1, p_threshold: float = 0.5,
                 soft_margin_base: float = 10.0, warmup_sum: bool = False, mask_same_image: bool = True):
        super().__init__(mask_same_image)
        self.margin = _finite(margin, "margin")
        if not _is_int_at_least(warmup_epochs, 0):
            raise ValueError(f"warmup_epochs must be an integer >= 0, got {warmup_epochs!r}")
        self.warmup_epochs, self.p_threshold = warmup_epochs, _finite(p_threshold, "p_threshold")
        self.base = _positive(soft_margin_base, "soft_margin_base")
        if self.base == 1:
            raise ValueError("soft_margin_base must not be 1")
        self.warmup_sum = bool(warmup_sum)
        self.register_buffer("clean_probability", torch.ones(self.networks, 0, dtype=torch.float64))

    def prepare(self, num_samples: int) -> None:
        if self.clean_probability.shape[1] != num_samples:
            self.clean_probability = torch.ones(self.networks, num_samples, dtype=torch.float64,
                                                device=self.clean_probability.device)

    def soft_margin(self, labels: torch.Tensor) -> torch.Tensor:
        return self.margin * (self.base ** labels - 1) / (self.base - 1)

    def value(self, batch: Batch) -> torch.Tensor:
        stacked = batch.stacked
        total = 0
        for k in range(self.networks):
            if self.epoch < self.warmup_epochs and self.warmup_sum:
                to_captions, to_images = _hinge_costs(stacked[k], batch.negatives, self.margin)
                total = total + to_captions.sum() + to_images.sum()
                continue
            if self.epoch < self.warmup_epochs or batch.sample_ids is None:
                margins = torch.full((len(stacked[k]),), self.margin, dtype=stacked.dtype,
                                     device=stacked.device)
            else:
                margins = self.soft_margin(self.labels(stacked, k, batch.sample_ids))
            total = total + _hardest_hinges(stacked[k], batch.negatives, margins).sum()
        return total

    def labels(self, stacked, k: int, sample_ids) -> torch.Tensor:
        """Network k's labels of the batch's pairs (their caption ids), from the other network's
        division."""
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

    def sample_statistic(self, scores, image_ids=None) -> torch.Tensor:
        negatives = self.pair_masks(scores.shape[1], image_ids, scores.device)[1]
        margins = torch.full((scores.shape[1],), self.margin, dtype=scores.dtype, device=scores.device)
        return torch.stack([_hardest_hinges(s, negatives, margins) for s in scores])

    def begin_epoch(self, epoch, sample_ids, statistics, seed):
        if epoch < self.warmup_epochs:
            return None
        ids = torch.as_tensor(sample_ids, device=self.clean_probability.device)
        for k in range(self.networks):
            w = gmm_clean_probability(statistics[k], seed=[seed, epoch, k])
            self.clean_probability[k, ids] = torch.as_tensor(w, device=ids.device)
        w = self.clean_probability[0, ids].cpu().numpy()
        return w, w > self.p_threshold


def gmm_clean_probability(losses: np.ndarray, seed) -> np.ndarray:
    """NCR's split: per-sample losses min-max normalised, a two-component GMM (max_iter 10, tol
    1e-2, reg_covar 5e-4), and each sample's posterior of the component with the smaller mean."""
    from sklearn.mixture import GaussianMixture

    losses = np.asarray(losses, dtype=np.float64)
    span = losses.max() - losses.min()
    if not span > 0:  # every loss equal: nothing tells clean from noisy
        return np.ones_like(losses)
    normed = (losses - losses.min()) / span
    random_state = int(np.random.SeedSequence(seed).generate_state(1)[0])
    gmm = GaussianMixture(n_components=2, max_iter=10, tol=1e-2, reg_covar=5e-4, random_state=random_state)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # NCR's 10 iterations often stop before sklearn's tolerance
        gmm.fit(normed[:, None])
        probability = gmm.predict_proba(normed[:, None])
    return probability[:, int(np.argmin(gmm.means_[:, 0]))]


