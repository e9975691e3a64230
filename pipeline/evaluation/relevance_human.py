"""`vse relevance-human`: relevance methods scored as predictors of human judgments
(docs/PROTOCOL.md, "Relevance methods scored by people").

The relevance of image q to caption p is the ladder loss's rule: the max over q's own
captions c != p of rel(c, p). Each judged pair gets that relevance from every method
(computed here on the split's captions, svd fitted on the training captions) and from every
stored relevance file of the cache, and the agreement with the grades is measured with the
formulas of ``pipeline.evaluation.metrics`` (tau-b per image, Spearman, ROC AUC). The report is JSON,
written through ``fsutil.guard_output`` with the format tag ``REPORT_FORMAT``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from pipeline.core.fsutil import guard_output, write_atomic
from pipeline.evaluation.judgments import (
    Judgments,
    MatchedJudgments,
    grouped_kendall_tau_b,
    match_rows,
    token_file_near,
)
from pipeline.evaluation.metrics import Metric, auc, mean_defined, spearman
from pipeline.relevance.batch import check_made_for
from pipeline.relevance.stage import DEFAULT_CBOW_THRESHOLD, compute_relevance_vectors
from pipeline.relevance.store import read_relevance
from pipeline.text.vectors import relevance_matrix

REPORT_FORMAT = "vse-relevance-human"  # the report's leading "format" item (fsutil.output_format)
RULE = "relevance(image q, caption p) = max over q's captions c != p of rel(c, p)"
# The columns of the printed table: measures of a relevance method, not of a model (those are
# pipeline.evaluation.metrics.METRICS); formatted alike.
AGREEMENT_COLUMNS = (
    Metric("tau", "tau (per image)", "tau", "both", "human", decimals=3),
    Metric("spearman", "Spearman", "Spearman", "both", "human", decimals=3),
    Metric("auc", "AUC", "AUC", "both", "human", decimals=3),
    Metric("auc_other", "AUC (other images' captions)", "AUC other", "both", "human", decimals=3),
)


def image_caption_relevance(rel_fn, caption_image, judged_captions, block: int = 4096) -> np.ndarray:
    """(N, U) relevance of each image to each judged caption by the ladder loss's rule: the max
    over the image's own captions c of rel(c, p), leaving out c = p (a caption is not scored
    by itself). ``rel_fn(rows, cols)`` → (len(rows), len(cols)) caption–caption relevance of
    split-local caption indices; ``caption_image`` (M,) maps captions to images."""
    caption_image = np.asarray(caption_image, dtype=np.int64)
    judged = np.asarray(judged_captions, dtype=np.int64)
    out = np.full((int(caption_image.max()) + 1, len(judged)), -np.inf)
    for a in range(0, len(caption_image), block):
        rows = np.arange(a, min(a + block, len(caption_image)))
        rel = np.asarray(rel_fn(rows, judged), dtype=np.float64)
        rel[rows[:, None] == judged[None, :]] = -np.inf
        np.maximum.at(out, caption_image[rows], rel)
    return out


def relevance_agreement(pair_relevance, matched: MatchedJudgments, caption_image) -> dict:
    """How well a relevance predicts the judgments: per-image tau-b and Spearman against the
    grades, ROC AUC of accepted vs rejected pairs (all pairs, and pairs whose caption belongs
    to another image)."""
    own = np.asarray(caption_image)[matched.caption] == matched.image
    _, taus = grouped_kendall_tau_b(matched.image, pair_relevance, matched.grades)
    return {"pairs": len(matched.image), "accepted": int(matched.accepted.sum()),
            "tau": mean_defined(taus), "tau_images": int((~np.isnan(taus)).sum()),
            "spearman": spearman(pair_relevance, matched.grades),
            "auc": auc(pair_relevance, matched.accepted),
            "other_pairs": int((~own).sum()), "other_accepted": int(matched.accepted[~own].sum()),
            "auc_other": auc(pair_relevance[~own], matched.accepted[~own])}


def format_relevance_agreement(results: dict) -> str:
    """A markdown table of ``{method: relevance_agreement(...)}`` (undefined values n/a)."""
    lines = ["| relevance | " + " | ".join(m.label for m in AGREEMENT_COLUMNS) + " |",
             "|:---|" + "---:|" * len(AGREEMENT_COLUMNS)]
    for name, r in results.items():
        lines.append(f"| {name} | " + " | ".join(m.format(r[m.key], "n/a") for m in AGREEMENT_COLUMNS) + " |")
    return "\n".join(lines)


def score_relevance_methods(judgments: Judgments, *, features=None, root=None, dataset_kind: str = "flickr8k",
                            split: str = "test", fit_splits=("train",), methods=(), relevance_files=(),
                            k: int = 400, cbow_threshold: float | None = None, seed: int = 0,
                            batch_size: int = 256, device="auto", out=None, overwrite: bool = False,
                            echo=print, command: str | None = None,
                            dataset_options: dict | None = None) -> dict:
    """`vse relevance-human`: each relevance method (computed here on the split's captions, svd
    fitted on ``fit_splits``) and each stored relevance file of ``features``' cache, scored
    by ``relevance_agreement`` with the ladder rule. Returns (and writes to ``out``, refused
    when it is an existing file other than such a report, unless ``overwrite``) a JSON-able
    report; undefined values are None."""
    if out is not None:  # before the minutes of computing, not after
        guard_output(out, REPORT_FORMAT, "a vse relevance-human report", overwrite)
    index, dataset_root = _caption_index(features, dataset_kind, root, dataset_options)
    image_rows, caption_rows, caption_image = index.split_rows(split)
    matched = match_rows(index, image_rows, caption_rows, judgments, token_file_near(dataset_root))
    echo(f"judgments: {matched.summary()}")
    judged = np.unique(matched.caption)
    column = np.searchsorted(judged, matched.caption)
    split_captions = [index.captions[r] for r in caption_rows]
    fit_rows = np.concatenate([index.split_rows(s)[1] for s in fit_splits] or [np.zeros(0, np.int64)])
    threshold = DEFAULT_CBOW_THRESHOLD if cbow_threshold is None else cbow_threshold

    def score(vectors, coarse=None, gate=None) -> dict:
        rel_fn = _relevance_fn(vectors, coarse, gate)
        pair = image_caption_relevance(rel_fn, caption_image, judged)[matched.image, column]
        return relevance_agreement(pair, matched, caption_image)

    results, seconds = {}, {}
    for method in methods:
        start = time.perf_counter()
        captions, fit = split_captions, np.zeros(0, dtype=np.int64)
        if method == "svd":
            captions = split_captions + [index.captions[r] for r in fit_rows]
            fit = np.arange(len(split_captions), len(captions))
        rv, _ = compute_relevance_vectors(captions, fit, method, k=k, seed=seed, device=device,
                                          batch_size=batch_size, cbow_threshold=threshold)
        n = len(split_captions)
        coarse = None if rv.coarse_vectors is None else rv.coarse_vectors[:n]
        results[method] = score(rv.vectors[:n], coarse, rv.cbow_threshold)
        seconds[method] = round(time.perf_counter() - start, 2)
        echo(f"{method}: tau {results[method]['tau']:.3f}, AUC {results[method]['auc']:.3f} "
             f"({seconds[method]} s)")
    for path in relevance_files:
        stored = read_relevance(path)
        check_made_for(stored, path, index.num_captions, index.fingerprint, features)
        name = f"{stored.method} ({Path(path).name})"
        results[name] = score(stored.vectors[caption_rows],
                              None if stored.coarse_vectors is None else stored.coarse_vectors[caption_rows],
                              stored.cbow_threshold)
    report = {"format": REPORT_FORMAT, "command": command, "judgments": str(judgments.path),
              "judgments_format": judgments.format, "threshold": judgments.threshold,
              "source": str(features or root), "split": split, "fit_splits": list(fit_splits),
              "pairs": len(matched.image), "unmatched": matched.unmatched, "rule": RULE,
              "methods": {name: {key: _defined(v) for key, v in r.items()} for name, r in results.items()},
              "seconds": seconds}
    if out is not None:
        text = json.dumps(report, indent=1, allow_nan=False, default=str) + "\n"
        write_atomic(out, text.encode("utf-8"))
    return report


def _defined(value):
    """NaN (an undefined measure) as None: JSON has no NaN."""
    return None if isinstance(value, float) and math.isnan(value) else value


def _relevance_fn(vectors, coarse=None, threshold=None):
    table = torch.from_numpy(np.asarray(vectors, dtype=np.float32))
    gate = None if coarse is None else torch.from_numpy(np.asarray(coarse, dtype=np.float32))

    def rel(rows, cols):
        rows, cols = torch.as_tensor(rows), torch.as_tensor(cols)
        return relevance_matrix(table[rows], table[cols], None if gate is None else gate[rows],
                                None if gate is None else gate[cols], threshold).numpy()

    return rel


def _caption_index(features, dataset_kind: str, root, dataset_options: dict | None = None):
    """The caption index of a feature cache, or of the cache `vse extract` would write for a
    dataset; and the dataset folder (where a token file may be)."""
    if features:
        from pipeline.data.cache import FeatureCache

        with FeatureCache(features) as cache:
            return cache.index, cache.attrs.get("dataset_root")
    from pipeline.data.readers import load_dataset

    dataset = load_dataset(dataset_kind, root, **(dataset_options or {}))
    return dataset.select()[1], str(dataset.root)
