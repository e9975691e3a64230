"""Retrieval metrics and the coherent score, exactly as ``docs/PROTOCOL.md`` defines them, and
the general formulas the human-judgment metrics share (NDCG@K, ROC AUC). The table of every
metric's name (``METRICS``) is ``metric_table``'s and the rank correlations (Kendall's tau-b,
Spearman's rho) are ``stats``'; both are re-exported here under their old names.

Pure torch/numpy, no file I/O.  Everything is vectorised over queries; the only Python
loops run over blocks of queries.  A score matrix of up to ``FULL_MATRIX_ELEMENTS`` (COCO
5K's 5,000 × 25,000) is computed once for both directions; larger ones are recomputed per
direction, ``block`` queries at a time, so memory stays bounded.  Work runs on the device
the caller picks (GPU when asked).

Conventions:

- ``images`` (N, D) and ``captions`` (M, D) are embeddings; the score of a pair is their
  inner product (cosine for L2-normalised embeddings) or, with ``similarity="order"``, the
  order-embedding score ``s(i, c) = -||max(0, c - i)||^2``; ``similarity="order-norm"`` is
  VSE++ code's unsquared ``-||max(0, c - i)||`` (``core.similarity``).
- ``caption_image`` (M,) maps each caption to its image; by default M = 5N and captions
  5k..5k+4 belong to image k.
- Ranks are 0-based and ties count against the query: a constant model ranks last.
- Scores are computed in float32 (float64 when the embeddings are float64).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from pipeline.core.errors import VseError
from pipeline.core.similarity import (  # noqa: F401 (SIMILARITIES, order_scores: re-exported)
    SIMILARITIES,
    caption_image_scores,
    image_caption_scores,
    order_scores,
    similarity_name,
)
from pipeline.evaluation.metric_table import (  # noqa: F401 (the table's names: re-exported)
    DIRECTIONS,
    METRIC_GROUPS,
    METRIC_KEYS,
    METRICS,
    RECALL_KS,
    Metric,
    is_metric,
    metric_keys,
    metric_of,
    metric_order,
    recall_key,
)
from pipeline.evaluation.stats import kendall_tau_b, spearman  # noqa: F401 (spearman: re-exported)

DEFAULT_BLOCK = 1024
# Score matrices up to this many elements (COCO 5K: 5,000 × 25,000) are computed once and
# serve both directions; larger ones are recomputed per direction in blocks.
FULL_MATRIX_ELEMENTS = 5000 * 25000
CAPTIONS_PER_IMAGE = 5
PROTOCOLS = ("single", "5fold", "5k")
COCO_FOLDS = 5
COCO_FOLD_SIZE = 1000
COCO_5K_IMAGES = 5000
# CS@K: which of the candidates tied in score at the K-th place are kept (lower / higher index).
TIE_BREAKS = ("low", "high")


# ---------------------------------------------------------------------------- ranks


def similarity_ranks(images, captions, caption_image=None, *, similarity: str = "cosine", order=None,
                     device=None, block: int = DEFAULT_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """0-based ranks ``(i2t, t2i)`` of the ground truth, ties counted against the query.

    ``i2t[k]`` = number of captions not of image k scoring >= the best caption of image k;
    ``t2i[j]`` = number of images other than caption j's image scoring >= that image.
    ``device`` defaults to the device of ``images`` when it is a tensor, else the CPU.
    """
    similarity = _old_order_keyword(similarity, order)
    device = _pick_device(images, device)
    images = _embeddings(images, "image", device)
    captions = _embeddings(captions, "caption", device, like=images)
    caption_image = _caption_index(caption_image, len(images), len(captions), device)
    block = _positive_block(block)
    if len(images) * len(captions) <= FULL_MATRIX_ELEMENTS:
        # Small enough to hold: one product serves both directions (half the work), and
        # both read the very same score values.
        scores = image_caption_scores(images, captions, similarity)
        i2t = _i2t_ranks(lambda a, b: scores[a:b], caption_image, len(images), block)
        truth = scores[caption_image, torch.arange(len(captions), device=scores.device)]
        at_least = torch.zeros(len(captions), dtype=torch.long, device=scores.device)
        for start in range(0, len(images), block):
            at_least += (scores[start:start + block] >= truth).sum(dim=0)
        return i2t.cpu().numpy(), (at_least - 1).cpu().numpy()  # minus the ground truth itself
    return (_i2t_ranks(lambda a, b: image_caption_scores(images[a:b], captions, similarity), caption_image,
                       len(images), block).cpu().numpy(),
            _t2i_ranks(images, captions, caption_image, similarity, block).cpu().numpy())


def _i2t_ranks(score_rows, caption_image, num_images, block):
    """``score_rows(a, b)`` gives the (b - a, M) scores of images a..b-1 against all captions."""
    by_image = torch.argsort(caption_image, stable=True)
    counts = torch.bincount(caption_image, minlength=num_images)
    # The captions of images start..stop-1 are by_image[first[start]:first[stop]].
    first = np.concatenate([[0], np.cumsum(counts.cpu().numpy())])
    ranks = torch.empty(num_images, dtype=torch.long, device=caption_image.device)
    for start in range(0, num_images, block):
        stop = min(start + block, num_images)
        scores = score_rows(start, stop)  # (b, M)
        truth = by_image[first[start]:first[stop]]
        row = caption_image[truth] - start
        truth_scores = scores[row, truth]
        best = torch.full((stop - start,), -math.inf, dtype=scores.dtype, device=scores.device)
        best.scatter_reduce_(0, row, truth_scores, reduce="amax")
        at_least_best = (scores >= best[:, None]).sum(dim=1, dtype=torch.int32)
        truth_at_least_best = torch.zeros_like(at_least_best).scatter_add_(
            0, row, (truth_scores >= best[row]).int())
        ranks[start:stop] = at_least_best - truth_at_least_best
    return ranks


def _t2i_ranks(images, captions, caption_image, similarity, block):
    num_captions = len(captions)
    ranks = torch.empty(num_captions, dtype=torch.long, device=images.device)
    for start in range(0, num_captions, block):
        stop = min(start + block, num_captions)
        scores = caption_image_scores(captions[start:stop], images, similarity)  # (b, N)
        truth_scores = scores.gather(1, caption_image[start:stop, None])
        # Minus one: the ground truth itself.
        ranks[start:stop] = (scores >= truth_scores).sum(dim=1, dtype=torch.int32) - 1
    return ranks


def score_ranks(i2t_scores, t2i_scores, caption_image=None, *, block: int = DEFAULT_BLOCK
                ) -> tuple[np.ndarray, np.ndarray]:
    """0-based ranks ``(i2t, t2i)`` of the ground truth, as ``similarity_ranks``, from two given score
    matrices, one per direction: ``i2t_scores`` (N images × M captions) and ``t2i_scores`` (M × N),
    e.g. each direction re-scored on its own (``rescore``); ties count against the query."""
    i2t_scores = _finite_matrix(i2t_scores, "image→text scores")
    t2i_scores = _finite_matrix(t2i_scores, "text→image scores", like=i2t_scores)
    num_images, num_captions = i2t_scores.shape
    if tuple(t2i_scores.shape) != (num_captions, num_images):
        raise VseError(f"text→image scores must be {num_captions} × {num_images} (the image→text "
                       f"scores transposed), got {tuple(t2i_scores.shape)}")
    caption_image = _caption_index(caption_image, num_images, num_captions, i2t_scores.device)
    block = _positive_block(block)
    i2t = _i2t_ranks(lambda a, b: i2t_scores[a:b], caption_image, num_images, block)
    t2i = torch.empty(num_captions, dtype=torch.long, device=i2t_scores.device)
    for start in range(0, num_captions, block):
        rows = t2i_scores[start:start + block]
        truth = rows.gather(1, caption_image[start:start + block, None])
        t2i[start:start + block] = (rows >= truth).sum(dim=1) - 1  # minus the ground truth itself
    return i2t.cpu().numpy(), t2i.cpu().numpy()


def hubness_metrics(i2t_scores, t2i_scores=None) -> dict[str, float]:
    """``i2t_hubness`` and ``t2i_hubness``: the skewness of N_10 (``rescore.hubness``, docs/PROTOCOL.md)
    of each direction's score matrix, ``i2t_scores`` (N images × M captions: which captions are hubs)
    and ``t2i_scores`` (M × N, default its transpose: which images); a direction whose gallery has
    under 10 items has no N_10 and is left out."""
    from pipeline.evaluation.rescore import HUBNESS_K, hubness

    i2t_scores = torch.as_tensor(i2t_scores)
    t2i_scores = i2t_scores.T if t2i_scores is None else torch.as_tensor(t2i_scores)
    directions = (("i2t", i2t_scores), ("t2i", t2i_scores))
    return {f"{direction}_hubness": hubness(scores) for direction, scores in directions
            if scores.shape[1] >= HUBNESS_K}


# ---------------------------------------------------------------------------- metrics


def retrieval_metrics(i2t_ranks, t2i_ranks) -> dict[str, float]:
    """R@1/5/10, medr, meanr per direction, rsum and mrecall (= rsum / 6), plain floats."""
    metrics = {}
    for direction, ranks in (("i2t", i2t_ranks), ("t2i", t2i_ranks)):
        ranks = np.asarray(ranks)
        if ranks.ndim != 1 or ranks.size == 0:
            raise VseError(f"{direction} ranks must be a non-empty 1-D array, "
                           f"got shape {ranks.shape}")
        for k in RECALL_KS:
            metrics[recall_key(direction, k)] = 100.0 * int(np.count_nonzero(ranks < k)) / ranks.size
        metrics[f"{direction}_medr"] = float(np.floor(np.median(ranks)) + 1)
        metrics[f"{direction}_meanr"] = float(np.mean(ranks) + 1)
    metrics["rsum"] = sum(metrics[key] for key in metric_keys("recall"))
    metrics["mrecall"] = metrics["rsum"] / 6
    return {key: metrics[key] for key in METRIC_KEYS}  # the table's order (results.csv's)


def evaluate_embeddings(images, captions, caption_image=None, protocol: str = "single", *,
                        fold_size: int = COCO_FOLD_SIZE, similarity: str = "cosine", order=None, device=None,
                        block: int = DEFAULT_BLOCK) -> dict:
    """Retrieval metrics under one protocol.

    - ``single``: all images and captions at once (Flickr test sets, validation).
    - ``5fold``: COCO 1K — 5 folds of ``fold_size`` images (rows f·size … f·size+size-1
      and their captions); each metric, rsum included, is the mean over the folds, and the
      per-fold dicts are returned under ``folds``.
    - ``5k``: COCO 5K — like ``single`` but at least 5,000 images are required.
    """
    similarity = _old_order_keyword(similarity, order)
    if protocol not in PROTOCOLS:
        raise VseError(f"unknown evaluation protocol {protocol!r} "
                       f"(expected {', '.join(PROTOCOLS)})")
    num_images = len(images)
    if protocol == "5k" and num_images < COCO_5K_IMAGES:
        raise VseError(f"the 5k protocol needs at least {COCO_5K_IMAGES} images, "
                       f"got {num_images}")
    if protocol != "5fold":
        return retrieval_metrics(*similarity_ranks(images, captions, caption_image,
                                                   similarity=similarity, device=device, block=block))
    if num_images != COCO_FOLDS * fold_size:
        raise VseError(f"the 5fold protocol needs exactly {COCO_FOLDS} × {fold_size} = "
                       f"{COCO_FOLDS * fold_size} images, got {num_images}")
    device = _pick_device(images, device)
    images = _embeddings(images, "image", device)
    captions = _embeddings(captions, "caption", device, like=images)
    caption_image = _caption_index(caption_image, len(images), len(captions), device)
    folds = []
    for fold in range(COCO_FOLDS):
        start = fold * fold_size
        in_fold = torch.nonzero((caption_image >= start) & (caption_image < start + fold_size))
        in_fold = in_fold[:, 0]
        folds.append(retrieval_metrics(*similarity_ranks(
            images[start:start + fold_size], captions[in_fold], caption_image[in_fold] - start,
            similarity=similarity, device=device, block=block)))
    metrics = {key: float(np.mean([f[key] for f in folds])) for key in METRIC_KEYS}
    metrics["folds"] = folds
    return metrics


# ---------------------------------------------------------------------------- coherent score


def coherent_score(scores, relevance, k: int, *, tie_break: str = "low") -> float:
    """CS@k: mean over queries (rows) of Kendall's tau-b between the model scores and the
    relevance of the query's k highest-scoring candidates.

    Candidates tied in score at the k-th place are taken in index order (a stable sort,
    ``tie_break="low"``); ``"high"`` takes the higher indices first, as the ladder-loss
    reference code (``np.argsort(s)[::-1][:k]``) does.  A query whose tau-b is undefined (all
    k scores tied, or all k relevances tied — scipy returns nan there) is left out of the
    mean (the reference's mean becomes nan); if every query is, the result is nan.
    """
    scores = _finite_matrix(scores, "scores")
    relevance = _finite_matrix(relevance, "relevance", like=scores)
    if relevance.shape != scores.shape:
        raise VseError(f"relevance shape {tuple(relevance.shape)} does not match scores "
                       f"shape {tuple(scores.shape)}")
    _check_k(k, scores.shape[1])
    taus = _top_k_kendall_tau_b(scores, relevance, [k], tie_break)[0]
    return mean_defined(taus)


def coherent_scores(img_emb, cap_emb, relevance_ref, ks=(100, 1000), *, similarity: str = "cosine",
                    order=None, device=None, block: int = DEFAULT_BLOCK,
                    tie_break: str = "low") -> dict[str, float]:
    """CS@k in both directions on one caption per image (the ladder-loss evaluation).

    ``cap_emb[q]`` is image q's reference caption (caption 5q in the 5-caption layout) and
    ``relevance_ref[q, p]`` = rel(t_q, t_p) between reference captions.  Image→text uses
    R(q, p) = relevance_ref[q, p]; text→image the transpose.  Keys ``i2t_cs@k``, ``t2i_cs@k``.
    ``tie_break`` as in ``coherent_score``.
    """
    similarity = _old_order_keyword(similarity, order)
    device = _pick_device(img_emb, device)
    images = _embeddings(img_emb, "image", device)
    captions = _embeddings(cap_emb, "caption", device, like=images)
    n = len(images)
    if len(captions) != n:
        raise VseError(f"the coherent score needs one caption per image: {n} images, "
                       f"{len(captions)} captions")
    relevance = _finite_matrix(relevance_ref, "relevance", like=images)
    if relevance.shape != (n, n):
        raise VseError(f"relevance must be {n} × {n} (reference captions), "
                       f"got {tuple(relevance.shape)}")
    ks = [int(k) for k in ks]
    for k in ks:
        _check_k(k, n)
    block = _positive_block(block)
    result = {}
    for direction in ("i2t", "t2i"):
        taus = [[] for _ in ks]
        for start in range(0, n, block):
            stop = min(start + block, n)
            if direction == "i2t":
                scores = image_caption_scores(images[start:stop], captions, similarity)
                rel = relevance[start:stop]
            else:
                scores = caption_image_scores(captions[start:stop], images, similarity)
                rel = relevance[:, start:stop].T
            for per_k, block_taus in zip(taus, _top_k_kendall_tau_b(scores, rel, ks, tie_break)):
                per_k.append(block_taus)
        for k, per_k in zip(ks, taus):
            result[f"{direction}_cs@{k}"] = mean_defined(torch.cat(per_k))
    return result


def _top_k_kendall_tau_b(scores, relevance, ks, tie_break: str = "low") -> list[torch.Tensor]:
    """Per row, ``kendall_tau_b`` over the top-k candidates, for each k in ``ks``."""
    if tie_break not in TIE_BREAKS:
        raise VseError(f"tie_break must be one of {', '.join(TIE_BREAKS)}, got {tie_break!r}")
    if tie_break == "low":
        ranked = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :max(ks)]
    else:  # a stable sort of the reversed row: among tied scores the higher index comes first
        flipped = torch.sort(scores.flip(1), dim=1, descending=True, stable=True).indices
        ranked = scores.shape[1] - 1 - flipped[:, :max(ks)]
    x_all = scores.gather(1, ranked)  # non-increasing along each row
    y_all = relevance.gather(1, ranked)
    return [kendall_tau_b(x_all[:, :k], y_all[:, :k]) for k in ks]


# ---------------------------------------------------------------------------- general formulas


def auc(scores, positive) -> float:
    """Area under the ROC curve of ``scores`` separating ``positive`` from the rest: the
    probability that a random positive scores above a random negative, ties counted 1/2."""
    from scipy.stats import rankdata

    positive = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return math.nan
    ranks = rankdata(scores)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def ndcg(scores, gains, k: int) -> np.ndarray:
    """NDCG@k (Järvelin & Kekäläinen 2002) of each row's candidates ranked by ``scores``
    (descending; tied scores put the lower gain first, against the query):
    DCG@k = sum_{r=1..k} gain_r / log2(r + 1), divided by the DCG@k of the gains in ideal
    order; nan where every gain is 0. (rows, L) arrays; a row shorter than L is padded with
    score -inf and gain 0."""
    s, g = np.asarray(scores, np.float64), np.asarray(gains, np.float64)
    by_gain = np.argsort(g, axis=1, kind="stable")
    s1, g1 = np.take_along_axis(s, by_gain, 1), np.take_along_axis(g, by_gain, 1)
    ranked = np.take_along_axis(g1, np.argsort(-s1, axis=1, kind="stable"), 1)[:, :k]
    ideal = -np.sort(-g, axis=1)[:, :k]
    discount = 1.0 / np.log2(np.arange(2, ranked.shape[1] + 2))
    dcg, idcg = ranked @ discount, ideal @ discount
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(idcg > 0, dcg / idcg, np.nan)


def mean_defined(values) -> float:
    """The mean of the defined (not NaN) values, NaN when none is: how per-query values
    (CS@K's and the human metrics' tau-b, NDCG) become one number."""
    values = torch.as_tensor(values)
    defined = values[~torch.isnan(values)]
    return float(defined.mean()) if defined.numel() else math.nan


def _old_order_keyword(similarity, order):
    """``order=`` is the old spelling of ``similarity=`` (it took a bool or a similarity name);
    it is kept for one version, with a note."""
    if order is None:
        return similarity
    warnings.warn("order= is now similarity= (a name of core.similarity.SIMILARITIES); "
                  "order= goes in the next version", DeprecationWarning, stacklevel=3)
    return similarity_name(order)


def _check_k(k, num_candidates: int) -> None:
    if not isinstance(k, (int, np.integer)) or not 2 <= k <= num_candidates:
        raise VseError(f"CS@K needs 2 <= K <= {num_candidates} (the number of candidates), "
                       f"got K={k}")


# ---------------------------------------------------------------------------- input checks


def _pick_device(reference, device) -> torch.device:
    if device is not None:
        return torch.device(device)
    return reference.device if isinstance(reference, torch.Tensor) else torch.device("cpu")


def _embeddings(values, name: str, device, like=None) -> torch.Tensor:
    tensor = _finite_matrix(values, f"{name} embeddings", device=device, like=like)
    if like is not None and tensor.shape[1] != like.shape[1]:
        raise VseError(f"{name} embeddings have dimension {tensor.shape[1]}, "
                       f"expected {like.shape[1]}")
    if len(tensor) == 0:
        raise VseError(f"no {name} embeddings")
    return tensor


def _finite_matrix(values, name: str, device=None, like=None) -> torch.Tensor:
    """A 2-D float tensor on ``device`` (or like's); float64 stays float64, else float32."""
    tensor = torch.as_tensor(values)
    if device is None:
        device = like.device if like is not None else tensor.device
    if tensor.ndim != 2:
        raise VseError(f"{name} must be a 2-D array, got shape {tuple(tensor.shape)}")
    dtype = torch.float64 if tensor.dtype == torch.float64 else torch.float32
    if like is not None:
        dtype = like.dtype
    tensor = tensor.to(device=device, dtype=dtype)
    if not bool(torch.isfinite(tensor).all()):
        raise VseError(f"{name} contain NaN or infinite values")
    return tensor


def _caption_index(caption_image, num_images: int, num_captions: int, device) -> torch.Tensor:
    if caption_image is None:
        if num_captions != CAPTIONS_PER_IMAGE * num_images:
            raise VseError(f"{num_captions} captions for {num_images} images: without an "
                           f"explicit caption→image index there must be "
                           f"{CAPTIONS_PER_IMAGE} per image")
        return torch.arange(num_captions, device=device) // CAPTIONS_PER_IMAGE
    index = torch.as_tensor(caption_image)
    if index.shape != (num_captions,) or index.dtype.is_floating_point or index.dtype == torch.bool:
        raise VseError(f"caption_image must be {num_captions} integer image indices, got "
                       f"shape {tuple(index.shape)} of {index.dtype}")
    index = index.to(device=device, dtype=torch.long)
    if num_captions and (int(index.min()) < 0 or int(index.max()) >= num_images):
        raise VseError(f"caption_image has indices outside 0..{num_images - 1}")
    if int(torch.bincount(index, minlength=num_images).min()) == 0:
        raise VseError("caption_image leaves an image without any caption")
    return index


def _positive_block(block) -> int:
    if not isinstance(block, (int, np.integer)) or block < 1:
        raise VseError(f"block must be a positive integer, got {block!r}")
    return int(block)
