"""What a relevance is: cosine of per-caption vectors, optionally gated by a coarse set.

Every method (svd, bert, cbow, cbow+bert) reduces to L2-normalised rows, so the relevance of
two captions is a dot product. ``cbow+bert`` (the ladder paper's coarse-to-fine rule) keeps
two sets: pairs whose coarse (CBoW) cosine is below a threshold get 0, the rest the fine
(BERT) cosine. ``relevance_matrix`` is the single definition used by both the neighbour
search and the batch relevance object.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class RelevanceVectors:
    """Per-caption vectors of one method, before they are written to a relevance file.

    ``vectors`` (M, d) float32 with unit rows (a zero row means "no information": its
    relevance to everything is 0). ``coarse_vectors`` and ``cbow_threshold`` only for
    ``cbow+bert``. ``identity`` names the model/vectoriser (packages and versions);
    ``counts`` holds what the user should hear about (e.g. captions without known words).
    """

    method: str
    vectors: np.ndarray
    params: dict
    identity: dict
    coarse_vectors: np.ndarray | None = None
    cbow_threshold: float | None = None
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def num_captions(self) -> int:
        return int(self.vectors.shape[0])


ZERO_NORM = 1e-6  # below this a row is rounding noise (e.g. a caption outside the SVD space)


def normalise_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm, as float32; rows of norm below ``ZERO_NORM`` become zero
    rather than noise blown up to unit length."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > ZERO_NORM)


def relevance_matrix(queries: torch.Tensor, candidates: torch.Tensor,
                     coarse_queries: torch.Tensor | None = None,
                     coarse_candidates: torch.Tensor | None = None,
                     threshold: float | None = None) -> torch.Tensor:
    """(Q, C) float32 relevance of unit-row vectors; with coarse vectors, pairs whose coarse
    cosine is below ``threshold`` are set to 0."""
    rel = queries.float() @ candidates.float().T
    if coarse_queries is not None:
        coarse = coarse_queries.float() @ coarse_candidates.float().T
        rel = rel.masked_fill(coarse < threshold, 0.0)
    return rel


def ragged_rows(offsets: np.ndarray, ids) -> tuple[np.ndarray, np.ndarray]:
    """The rows of items ``ids`` of a ragged array (item j is rows ``offsets[j]:offsets[j+1]``),
    item after item: (rows (sum of lengths,) int64, lengths (len(ids),) int64). No Python loop."""
    ids = np.asarray(ids, dtype=np.int64)
    starts = offsets[ids]
    lengths = offsets[ids + 1] - starts
    firsts = np.cumsum(lengths) - lengths  # where each item's rows begin in the output
    total = int(lengths.sum())
    return np.repeat(starts - firsts, lengths) + np.arange(total), lengths
