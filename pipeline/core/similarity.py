"""The similarity of an image embedding and a caption embedding: the one definition that
networks, losses and the retrieval metrics share (in core: networks and losses import no other package).

``SIMILARITIES`` names them: the inner product (``cosine`` on L2-normalised embeddings), the
order-embedding score squared (``order``, the paper's ``s(i, c) = -||max(0, c - i)||^2``) or
not (``order-norm``, VSE++ code's ``order_sim``). Pure torch, differentiable.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.core.errors import VseError
from pipeline.core.registry import SIMILARITIES  # a model's ``similarity``, a loss's declared one

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
    return order_scores(images, captions, squared=name == "order")


def caption_image_scores(captions, images, similarity) -> torch.Tensor:
    """(len(captions), len(images)) scores, contiguous by caption."""
    if similarity_name(similarity) == "cosine":
        return captions @ images.T
    return image_caption_scores(images, captions, similarity).T
