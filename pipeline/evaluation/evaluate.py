"""Evaluation entry points: saved embeddings (npz) or a checkpoint on a feature cache; the
retrieval metrics, CS@K and agreement with human judgments; their printed table and JSON."""

from __future__ import annotations

import dataclasses
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch

from pipeline.core.errors import VseError
from pipeline.core.similarity import image_caption_scores
from pipeline.data.cache import FeatureCache
from pipeline.evaluation.inference import (
    SplitEmbeddings,
    check_features_match,
    encode_split,
    ensemble_size,
    load_model,
)
from pipeline.evaluation.judgments import (
    Judgments,
    MatchedJudgments,
    SplitIdentity,
    human_metrics,
    match_judgments,
    match_split,
)
from pipeline.evaluation.metrics import (
    CAPTIONS_PER_IMAGE,
    DIRECTIONS,
    METRICS,
    coherent_scores,
    evaluate_embeddings,
    is_metric,
    metric_of,
)


def load_embeddings_npz(path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``images`` (N×D), ``captions`` (M×D; 5N with captions 5k..5k+4 of image k, unless an
    explicit ``caption_image`` array is stored)."""
    path = Path(path)
    if not path.is_file():
        raise VseError("embeddings file not found", path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in ("images", "captions") if k not in npz.files]
            if missing:
                raise VseError(f"npz lacks array(s) {', '.join(missing)} "
                               f"(has: {', '.join(npz.files) or 'none'})", path)
            images, captions = npz["images"], npz["captions"]
            caption_image = npz["caption_image"] if "caption_image" in npz.files else None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise VseError(f"cannot read embeddings: truncated or not an npz ({reason})", path) from exc
    if images.ndim != 2 or captions.ndim != 2 or images.shape[1] != captions.shape[1]:
        raise VseError(f"images {images.shape} and captions {captions.shape} must be 2-D "
                       "with the same width", path)
    if caption_image is None and len(captions) != CAPTIONS_PER_IMAGE * len(images):
        raise VseError(f"{len(captions)} captions for {len(images)} images: expected 5 per image "
                       "(or store a caption_image array)", path)
    return images, captions, caption_image


def evaluate_npz(path, protocol: str = "single", device: torch.device | None = None,
                 similarity: str = "cosine") -> dict:
    images, captions, caption_image = load_embeddings_npz(path)
    return evaluate_embeddings(images, captions, caption_image, protocol, similarity=similarity,
                               device=device)


def embed_checkpoint(checkpoint, features, split: str, device: torch.device,
                     max_images: int | None = None, amp: bool = False, text_features=None) -> SplitEmbeddings:
    """Embeddings of ``split``; ``features`` is a cache path (opened and closed here) or an
    open ``FeatureCache``; ``text_features`` replaces the caption features a checkpoint names.
    Full fp32 unless ``amp`` (``inference.encode_split``)."""
    loaded = load_model(checkpoint, device)
    cache = features if isinstance(features, FeatureCache) else FeatureCache(features)
    try:
        check_features_match(cache, loaded.model, loaded.state.get("feature_source", {}), checkpoint)
        captions = loaded.captions(cache, text_features, checkpoint)
        emb = encode_split(loaded.model, cache, captions, split, device, max_images=max_images, amp=amp,
                           progress=True)
        return dataclasses.replace(emb, ensemble=ensemble_size(loaded.state))  # the state read once
    finally:
        if cache is not features:
            cache.close()


def average_scores(splits: list[SplitEmbeddings], checkpoints) -> SplitEmbeddings:
    """The mean of several models' split scores (e.g. SGRAF: an SGR and an SAF checkpoint), as a
    pairwise split (images = I_N, captions = Sᵀ). Each model's scores are its own: a pairwise
    network's S, or a dual model's similarity of its embeddings. The splits must be the same rows."""
    first = splits[0]
    total = None
    for emb, checkpoint in zip(splits, checkpoints):
        if not (np.array_equal(emb.image_rows, first.image_rows)
                and np.array_equal(emb.caption_rows, first.caption_rows)):
            raise VseError("scores of another split's rows: average checkpoints on the same cache and split",
                           checkpoint)
        images, captions = torch.from_numpy(emb.images), torch.from_numpy(emb.captions)
        scores = image_caption_scores(images, captions, emb.similarity).double()
        total = scores if total is None else total + scores
    mean = (total / len(splits)).float()
    return SplitEmbeddings(np.eye(len(first.images), dtype=np.float32), mean.T.contiguous().numpy(),
                           first.caption_image, first.image_rows, first.caption_rows, "cosine", pairwise=True,
                           ensemble=sum(emb.ensemble for emb in splits))


def relevance_for_cache(path, cache: FeatureCache):
    """The relevance file ``path`` as a ``BatchRelevance``, refused unless it was made for
    the captions of ``cache`` (same count and caption fingerprint)."""
    from pipeline.relevance import BatchRelevance

    return BatchRelevance(path, num_captions=len(cache.captions),
                          caption_fingerprint=cache.caption_fingerprint, captions_from=cache.path)


def evaluate_split_embeddings(emb: SplitEmbeddings, protocol: str = "single", device=None,
                              relevance=None, cs_ks=()) -> dict:
    """Retrieval metrics, plus CS@K when a relevance source (file path or object) is given."""
    similarity = emb.similarity  # a name of metrics.SIMILARITIES
    metrics = evaluate_embeddings(emb.images, emb.captions, emb.caption_image, protocol,
                                  similarity=similarity, device=device)
    if relevance is not None and cs_ks:
        metrics.update(coherent_score_report(emb, relevance, cs_ks, similarity=similarity, device=device))
    return metrics


def usable_cs_ks(ks, num_images: int) -> tuple[list[int], list[int]]:
    """The K of CS@K that a split of ``num_images`` images allows (K <= N), and those left out."""
    return [k for k in ks if k <= num_images], [k for k in ks if k > num_images]


def cs_note(ks, num_images: int, split: str) -> str | None:
    """The line telling which CS@K were left out for a split of ``num_images`` images."""
    _, dropped = usable_cs_ks(ks, num_images)
    if not dropped:
        return None
    return (f"note: {', '.join(f'CS@{k}' for k in dropped)} left out: the {split} split has only "
            f"{num_images} images (CS@K needs K <= that)")


def coherent_score_report(emb: SplitEmbeddings, relevance, ks, similarity: str = "cosine",
                          device=None) -> dict:
    """CS@K on one caption per image (each image's first caption), as the ladder paper."""
    from pipeline.relevance import BatchRelevance

    source = relevance if callable(relevance) else BatchRelevance(relevance)
    first = np.flatnonzero(np.r_[True, emb.caption_image[1:] != emb.caption_image[:-1]])
    if len(first) != len(emb.images):
        raise VseError("CS@K needs at least one caption for every image of the split")
    ks, _ = usable_cs_ks(ks, len(emb.images))
    if not ks:
        return {}
    ref_rows = torch.from_numpy(emb.caption_rows[first])
    rel = source(ref_rows).float().cpu().numpy()
    return coherent_scores(emb.images, emb.captions[first], rel, ks, similarity=similarity, device=device)


def judge_split(emb: SplitEmbeddings, index, judgments: Judgments, device=None,
                token_file=None) -> tuple[dict, MatchedJudgments]:
    """Human-judgment metrics of split embeddings whose rows index ``index`` (a FeatureCache,
    CaptionIndex or RC index). With ``token_file`` the rebuilt keys of the judged captions are
    checked against it first."""
    matched = match_split(emb, index, judgments, token_file)
    metrics = human_metrics(emb.images, emb.captions, emb.caption_image, matched,
                            similarity=emb.similarity, device=device)
    return metrics, matched


def judge_npz(path, judgments: Judgments, similarity: str = "cosine",
              device=None) -> tuple[dict, MatchedJudgments]:
    """Human-judgment metrics of an embeddings npz that stores ``image_ids`` (N,) and
    ``caption_keys`` (M,) string arrays beside ``images`` and ``captions``."""
    images, captions, caption_image = load_embeddings_npz(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in ("image_ids", "caption_keys") if k not in npz.files]
            if missing:
                raise VseError(f"--judgments needs the npz to name its rows: it lacks {', '.join(missing)} "
                               "(string arrays: image ids (N,), caption keys <image>#<n> (M,))", path)
            image_ids, keys = npz["image_ids"], npz["caption_keys"]
    except (OSError, ValueError) as exc:
        problem = str(exc).splitlines()[0][:120]
        raise VseError(f"cannot read image_ids / caption_keys ({problem})", path) from exc
    if image_ids.shape != (len(images),) or keys.shape != (len(captions),) or \
            image_ids.dtype.kind != "U" or keys.dtype.kind != "U":
        raise VseError(f"image_ids {image_ids.shape} {image_ids.dtype} and caption_keys {keys.shape} "
                       f"{keys.dtype} must be string arrays of {len(images)} and {len(captions)} rows", path)
    if caption_image is None:
        caption_image = np.repeat(np.arange(len(images)), CAPTIONS_PER_IMAGE)
    matched = match_judgments(judgments, SplitIdentity(image_ids.tolist(), keys.tolist()))
    metrics = human_metrics(images, captions, caption_image, matched, similarity=similarity, device=device)
    return metrics, matched


def json_metrics(metrics: dict) -> dict:
    """`vse evaluate --json`: the metrics of ``metrics`` that the table (``metrics.METRICS``)
    puts in JSON, in the order they were computed; counts stay integers, an undefined value
    (NaN) is null."""
    return {k: _json_number(v) for k, v in metrics.items() if is_metric(k) and metric_of(k).in_json}


def _json_number(value):
    if isinstance(value, int):
        return value  # counts stay integers
    value = float(value)
    return None if value != value else value  # NaN (undefined) as null


def format_table(metrics: dict, title: str = "") -> str:
    """A readable two-direction table (the recall and rank metrics of ``metrics.METRICS``),
    rsum and M-Recall, and CS@K if present."""
    columns = {d: [m for m in METRICS if m.direction == d and m.group in ("recall", "rank")]
               for d in DIRECTIONS}
    widths = [max(7, len(m.short) + 3) for m in columns["i2t"]]
    lines = [title] if title else []
    lines.append(" " * 22 + "".join(f"{m.short:>{w}s}" for m, w in zip(columns["i2t"], widths)))
    for direction, name in DIRECTIONS.items():
        retrieved = "captions" if direction == "i2t" else "images"
        cells = [f"{m.format(metrics[m.key]):>{w}s}" for m, w in zip(columns[direction], widths)]
        lines.append(f"{f'{name} ({retrieved})':22s}" + "".join(cells))
    lines.append(_inline(metrics, ("rsum", "mrecall")))
    cs = sorted(k for k in metrics if is_metric(k) and metric_of(k).group == "cs")
    if cs:
        lines.append(_inline(metrics, cs))
    return "\n".join(lines)


def _inline(metrics: dict, keys) -> str:
    """``name value   name value …`` of ``keys``."""
    return "   ".join(f"{metric_of(k).short} {metric_of(k).format(metrics[k], 'n/a')}" for k in keys)
