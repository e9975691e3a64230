"""The table of every metric's name (``METRICS``): what each metric is called in results, JSON,
printed tables and reports, its direction, group and format. Every command that computes, prints,
tabulates or compares metrics reads it; ``pipeline.evaluation.metrics`` (the formulas) re-exports
every name here, so ``from pipeline.evaluation.metrics import METRICS`` keeps working.

Plain Python: no torch, no numpy, no file I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

RECALL_KS = (1, 5, 10)

# The two retrieval directions, as keys name them and as tables print them.
DIRECTIONS = {"i2t": "image→text", "t2i": "text→image"}
METRIC_GROUPS = ("recall", "rank", "sum", "cs", "human", "count", "training", "hubness")


@dataclass(frozen=True)
class Metric:
    """One metric: every command that computes, prints, tabulates or compares metrics reads
    its name, headers, direction and format from ``METRICS``.

    ``key``: the name results carry (results.csv column, JSON key); ``{k}`` stands for the K
    of a family (``i2t_cs@{k}``: CS@100, CS@1000 …). ``label``: its column header in `vse
    report`'s tables. ``short``: its name in `vse evaluate`'s printed table. ``direction``:
    ``i2t`` (image→text, caption retrieval), ``t2i`` or ``both``. ``group``: one of
    ``METRIC_GROUPS`` (``recall`` R@K, ``rank`` median / mean rank, ``sum`` rsum and
    M-Recall, ``cs`` the coherent score, ``human`` agreement with people, ``count`` how many
    pairs or queries a human metric saw, ``training`` what the validation log says).
    ``decimals``: printed decimals; ``whole``: a whole value prints without them (a median
    rank; a mean of medians over folds or seeds keeps its decimal). ``in_json``: in `vse
    evaluate --json` (M-Recall, = rsum / 6, never was)."""

    key: str
    label: str
    short: str
    direction: str
    group: str
    higher_is_better: bool = True
    decimals: int = 1
    whole: bool = False
    in_json: bool = True

    def format(self, value, missing: str = "") -> str:
        """``value`` as tables print it; ``missing`` for None or NaN (undefined)."""
        if value is None or value != value:  # NaN, of any float type
            return missing
        if self.whole and float(value).is_integer():
            return f"{value:.0f}"
        return f"{value:.{self.decimals}f}"


def recall_key(direction: str, k: int) -> str:
    """The key of R@K in one direction (``i2t_r1``)."""
    return f"{direction}_r{k}"


def _retrieval_metrics(d: str) -> tuple[Metric, ...]:
    return (*(Metric(recall_key(d, k), f"R@{k}", f"R@{k}", d, "recall") for k in RECALL_KS),
            Metric(f"{d}_medr", "Med r", "medr", d, "rank", higher_is_better=False, whole=True),
            Metric(f"{d}_meanr", "Mean r", "meanr", d, "rank", higher_is_better=False))


def _human_metrics(direction: str) -> tuple[Metric, ...]:
    """docs/PROTOCOL.md, "Human judgments": tau-b, NDCG@K, plausible-match R@K, R-precision, mAP@R."""
    prefix = f"human_{direction}_"
    return (Metric(prefix + "tau", "tau", "tau", direction, "human", decimals=3),
            Metric(prefix + "ndcg@{k}", "NDCG@{k}", "ndcg@{k}", direction, "human", decimals=3),
            Metric(prefix + "r@{k}", "R@{k}", "r@{k}", direction, "human"),
            Metric(prefix + "rprec", "R-P", "rprec", direction, "human"),
            Metric(prefix + "map@r", "mAP@R", "mAP@R", direction, "human"))


def _human_counts(direction: str) -> tuple[Metric, ...]:
    return tuple(Metric(f"human_{direction}_{what}", what, what, direction, "count", decimals=0)
                 for what in ("queries", "tau_queries"))


METRICS: tuple[Metric, ...] = (
    *_retrieval_metrics("i2t"),
    *_retrieval_metrics("t2i"),
    Metric("rsum", "rsum", "rsum", "both", "sum"),
    Metric("mrecall", "M-Recall", "M-Recall", "both", "sum", decimals=2, in_json=False),
    # the skewness of N_10 over each direction's gallery (docs/PROTOCOL.md, "Re-scoring at test time")
    Metric("i2t_hubness", "Hubness", "hubness", "i2t", "hubness", higher_is_better=False, decimals=2),
    Metric("t2i_hubness", "Hubness", "hubness", "t2i", "hubness", higher_is_better=False, decimals=2),
    Metric("i2t_cs@{k}", "Caption CS@{k}", "i2t_cs@{k}", "i2t", "cs", decimals=3),
    Metric("t2i_cs@{k}", "Image CS@{k}", "t2i_cs@{k}", "t2i", "cs", decimals=3),
    *_human_metrics("i2t"),
    *_human_metrics("t2i"),
    Metric("human_spearman", "Spearman", "Spearman", "both", "human", decimals=3),
    *_human_counts("i2t"),
    *_human_counts("t2i"),
    Metric("human_pairs", "pairs", "pairs", "both", "count", decimals=0),
    Metric("human_unmatched", "unmatched", "unmatched", "both", "count", decimals=0),
    Metric("epochs_to_best", "Epochs to best", "epochs to best", "both", "training", higher_is_better=False,
           decimals=0),  # LSEH's efficiency measure: epochs to the best validation M-Recall
    # a noisy-pair method's division of the training pairs at the checkpoint's epoch, against the noise index
    Metric("division_auc", "Division AUC", "division AUC", "both", "training", decimals=3),
    Metric("division_precision", "Division P", "division P", "both", "training", decimals=3),
    Metric("division_recall", "Division R", "division R", "both", "training", decimals=3),
)
_BY_KEY = {m.key: m for m in METRICS}
_POSITION = {m.key: i for i, m in enumerate(METRICS)}


def metric_keys(*groups: str) -> tuple[str, ...]:
    """Keys of the table's metrics of ``groups``, in table order."""
    unknown = set(groups) - set(METRIC_GROUPS)
    if unknown:
        raise ValueError(f"unknown metric groups {sorted(unknown)}")
    return tuple(m.key for m in METRICS if m.group in groups)


def _family(key: str) -> tuple[str, int | None]:
    """(table key, K): ``i2t_cs@100`` → (``i2t_cs@{k}``, 100); ``rsum`` → (``rsum``, None)."""
    if key in _BY_KEY:
        return key, None
    family, at, k = key.rpartition("@")
    if at and k.isdigit() and f"{family}@{{k}}" in _BY_KEY:
        return f"{family}@{{k}}", int(k)
    return key, None


def is_metric(key: str) -> bool:
    """Whether ``key`` names a metric of the table (a family's member with its K included)."""
    return _family(key)[0] in _BY_KEY


def metric_of(key: str) -> Metric:
    """The definition of ``key``, with K filled in for a family's member (``i2t_cs@100``)."""
    family, k = _family(key)
    if family not in _BY_KEY:
        raise KeyError(f"{key!r} is not a metric of pipeline.evaluation.metrics.METRICS")
    found = _BY_KEY[family]
    if k is None:
        return found
    return replace(found, key=key, label=found.label.format(k=k), short=found.short.format(k=k))


def metric_order(key: str) -> tuple[int, int]:
    """Sort key of metric keys: table order, then K (``ndcg@10`` after ``tau``, R@5 before R@10)."""
    family, k = _family(key)
    return _POSITION[family], k or 0


# The retrieval metrics of one evaluation (``retrieval_metrics``), in results.csv's order.
METRIC_KEYS = metric_keys("recall", "rank", "sum")
