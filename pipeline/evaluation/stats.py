"""Seed noise and significance: the statistics behind `vse report` and `vse compare`.

Two questions, two tests (docs/PROTOCOL.md, "Seeds and significance"):

- Is configuration A better than configuration B, given several seeds of each?  Welch's
  one-sided t-test on the per-seed values (unequal variances; Welch 1947).  `vse report` bolds
  a column's best mean only when this test puts it above the runner-up at p < ``ALPHA``.
- Is run A better than run B on this test set?  A paired permutation (sign-flip) test over
  the test queries: each query's contribution to the metric difference keeps or flips its
  sign at random; the p-value is the share of flips whose |difference| reaches the observed
  one (two-sided), with the observed assignment counted (Phipson & Smyth 2010).

Pure numpy/scipy (metric names from pipeline.evaluation.metrics); no file I/O.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.evaluation.metrics import RECALL_KS, recall_key

ALPHA = 0.05                 # significance level of the bold marks in `vse report`
DEFAULT_PERMUTATIONS = 10_000
_PERMUTATION_BLOCK = 500


def mean_std(values) -> tuple[float, float, int]:
    """Mean, sample standard deviation (ddof = 1; NaN for one value) and count of the
    finite values."""
    values = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if len(values) == 0:
        return math.nan, math.nan, 0
    std = float(values.std(ddof=1)) if len(values) > 1 else math.nan
    return float(values.mean()), std, len(values)


def welch_greater(better, worse) -> float:
    """One-sided p-value of Welch's t-test that mean(better) > mean(worse); NaN when either
    side has fewer than two values.  Two samples with no spread at all are significantly
    different exactly when their means differ (p = 0), and not at all otherwise (p = 1)."""
    a = np.asarray(better, dtype=np.float64)
    b = np.asarray(worse, dtype=np.float64)
    if len(a) < 2 or len(b) < 2:
        return math.nan
    if a.var() == 0 and b.var() == 0:
        return 0.0 if a.mean() > b.mean() else 1.0
    from scipy.stats import ttest_ind

    return float(ttest_ind(a, b, equal_var=False, alternative="greater").pvalue)


def recall_hits(i2t_ranks, t2i_ranks) -> dict[str, np.ndarray]:
    """Per-query hit indicators (0/1 float64) of R@1/5/10 in each direction, keyed like the
    metrics (``i2t_r1`` …): R@K is 100 × their mean."""
    ranks = {"i2t": np.asarray(i2t_ranks), "t2i": np.asarray(t2i_ranks)}
    return {recall_key(d, k): (r < k).astype(np.float64) for d, r in ranks.items() for k in RECALL_KS}


def paired_permutation_test(ranks_a, ranks_b, permutations: int = DEFAULT_PERMUTATIONS,
                            seed: int = 0) -> dict[str, dict]:
    """Differences A − B of R@1/5/10 in both directions and of rsum, each with a two-sided
    p-value of the paired sign-flip test over the test queries.

    ``ranks_a``/``ranks_b`` are ``(i2t_ranks, t2i_ranks)`` of the two runs on the same split
    (the same images and captions in the same order).  For rsum, one sign per query flips all
    of that query's terms together (an image query's three i2t hits, a caption query's three
    t2i hits), so the test respects the pairing of the six recalls.
    """
    (a_i2t, a_t2i), (b_i2t, b_t2i) = ranks_a, ranks_b
    if len(a_i2t) != len(b_i2t) or len(a_t2i) != len(b_t2i):
        raise ValueError("the two runs were not evaluated on the same queries "
                         f"({len(a_i2t)}/{len(a_t2i)} vs {len(b_i2t)}/{len(b_t2i)})")
    if permutations < 1:
        raise ValueError(f"permutations must be >= 1, got {permutations}")
    hits_a, hits_b = recall_hits(a_i2t, a_t2i), recall_hits(b_i2t, b_t2i)
    diffs = {key: 100.0 * (hits_a[key] - hits_b[key]) for key in hits_a}
    null = {key: np.empty(permutations) for key in diffs}
    rng = np.random.default_rng(seed)
    for start in range(0, permutations, _PERMUTATION_BLOCK):  # bounded memory on 25k queries
        count = min(_PERMUTATION_BLOCK, permutations - start)
        signs = {direction: rng.integers(0, 2, (count, n), dtype=np.int8).astype(np.float64) * 2 - 1
                 for direction, n in (("i2t", len(a_i2t)), ("t2i", len(a_t2i)))}
        for key, d in diffs.items():
            null[key][start:start + count] = signs[key[:3]] @ d / len(d)
    out = {}
    for key, d in diffs.items():
        out[key] = {"a": float(100.0 * hits_a[key].mean()), "b": float(100.0 * hits_b[key].mean()),
                    "diff": float(d.mean()), "p": _two_sided_p(float(d.mean()), null[key])}
    rsum_null = sum(null.values())
    out["rsum"] = {"a": sum(v["a"] for v in out.values()), "b": sum(v["b"] for v in out.values()),
                   "diff": sum(v["diff"] for v in out.values())}
    out["rsum"]["p"] = _two_sided_p(out["rsum"]["diff"], rsum_null)
    return out


def _two_sided_p(observed: float, null: np.ndarray) -> float:
    # A small tolerance so that the observed assignment itself (and its exact mirror images,
    # computed in another summation order) always count as "at least as extreme".
    extreme = np.count_nonzero(np.abs(null) >= abs(observed) - 1e-9)
    return float((extreme + 1) / (len(null) + 1))
