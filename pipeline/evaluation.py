"""Evaluation entry points: saved embeddings (npz) or a checkpoint on a feature cache."""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch

from .cache import FeatureCache
from .errors import VseError
from .inference import SplitEmbeddings, check_features_match, encode_split, load_model
from .metrics import coherent_scores, evaluate_embeddings

JSON_KEYS = ("i2t_r1", "i2t_r5", "i2t_r10", "i2t_medr", "i2t_meanr",
             "t2i_r1", "t2i_r5", "t2i_r10", "t2i_medr", "t2i_meanr", "rsum")


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
    if caption_image is None and len(captions) != 5 * len(images):
        raise VseError(f"{len(captions)} captions for {len(images)} images: expected 5 per image "
                       "(or store a caption_image array)", path)
    return images, captions, caption_image


def evaluate_npz(path, protocol: str = "single", device: torch.device | None = None,
                 order: bool = False) -> dict:
    images, captions, caption_image = load_embeddings_npz(path)
    return evaluate_embeddings(images, captions, caption_image, protocol, order=order, device=device)


def embed_checkpoint(checkpoint, features, split: str, device: torch.device,
                     max_images: int | None = None, amp: bool = False, text_features=None) -> SplitEmbeddings:
    """Embeddings of ``split``; ``features`` is a cache path (opened and closed here) or an
    open ``FeatureCache``; ``text_features`` replaces the caption features a checkpoint names.
    Full fp32 unless ``amp`` (``inference.encode_split``)."""
    loaded = load_model(checkpoint, device)
    cache = features if isinstance(features, FeatureCache) else FeatureCache(features)
    try:
        check_features_match(cache, loaded.model.config, loaded.state.get("feature_source", {}), checkpoint)
        captions = loaded.captions(cache, text_features, checkpoint)
        return encode_split(loaded.model, cache, captions, split, device, max_images=max_images, amp=amp)
    finally:
        if cache is not features:
            cache.close()


def relevance_for_cache(path, cache: FeatureCache):
    """The relevance file ``path`` as a ``BatchRelevance``, refused unless it was made for
    the captions of ``cache`` (same count and caption fingerprint)."""
    from .relevance import BatchRelevance

    return BatchRelevance(path, num_captions=len(cache.captions),
                          caption_fingerprint=cache.caption_fingerprint, captions_from=cache.path)


def evaluate_split_embeddings(emb: SplitEmbeddings, protocol: str = "single", device=None,
                              relevance=None, cs_ks=()) -> dict:
    """Retrieval metrics, plus CS@K when a relevance source (file path or object) is given."""
    order = emb.similarity  # a name of metrics.SIMILARITIES
    metrics = evaluate_embeddings(emb.images, emb.captions, emb.caption_image, protocol,
                                  order=order, device=device)
    if relevance is not None and cs_ks:
        metrics.update(coherent_score_report(emb, relevance, cs_ks, order=order, device=device))
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


def coherent_score_report(emb: SplitEmbeddings, relevance, ks, order: bool = False, device=None) -> dict:
    """CS@K on one caption per image (each image's first caption), as the ladder paper."""
    from .relevance import BatchRelevance

    source = relevance if callable(relevance) else BatchRelevance(relevance)
    first = np.flatnonzero(np.r_[True, emb.caption_image[1:] != emb.caption_image[:-1]])
    if len(first) != len(emb.images):
        raise VseError("CS@K needs at least one caption for every image of the split")
    ks, _ = usable_cs_ks(ks, len(emb.images))
    if not ks:
        return {}
    ref_rows = torch.from_numpy(emb.caption_rows[first])
    rel = source(ref_rows).float().cpu().numpy()
    return coherent_scores(emb.images, emb.captions[first], rel, ks, order=order, device=device)


def format_table(metrics: dict, title: str = "") -> str:
    """A readable two-direction table (R@1/5/10, medr, meanr) plus rsum and CS@K if present."""
    lines = [title] if title else []
    lines.append(f"{'':22s}{'R@1':>7s}{'R@5':>7s}{'R@10':>7s}{'medr':>7s}{'meanr':>8s}")
    for direction, name in (("i2t", "image→text (captions)"), ("t2i", "text→image (images)")):
        lines.append(f"{name:22s}" + "".join(f"{metrics[f'{direction}_r{k}']:7.1f}" for k in (1, 5, 10))
                     + f"{metrics[f'{direction}_medr']:7.0f}{metrics[f'{direction}_meanr']:8.1f}")
    lines.append(f"rsum {metrics['rsum']:.1f}   M-Recall {metrics['rsum'] / 6:.2f}")
    cs = sorted(k for k in metrics if "_cs@" in k)
    if cs:
        lines.append("   ".join(f"{k} {metrics[k]:.3f}" for k in cs))
    return "\n".join(lines)
