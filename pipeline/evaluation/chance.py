"""What random scores give: the rsum of chance for a split, its noise, and the one-line notes of a
result inside that noise or of a split too small for its recalls (issue 58: SGR at embed 64 ended
at test rsum 33.8, which is chance, with no word; a CSV split drew 10 test images, with no word).

The one place of these notes: `vse train` (the validation split at its start, the dev rsum at its
end), `vse evaluate` (a checkpoint, and --runs) and `vse report` (its mark) import them.

**The model of chance.** Every score of the split's N × M score matrix (N images, M = N·C
captions, C per image) is an independent draw of one continuous distribution: each ranking is a
uniformly random permutation. Then, with R@K in percent as docs/PROTOCOL.md defines it:

- image → text: an image's hit at K (one of its C captions among the top K of M) has probability
  p_K = 1 − C(M−C, K) / C(M, K) (hypergeometric);
- text → image: a caption's hit at K (its image among the top K of N) has probability q_K = K / N;
- the mean of rsum is 100 Σ_K (p_K + q_K), K ∈ {1, 5, 10}.

Its variance is exact too: the N image queries are independent of each other (disjoint rows),
so are the M caption queries (disjoint columns); an image query and a caption query share one
score, so each such pair adds a covariance, which is a one-dimensional integral over that shared
score (``_covariances``; numerical quadrature on a grid fine where the hits happen, near the top
score). With X and Y the hits at 1, 5 and 10 of one image query and of one caption query
(nested: Var X = Σ_a Σ_b p_min(a,b) − (Σ p)²), and Cov_A, Cov_B of an image and a caption
query that share a matching and a non-matching pair:

    Var(rsum) = 100² [Var X / N + Var Y / M + 2 (C · Cov_A + (M − C) · Cov_B) / M]

The covariances are not small: they add 30 % (N = 10) to 45 % (N = 1,000) to the variance the
independent terms give. tests/test_chance.py checks mean and spread against a brute-force
simulation of random score matrices. COCO's 5-fold protocol averages 5 independent folds: the
same mean, the spread / √5. A split whose images have unequal numbers of captions is computed
at the mean number (rounded): its mean and spread are then approximate.

**Within the noise.** A result is within the noise of chance when its rsum is below the mean of
chance plus ``NOISE_SDS`` standard deviations: random scores reach it in more than about 1 in 700
draws (normal approximation), so it shows nothing learnt, whatever its digits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from pipeline.evaluation.metric_table import RECALL_KS
from pipeline.evaluation.metrics import CAPTIONS_PER_IMAGE, COCO_FOLDS

NOISE_SDS = 3.0           # a result within this many standard deviations above chance is noise
SMALL_SPLIT_IMAGES = 100  # under this, one image query's R@1 step is over 1 point
_GRID = 2000              # quadrature points of the covariances (log-spaced near the top score)


@dataclass(frozen=True)
class Chance:
    """The rsum of random scores on a split: its mean and standard deviation."""

    images: int
    captions_per_image: float
    mean: float
    sd: float
    folds: int = 1

    def within_noise(self, rsum: float) -> bool:
        return rsum < self.mean + NOISE_SDS * self.sd

    def describe(self) -> str:
        per = (f"{self.captions_per_image:g} captions each" if float(self.captions_per_image).is_integer()
               else f"{self.captions_per_image:.1f} captions each on average")
        folds = f", the mean of {self.folds} folds" if self.folds > 1 else ""
        return f"{self.mean:.1f} ± {self.sd:.1f} for {self.images} images, {per}{folds}"

    def says(self, rsum: float, what: str = "rsum") -> str:
        """The words of a result within this noise (the notes' and `vse report`'s)."""
        return (f"{what} {rsum:.1f} is within the noise of chance ({self.describe()}; mean ± sd of random "
                "scores)")


def chance_rsum(images: int, captions: int | None = None, folds: int = 1) -> Chance:
    """The rsum of random scores on a split of ``images`` images and ``captions`` captions in all
    (default ``CAPTIONS_PER_IMAGE`` per image); ``folds``: the rsum is the mean of that many folds
    of this size."""
    captions = CAPTIONS_PER_IMAGE * images if captions is None else captions
    if images < 2 or captions < images:
        raise ValueError(f"chance needs at least 2 images and a caption each, got {images} and {captions}")
    mean, sd = _chance(images, max(1, round(captions / images)))
    return Chance(images, round(captions / images, 1), mean, sd / math.sqrt(folds), folds)


def chance_note(rsum: float, what: str, images: int, captions: int | None = None,
                folds: int = 1) -> str | None:
    """The line that says a result is within the noise of chance (None when it is not, or when
    the split is too small to have a chance level: under 2 images); ``what`` names the result
    ("test rsum", "dev rsum")."""
    if images < 2 or rsum is None or not math.isfinite(rsum):
        return None
    chance = chance_rsum(images, captions, folds)
    if not chance.within_noise(rsum):
        return None
    return f"note: {chance.says(rsum, what)}: this run learnt nothing measurable"


def small_split_note(images: int, split: str) -> str | None:
    """The line that says a split is too small for its recalls to move in steps under 1 point
    (None from ``SMALL_SPLIT_IMAGES`` images on)."""
    if images >= SMALL_SPLIT_IMAGES:
        return None
    return (f"note: the {split} split has {images} images, under {SMALL_SPLIT_IMAGES}: one R@1 step is then "
            f"{100 / images:.1f} points, so its recalls and rsum move in coarse steps")


def evaluation_notes(rsum: float, images: int, captions: int, split: str, protocol: str = "single",
                     what: str | None = None) -> list[str]:
    """The notes of an evaluation of ``images`` images and ``captions`` captions: a split too small,
    a result within the noise of chance (COCO's 5-fold protocol: folds of a fifth each)."""
    folds = COCO_FOLDS if protocol == "5fold" else 1
    size, per_fold = images // folds, captions // folds
    notes = [small_split_note(size, split + (" fold" if folds > 1 else "")),
             chance_note(rsum, what or f"{split} rsum", size, per_fold, folds)]
    return [note for note in notes if note]


def row_at_chance(row: dict, rsum: float | None = None) -> Chance | None:
    """A results row's (``vse evaluate --runs``, results.csv) chance, when its rsum is within its
    noise: from its ``images`` and ``protocol`` columns, ``CAPTIONS_PER_IMAGE`` captions each (a row
    does not record its captions; the mean of chance hardly depends on it). ``rsum``: the row's by
    default (a seed group's mean in a report). None otherwise."""
    rsum = row.get("rsum") if rsum is None else rsum
    try:
        rsum, images = float(rsum), int(float(row.get("images") or 0))
    except (TypeError, ValueError):
        return None
    folds = COCO_FOLDS if row.get("protocol") == "5fold" else 1
    if images // folds < 2 or not math.isfinite(rsum):
        return None
    chance = chance_rsum(images // folds, folds=folds)
    return chance if chance.within_noise(rsum) else None


def runs_notes(rows: list[dict], label: str = "run") -> list[str]:
    """`vse evaluate --runs`: a line for a split too small, and one naming the runs whose rsum is
    within the noise of chance (none, one or both)."""
    notes = []
    sizes = sorted({int(float(row["images"])) for row in rows if row.get("images")})
    if sizes and (note := small_split_note(sizes[0], str(rows[0].get("split") or "test"))):
        notes.append(note)
    at_chance = [(row, chance) for row in rows if (chance := row_at_chance(row)) is not None]
    if at_chance:
        names = ", ".join(f"{row.get(label)} ({float(row['rsum']):.1f})" for row, _ in at_chance)
        chances = "; ".join(dict.fromkeys(chance.describe() for _, chance in at_chance))
        notes.append(f"note: {len(at_chance)} of {len(rows)} runs have an rsum within the noise of chance "
                     f"({chances}; mean ± sd of random scores): {names}: they learnt nothing measurable")
    return notes


# ---------------------------------------------------------------------------- the formulas
@lru_cache(maxsize=64)
def _chance(images: int, per_image: int) -> tuple[float, float]:
    """(mean, sd) of rsum for ``images`` images with ``per_image`` captions each."""
    n, c = images, per_image
    m = n * c
    p = {k: _i2t_hit(m, c, k) for k in RECALL_KS}
    q = {k: min(k, n) / n for k in RECALL_KS}
    mean = 100 * sum(p[k] + q[k] for k in RECALL_KS)
    cov_a, cov_b = _covariances(n, c)
    variance = 100 ** 2 * (_nested_variance(p) / n + _nested_variance(q) / m
                           + 2 * (c * cov_a + (m - c) * cov_b) / m)
    return mean, math.sqrt(max(variance, 0.0))


def _i2t_hit(m: int, c: int, k: int) -> float:
    """P(one of an image's c captions is among the top k of m), random ranking."""
    if k >= m - c + 1:
        return 1.0
    log_miss = (math.lgamma(m - c + 1) - math.lgamma(m - c - k + 1)
                - math.lgamma(m + 1) + math.lgamma(m - k + 1))
    return 1.0 - math.exp(log_miss)


def _nested_variance(p: dict) -> float:
    """Var of Σ_K 1[hit at K] when the hits are nested (a hit at 1 is a hit at 5 and at 10)."""
    expected = sum(p.values())
    return sum(p[min(a, b)] for a in p for b in p) - expected ** 2


def _covariances(n: int, c: int) -> tuple[float, float]:
    """Cov(X, Y) of an image query and a caption query sharing one score: of a matching pair (A)
    and of a non-matching one (B). ``u`` is 1 − a score (the share of scores above it): a query's
    hits at K ≤ 10 depend on scores within ~10/M of the top, hence a grid log-spaced toward u = 0."""
    import numpy as np
    from scipy.stats import binom

    m = n * c
    u = np.concatenate([[0.0], np.geomspace(1e-4 / m, 1.0, _GRID)])

    def integral(values):  # ∫_0^1 over the grid (trapezoid), along the last axis
        return np.trapezoid(values, u, axis=-1)

    def tail(values):  # ∫_u^1 of values, at each grid point
        steps = (values[..., 1:] + values[..., :-1]) / 2 * np.diff(u)
        return np.concatenate([np.cumsum(steps[..., ::-1], axis=-1)[..., ::-1],
                               np.zeros(values.shape[:-1] + (1,))], axis=-1)

    ks = np.array(RECALL_KS)[:, None]
    # A: the shared score is the matching pair (image i, its caption j), u its share above.
    hits_given = binom.cdf(ks - 1, m - c, u)                            # image i's hit at K if u is its best
    others = (c - 1) * (1 - u) ** max(c - 2, 0) if c > 1 else np.zeros_like(u)  # density: best other caption
    head = integral(others * hits_given)[..., None] - tail(others * hits_given)  # ∫_0^u: another is its best
    x_a = ((1 - u) ** (c - 1) * hits_given + head).sum(axis=0)
    y_a = binom.cdf(ks - 1, n - 1, u).sum(axis=0)                       # caption j: n-1 other images
    cov_a = integral((x_a - integral(x_a)) * (y_a - integral(y_a)))
    # B: the shared score is a non-matching pair: among image i's other captions, and among caption
    # j's other images. Its effect: one more score above the query's truth when it is above it.
    best = c * (1 - u) ** (c - 1)                                       # density of image i's best caption
    one_x = binom.pmf(ks - 1, m - c - 1, u)                             # K-1 others above: on the edge
    x_b = -(tail(best * one_x) - integral(u * best * one_x)[..., None]).sum(axis=0)
    one_y = binom.pmf(ks - 1, n - 2, u)
    y_b = -(tail(one_y) - integral(u * one_y)[..., None]).sum(axis=0)
    cov_b = integral(x_b * y_b)
    return float(cov_a), float(cov_b)
