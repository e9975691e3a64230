"""The statistics of the evaluation: rank correlations, seed noise and significance.

Rank correlations (the general formulas CS@K and the human-judgment metrics share):
Kendall's tau-b (``kendall_tau_b``, batched over rows, exact integer counts) and Spearman's rho
(``spearman``). ``pipeline.evaluation.metrics`` re-exports both under their old names.

Seed noise and significance, behind `vse report` and `vse compare`: two questions, two tests
(docs/PROTOCOL.md, "Seeds and significance"):

- Is configuration A better than configuration B, given several seeds of each?  Welch's
  one-sided t-test on the per-seed values (unequal variances; Welch 1947).  `vse report` bolds
  a column's best mean only when this test puts it above the runner-up at p < ``ALPHA``.
- Is run A better than run B on this test set?  A paired permutation (sign-flip) test over
  the test queries: each query's contribution to the metric difference keeps or flips its
  sign at random; the p-value is the share of flips whose |difference| reaches the observed
  one (two-sided), with the observed assignment counted (Phipson & Smyth 2010).

Pure torch/numpy/scipy (metric names from pipeline.evaluation.metric_table); no file I/O.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from pipeline.evaluation.metric_table import RECALL_KS, recall_key

ALPHA = 0.05                 # significance level of the bold marks in `vse report`
DEFAULT_PERMUTATIONS = 10_000
_PERMUTATION_BLOCK = 500


# ---------------------------------------------------------------------------- rank correlations


def kendall_tau_b(x, y, lengths=None) -> torch.Tensor:
    """Kendall's tau-b (Kendall 1945, ties corrected; what scipy.stats.kendalltau returns)
    between ``x[r]`` and ``y[r]`` for each row r of two (rows, k) arrays of finite values: a
    (rows,) float64 tensor, nan where undefined (every x or every y of the row tied, or fewer
    than 2 items). ``lengths`` (rows,): row r holds only its first ``lengths[r]`` items (the
    rest is padding, ignored).

    Knight's O(k log k) form, as scipy computes it: with the n pairs sorted by (x, y)
    descending, n0 = n(n-1)/2 pairs, n1 / n2 / n3 pairs tied in x / in y / in both, and
    D = #{i < j: y_i < y_j} (the discordant pairs),
    tau-b = (n0 - n1 - n2 + n3 - 2 D) / sqrt((n0 - n1) (n0 - n2)).
    All counts are exact integers; memory is O(rows · k). Padding becomes (+inf, +inf): it
    sorts first, adds no discordant pair, and its p(p-1)/2 pairs tied among themselves (in x,
    in y, in both) are taken off again.
    """
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    k = x.shape[1]
    n = torch.full((x.shape[0],), k, dtype=torch.long, device=x.device)
    if lengths is not None:
        n = torch.as_tensor(lengths, dtype=torch.long, device=x.device)
        padding = torch.arange(k, device=x.device)[None, :] >= n[:, None]
        x, y = x.masked_fill(padding, math.inf), y.masked_fill(padding, math.inf)
    by_y = torch.sort(y, dim=1, descending=True, stable=True).indices
    by_x_then_y = by_y.gather(1, torch.sort(x.gather(1, by_y), dim=1, descending=True,
                                            stable=True).indices)
    x, y = x.gather(1, by_x_then_y), y.gather(1, by_x_then_y)
    padded_pairs = (k - n) * (k - n - 1) // 2
    x_changes = _changes(x)
    tied_x = _tied_pairs(x_changes) - padded_pairs
    tied_y = _tied_pairs(_changes(torch.sort(y, dim=1).values)) - padded_pairs
    tied_both = _tied_pairs(x_changes | _changes(y)) - padded_pairs
    pairs = n * (n - 1) // 2
    numerator = pairs - tied_x - tied_y + tied_both - 2 * _ascending_pairs(y)
    untied = ((pairs - tied_x) * (pairs - tied_y)).double()
    tau = numerator.double() / untied.sqrt()
    return torch.where(untied > 0, tau, torch.nan)


def spearman(x, y) -> float:
    """Spearman's rho: Pearson correlation of the average ranks (nan if either is constant)."""
    from scipy.stats import rankdata

    rx, ry = rankdata(x), rankdata(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = math.sqrt(float(rx @ rx) * float(ry @ ry))
    return float(rx @ ry) / denominator if denominator > 0 else math.nan


def _changes(values) -> torch.Tensor:
    """(q, k) bool: True where a run of equal values starts (always at column 0)."""
    starts = torch.ones_like(values, dtype=torch.bool)
    starts[:, 1:] = values[:, 1:] != values[:, :-1]
    return starts


def _tied_pairs(run_starts) -> torch.Tensor:
    """Pairs inside the same run, per row: sum over runs of c(c-1)/2."""
    position = torch.arange(run_starts.shape[1], device=run_starts.device).expand_as(run_starts)
    run_start = torch.where(run_starts, position, 0).cummax(dim=1).values
    return (position - run_start).sum(dim=1)


def _ascending_pairs(values) -> torch.Tensor:
    """#{i < j: values_i < values_j} per row, by merge-sort counting in log2(k) rounds.

    Round w compares the left and right halves of every block of 2w positions: each
    right element counts the left elements below it (a batched ``searchsorted`` into the
    sorted left half), so every pair i < j is counted once, in the round that splits it.
    """
    rows, k = values.shape
    size = 1 << max(0, k - 1).bit_length()
    padded = values.new_zeros(rows, size)
    padded[:, :k] = values  # the padding sits after every real value and is never counted
    real = torch.arange(size, device=values.device) < k
    total = torch.zeros(rows, dtype=torch.long, device=values.device)
    width = 1
    while width < size:
        blocks = padded.view(rows, size // (2 * width), 2, width)
        left = torch.sort(blocks[:, :, 0], dim=-1).values
        below = torch.searchsorted(left, blocks[:, :, 1].contiguous(), side="left")
        total += (below * real.view(-1, 2, width)[:, 1]).sum(dim=(1, 2))
        width *= 2
    return total


# ---------------------------------------------------------------------------- seeds and significance


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
