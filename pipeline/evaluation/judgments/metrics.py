"""Agreement of a model's scores with human judgments (docs/PROTOCOL.md, "Human judgments").

Pure (arrays in, numbers out). The formulas are ``pipeline.evaluation.metrics``'s (Kendall's tau-b,
Spearman's rho, NDCG@K, the mean over defined queries); what is here is how the judged
pairs are grouped into queries, the plausible-match ranks, and the ``human_*`` keys, which
``pipeline.evaluation.metrics.METRICS`` names, formats and orders.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.core.similarity import caption_image_scores, image_caption_scores
from pipeline.evaluation.judgments.matching import MatchedJudgments
from pipeline.evaluation.metrics import (
    DIRECTIONS,
    RECALL_KS,
    is_metric,
    kendall_tau_b,
    mean_defined,
    metric_of,
    metric_order,
    ndcg,
    spearman,
)

NDCG_KS = (10,)
TAU_MIN_JUDGED = 3  # per query: at least this many judged candidates and 2 distinct grades


def grouped_kendall_tau_b(groups, x, y, min_size: int = TAU_MIN_JUDGED) -> tuple[np.ndarray, np.ndarray]:
    """``pipeline.evaluation.metrics.kendall_tau_b`` between ``x`` and ``y`` within each group: ``(group
    ids, tau)``, tau nan where the group has fewer than ``min_size`` items, fewer than 2
    distinct ``y``, or is undefined (all ``x`` tied, as scipy). Finite values."""
    groups, x, y = np.asarray(groups), np.asarray(x, np.float64), np.asarray(y, np.float64)
    ids, padded_x, padded_y, valid = _pad_groups(groups, x, y)
    counts = valid.sum(axis=1)  # each group's items fill its row's first columns
    tau = kendall_tau_b(torch.from_numpy(padded_x), torch.from_numpy(padded_y), counts).numpy()
    distinct_y = np.array([len(np.unique(row[m])) for row, m in zip(padded_y, valid)]) if len(ids) else counts
    tau[(counts < min_size) | (distinct_y < 2)] = np.nan
    return ids, tau


def grouped_ndcg(groups, scores, gains, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``pipeline.evaluation.metrics.ndcg`` (NDCG@k, ties against the query) of each group's items:
    ``(group ids, ndcg)``, nan where every gain of the group is 0."""
    ids, s, g, valid = _pad_groups(np.asarray(groups), np.asarray(scores, np.float64),
                                   np.asarray(gains, np.float64))
    return ids, ndcg(np.where(valid, s, -np.inf), np.where(valid, g, 0.0), k)


def _pad_groups(groups, *values):
    """(group ids, each value as a (G, L) array padded with 0, valid mask) with items in
    their original order inside each group."""
    order = np.argsort(groups, kind="stable")
    ids, inverse, counts = np.unique(groups[order], return_inverse=True, return_counts=True)
    width = int(counts.max()) if len(counts) else 0
    position = np.arange(len(order)) - (np.cumsum(counts) - counts)[inverse]
    padded = []
    for v in values:
        out = np.zeros((len(ids), width), dtype=np.float64)
        out[inverse, position] = v[order]
        padded.append(out)
    valid = np.zeros((len(ids), width), dtype=bool)
    valid[inverse, position] = True
    return (ids, *padded, valid)


def plausible_ranks(scores: torch.Tensor, match: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per query row: the 0-based rank of the best match (#non-matches scoring >= it), the
    R-precision (fraction of matches among the top R = #matches) and mAP@R (the mean over the
    top R of precision@i at each match: Musgrave et al.'s, as ECCV Caption), ties against the
    query (a match ranks after the non-matches of its score)."""
    best = scores.masked_fill(~match, -torch.inf).max(dim=1, keepdim=True).values
    rank = ((scores >= best) & ~match).sum(dim=1)
    by_match = torch.sort(match.to(torch.int8), dim=1, stable=True).indices  # non-matches first
    by_score = torch.sort(scores.gather(1, by_match), dim=1, descending=True, stable=True).indices
    ordered = match.gather(1, by_match.gather(1, by_score)).to(torch.int64)
    hits = ordered.cumsum(dim=1)
    relevant = match.sum(dim=1)
    positions = torch.arange(1, scores.shape[1] + 1, device=scores.device)
    precision_at_match = ordered * hits / positions
    map_r = (precision_at_match * (positions[None] <= relevant[:, None])).sum(dim=1) / relevant.clamp(min=1)
    return rank, hits.gather(1, (relevant - 1).clamp(min=0)[:, None])[:, 0] / relevant.clamp(min=1), map_r


def human_metrics(images, captions, caption_image, matched: MatchedJudgments, *, similarity: str = "cosine",
                  device=None, recall_ks=RECALL_KS, ndcg_ks=NDCG_KS, block: int = 1024) -> dict:
    """``human_metrics_of_scores`` of split embeddings: image→text scores ``image_caption_scores``,
    text→image ``caption_image_scores`` (``similarity``), each computed a block of judged queries at a
    time on ``device``."""
    device = torch.device("cpu") if device is None else torch.device(device)
    images = torch.as_tensor(np.asarray(images, dtype=np.float32), device=device)
    captions = torch.as_tensor(np.asarray(captions, dtype=np.float32), device=device)
    i2t = _ScoreRows(lambda q: image_caption_scores(images[q], captions, similarity), len(images), device)
    t2i = _ScoreRows(lambda q: caption_image_scores(captions[q], images, similarity), len(captions), device)
    return human_metrics_of_scores(i2t, t2i, caption_image, matched, device=device, recall_ks=recall_ks,
                                   ndcg_ks=ndcg_ks, block=block)


class _ScoreRows:
    """A score matrix whose rows are computed when indexed (``rows(q)``, ``q`` a tensor of row ids,
    moved to ``device``)."""

    def __init__(self, rows, length: int, device: torch.device):
        self.rows, self.length, self.device = rows, length, device

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, q):
        return self.rows(q.to(self.device))


def human_metrics_of_scores(i2t, t2i, caption_image, matched: MatchedJudgments, *, device=None,
                            recall_ks=RECALL_KS, ndcg_ks=NDCG_KS, block: int = 1024) -> dict:
    """Agreement of a model's scores with the judged pairs (docs/PROTOCOL.md, "Human judgments"):
    ``i2t`` the N images × M captions score matrix, ``t2i`` the M × N one (for plain scores its
    transpose; a re-scored row's corrected text→image matrix, ``pipeline.evaluation.command.
    rescored_metrics``), anything whose rows a tensor of row ids indexes (a tensor, an array); read a
    block of judged queries at a time, as float32 on ``device``. Each direction's ranks, tau and NDCG
    come from its own matrix (its judged pairs' scores, read in its rows), ``human_spearman`` from
    the image→text one. Keys ``human_{i2t,t2i}_{tau,ndcg@K,r@K,rprec,map@r}``, ``human_spearman`` and
    counts (``human_pairs``, ``human_unmatched``, ``human_{dir}_queries``, ``human_{dir}_tau_queries``)."""
    device = torch.device("cpu") if device is None else torch.device(device)
    i2t, t2i = (torch.from_numpy(m) if isinstance(m, np.ndarray) else m for m in (i2t, t2i))
    caption_image = torch.as_tensor(np.asarray(caption_image, dtype=np.int64), device=device)
    images, captions = len(i2t), len(t2i)
    result: dict = {}
    accepted_image = torch.as_tensor(matched.image[matched.accepted], device=device)
    accepted_caption = torch.as_tensor(matched.caption[matched.accepted], device=device)
    spearman_scores = None
    for direction, queries, gallery in (("i2t", matched.image, matched.caption),
                                        ("t2i", matched.caption, matched.image)):
        ids = np.unique(queries)
        pair_scores = np.empty(len(queries))
        acc_q, acc_c = ((accepted_image, accepted_caption) if direction == "i2t"
                        else (accepted_caption, accepted_image))
        local = torch.full((images if direction == "i2t" else captions,), -1, dtype=torch.int64,
                           device=device)
        ranks, rprec, map_r = [], [], []
        for a in range(0, len(ids), block):
            q = torch.as_tensor(ids[a:a + block])
            with torch.no_grad():
                scores = torch.as_tensor((i2t if direction == "i2t" else t2i)[q]).to(device).float()
                q = q.to(device)
                if direction == "i2t":
                    match = caption_image[None, :] == q[:, None]
                else:
                    match = torch.arange(images, device=device)[None, :] == caption_image[q][:, None]
                local.fill_(-1)
                local[q] = torch.arange(len(q), device=device)
                inside = local[acc_q] >= 0
                match[local[acc_q[inside]], acc_c[inside]] = True  # people accepted: a match too
                r, p, m = plausible_ranks(scores, match)
            ranks.append(r.cpu().numpy())
            rprec.append(p.cpu().numpy())
            map_r.append(m.cpu().numpy())
            in_block = np.isin(queries, ids[a:a + block])
            rows = np.searchsorted(ids[a:a + block], queries[in_block])
            pair_scores[in_block] = scores.cpu().numpy()[rows, gallery[in_block]]
        ranks, rprec, map_r = np.concatenate(ranks), np.concatenate(rprec), np.concatenate(map_r)
        for k in recall_ks:
            result[f"human_{direction}_r@{k}"] = 100.0 * float(np.mean(ranks < k))
        result[f"human_{direction}_rprec"] = 100.0 * float(np.mean(rprec))
        result[f"human_{direction}_map@r"] = 100.0 * float(np.mean(map_r))
        _, taus = grouped_kendall_tau_b(queries, pair_scores, matched.grades)
        result[f"human_{direction}_tau"] = mean_defined(taus)
        for k in ndcg_ks:
            _, per_query = grouped_ndcg(queries, pair_scores, matched.gains, k)
            result[f"human_{direction}_ndcg@{k}"] = mean_defined(per_query)
        result[f"human_{direction}_queries"] = len(ids)
        result[f"human_{direction}_tau_queries"] = int((~np.isnan(taus)).sum())
        if spearman_scores is None:
            spearman_scores = pair_scores
    result["human_spearman"] = spearman(spearman_scores, matched.grades)
    result["human_pairs"] = len(matched.image)
    result["human_unmatched"] = matched.unmatched
    return result


def format_human(metrics: dict) -> str:
    """The human-judgment lines of ``vse evaluate``'s table (empty when there are none): each
    direction's metrics in table order (``pipeline.evaluation.metrics.METRICS``), undefined ones n/a."""
    if "human_pairs" not in metrics:
        return ""
    spearman_metric = metric_of("human_spearman")
    lines = [f"human judgments: {metrics['human_pairs']} pairs"
             + (f" ({metrics['human_unmatched']} outside the split, left out)"
                if metrics["human_unmatched"] else "")
             + f", {spearman_metric.short} {spearman_metric.format(metrics['human_spearman'], 'n/a')}"]
    for direction, name in DIRECTIONS.items():
        keys = sorted((k for k in metrics if is_metric(k) and metric_of(k).group == "human"
                       and metric_of(k).direction == direction), key=metric_order)
        cells = [f"{metric_of(k).short} {metric_of(k).format(metrics[k], 'n/a')}" for k in keys]
        lines.append(f"  {name:11s} " + "  ".join(cells)
                     + f"  ({metrics[f'human_{direction}_queries']} queries, "
                       f"tau over {metrics[f'human_{direction}_tau_queries']})")
    return "\n".join(lines)
