"""The similarity of an image embedding and a caption embedding: the one definition that
networks, losses and the retrieval metrics share (in core: networks and losses import no other package).

``SIMILARITIES`` names them: the inner product (``cosine`` on L2-normalised embeddings), the
order-embedding score squared (``order``, the paper's ``s(i, c) = -||max(0, c - i)||^2``) or
not (``order-norm``, VSE++ code's ``order_sim``), and PCME++'s closed-form sampled distance of
Gaussian embeddings (``csd``: each embedding is ``[mean, log-variance]``, two halves; the score is
``-(||μ_i - μ_c||² + Σ σ²_i + Σ σ²_c)``, the expected squared distance of a sample of each).
Pure torch, differentiable.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.core.errors import VseError
from pipeline.core.registry import (  # a model's ``similarity``, a loss's declared one
    ORDER_SIMILARITIES,
    PROBABILISTIC_SIMILARITIES,
    SIMILARITIES,
)

# Largest (rows, step, D) difference block of ``order_scores`` (elements).
ORDER_BLOCK_ELEMENTS = 1 << 22


def order_scores(images, captions, squared: bool = True) -> torch.Tensor:
    """THE order-embedding score, (len(images), len(captions)), for losses and metrics alike:
    ``s(i, c) = -||max(0, c - i)||^2`` (``squared``, the paper's form) or ``-||max(0, c - i)||``
    (VSE++'s code, ``order_sim``).  Differentiable; the (images, step, D) difference tensor is
    built in blocks of at most ``ORDER_BLOCK_ELEMENTS`` elements."""
    step = max(1, ORDER_BLOCK_ELEMENTS // max(1, len(images) * images.shape[1]))
    scores = images.new_empty(len(images), len(captions))
    for start in range(0, len(captions), step):
        violation = (captions[None, start:start + step] - images[:, None]).clamp(min=0)
        scores[:, start:start + step] = -(violation.square().sum(dim=-1) if squared
                                          else torch.linalg.vector_norm(violation, dim=-1))
    return scores


def gaussian_halves(embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, log-variance), the two halves of probabilistic embeddings (N, 2E); a ValueError for
    an odd width."""
    width = embeddings.shape[-1]
    if width % 2:
        raise ValueError(f"probabilistic embeddings are [mean, log-variance]: an even width, got {width}")
    return embeddings[..., :width // 2], embeddings[..., width // 2:]


def csd_augmented(embeddings, side: str) -> torch.Tensor:
    """THE closed-form sampled distance written as an inner product: the (N, E + 2) vectors whose
    image-side · caption-side products are ``csd_scores`` exactly (up to rounding):
    ``[2μ, -(|μ|² + Σσ²), 1]`` on the query side and ``[μ, 1, -(|μ|² + Σσ²)]`` on the other.
    ``side`` "query" or "gallery"; the score is symmetric, so either modality takes either side."""
    mean, log_var = gaussian_halves(embeddings)
    spread = mean.square().sum(-1, keepdim=True) + log_var.exp().sum(-1, keepdim=True)
    one = torch.ones_like(spread)
    if side == "query":
        return torch.cat([2 * mean, -spread, one], dim=-1)
    return torch.cat([mean, one, -spread], dim=-1)


def csd_scores(images, captions) -> torch.Tensor:
    """PCME++'s score (``csd``), (len(images), len(captions)): ``-(||μ_i - μ_c||² + Σ exp(v_i) + Σ
    exp(v_c))`` of embeddings ``[μ, v]`` (v the log-variance), as the inner product of
    ``csd_augmented`` vectors (an exact rewriting: ``||a - b||² = |a|² + |b|² - 2 a·b``)."""
    return csd_augmented(images, "query") @ csd_augmented(captions, "gallery").T


def is_probabilistic(similarity) -> bool:
    """Whether ``similarity`` scores probabilistic embeddings ``[mean, log-variance]``."""
    return similarity_name(similarity) in PROBABILISTIC_SIMILARITIES


def is_order(similarity) -> bool:
    """Whether ``similarity`` is an order-embedding score (its embeddings are absolute values)."""
    return similarity_name(similarity) in ORDER_SIMILARITIES


def similarity_name(similarity) -> str:
    """A name of ``SIMILARITIES`` from a name, or from a bool (True: "order", False: "cosine")."""
    if isinstance(similarity, (bool, np.bool_)) or similarity is None:
        return "order" if similarity else "cosine"
    if similarity not in SIMILARITIES:
        raise VseError(f"unknown similarity {similarity!r} (expected {', '.join(SIMILARITIES)})")
    return similarity


def image_caption_scores(images, captions, similarity) -> torch.Tensor:
    """(len(images), len(captions)) scores: inner products or order-embedding scores
    (``similarity``: a name of ``SIMILARITIES``)."""
    name = similarity_name(similarity)
    if name == "cosine":
        return images @ captions.T
    if name == "csd":
        return csd_scores(images, captions)
    return order_scores(images, captions, squared=name == "order")


def caption_image_scores(captions, images, similarity) -> torch.Tensor:
    """(len(captions), len(images)) scores, contiguous by caption."""
    if similarity_name(similarity) == "cosine":
        return captions @ images.T
    return image_caption_scores(images, captions, similarity).T
