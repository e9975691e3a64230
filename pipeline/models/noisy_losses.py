"""Losses for training on noisy pairs (docs/PROTOCOL.md, "Noisy correspondence"): RCL's
complementary contrastive loss, DECL's evidential loss and NCR's co-teaching.

They are ``VseLoss`` subclasses on the batch's score matrix, so they train any network, dual or
pairwise. What NCR and DECL need beyond a batch is declared on the class and served by the
trainer (``training.trainer``), never by the loss reaching into it:

- ``networks`` (NCR: 2): the trainer builds that many copies of the network, trained together
  (``models.cotrain.CoTrained``); the loss gets their score matrices stacked, (k, B, B), and at
  test time their scores are averaged.
- ``sample_pass``: before each epoch the trainer runs the networks (eval mode, no gradient) over
  the training pairs in cache order, batches of the run's batch size, and hands the loss each
  pair's ``sample_statistic`` (NCR: its hinge loss under each network; DECL: its uncertainty),
  in the order of the training captions. ``begin_epoch`` turns them into per-sample state and
  the division of clean from noisy pairs, which the trainer measures against the noise index.
- Per-sample state lives in buffers of one entry per caption of the cache (``prepare``), keyed by
  the caption id the batch carries (``sample_ids``): it is in the loss's state dict, so the
  checkpoint holds it and a resumed run continues with it exactly.

Every formula here is read from the papers; the authors' code (XLearning-SCU/2023-TPAMI-RCL,
QinYang79/DECL, XLearning-SCU/2021-NeurIPS-NCR) was not reachable from this machine, so the
golden tests are against transcriptions of the papers' equations (tests/reference/noisy_loop.py),
not against their files. docs/PROTOCOL.md lists each choice the papers leave open.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from pipeline.models.losses import Batch, VseLoss, _finite, _hinge_costs, _is_int_at_least, _positive

RCL_VARIANTS = ("log", "gce", "abs", "exp", "tan", "infonce")
DECL_EVIDENCE_LOSSES = ("log", "digamma")


class NoisyPairLoss(VseLoss):
    """Base of the losses that need the trainer beyond a batch (see the module's text)."""

    networks = 1          # copies of the network trained together
    sample_pass = False   # wants ``sample_statistic`` of every training pair before each epoch

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


# ---------------------------------------------------------------------------- RCL


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


# ---------------------------------------------------------------------------- DECL


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


# ---------------------------------------------------------------------------- NCR


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


def _hardest_hinges(scores, negatives, margins) -> torch.Tensor:
    """(B,) per pair i: [m_i − S_ii + max_j S_ij]_+ + [m_i − S_ii + max_j S_ji]_+ over its negatives
    (zero in a direction with none)."""
    positive = scores.diagonal()
    hardest_caption = scores.masked_fill(~negatives, -math.inf).amax(dim=1)
    hardest_image = scores.masked_fill(~negatives, -math.inf).amax(dim=0)
    to_captions = (margins - positive + hardest_caption).clamp(min=0)
    to_images = (margins - positive + hardest_image).clamp(min=0)
    return (torch.where(negatives.any(1), to_captions, 0.0) + torch.where(negatives.any(0), to_images, 0.0))


def _counted(negatives):
    return negatives | torch.eye(len(negatives), dtype=torch.bool, device=negatives.device)


def _kl_to_uniform(alpha, counted) -> torch.Tensor:
    """(B,) KL(Dir(α_i) ‖ Dir(1)) over each row's counted entries."""
    ones = counted.to(alpha.dtype)
    k = ones.sum(1)
    a = torch.where(counted, alpha, torch.ones_like(alpha))
    total = (a * ones).sum(1)
    return (torch.lgamma(total) - torch.lgamma(k) - (torch.lgamma(a) * ones).sum(1)
            + ((a - 1) * (torch.digamma(a) - torch.digamma(total)[:, None]) * ones).sum(1))


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
