"""Relevance of the captions of one training batch, computed on the fly.

Anything callable as ``fn(caption_indices (B,) LongTensor) -> (B, B) float32 tensor`` on the
indices' device can serve as a relevance (``RelevanceFn``), e.g. a user's own similarity.
``BatchRelevance`` is the one backed by stored per-caption vectors.

Memory: the vectors stay in host memory in their stored dtype (float16 files halve it).
The first call with indices on a GPU moves the whole table there once when it is at most
``max_device_bytes`` (default 1 GiB: COCO's 616k × 400 float32 SVD vectors fit); larger
tables stay on the host and only the B rows of each batch are gathered and copied.
"""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from pipeline.core.errors import VseError
from pipeline.data.cache import check_caption_fingerprint
from pipeline.relevance.store import read_relevance
from pipeline.text.vectors import relevance_matrix

DEFAULT_MAX_DEVICE_BYTES = 1 << 30


def check_made_for(stored, path, num_captions: int | None = None, caption_fingerprint: str | None = None,
                   captions_from=None) -> None:
    """Refuse the relevance file ``stored`` (read from ``path``) unless it has ``num_captions``
    rows and was made for the captions whose fingerprint is ``caption_fingerprint``, those of
    ``captions_from`` (either check skipped when None)."""
    if num_captions is not None and stored.num_captions != num_captions:
        raise VseError(f"relevance file has {stored.num_captions} captions but the feature "
                       f"cache has {num_captions}: made for another cache "
                       f"({stored.attrs.get('features_file')})", path)
    if caption_fingerprint is not None:
        check_caption_fingerprint(caption_fingerprint, stored.attrs, path, "relevance file", captions_from)


@runtime_checkable
class RelevanceFn(Protocol):
    def __call__(self, caption_indices: torch.Tensor) -> torch.Tensor:
        """(B,) int64 caption indices → (B, B) float32 relevance on the same device."""


class BatchRelevance:
    """Batch relevance from a relevance file path or from in-memory unit-row vectors.

    ``cbow+bert`` files (or ``coarse_vectors`` + ``cbow_threshold`` given here) apply the
    coarse-to-fine rule: pairs whose CBoW cosine is below the threshold get 0.
    ``num_captions`` and ``caption_fingerprint`` (``cache.caption_fingerprint`` of the
    captions the rows must follow, those of ``captions_from``) refuse a file made for
    another caption list.
    """

    def __init__(self, source, *, coarse_vectors=None, cbow_threshold: float | None = None,
                 num_captions: int | None = None, caption_fingerprint: str | None = None,
                 captions_from=None, max_device_bytes: int = DEFAULT_MAX_DEVICE_BYTES):
        self.method = "custom"
        if isinstance(source, (str, os.PathLike)):
            stored = read_relevance(source)
            check_made_for(stored, source, num_captions, caption_fingerprint, captions_from)
            self.method = stored.method
            source, coarse_vectors, cbow_threshold = (stored.vectors, stored.coarse_vectors,
                                                      stored.cbow_threshold)
        if (coarse_vectors is None) != (cbow_threshold is None):
            raise ValueError("coarse_vectors and cbow_threshold go together")
        self.vectors = _as_table(source)
        self.coarse_vectors = None if coarse_vectors is None else _as_table(coarse_vectors)
        if self.coarse_vectors is not None and len(self.coarse_vectors) != len(self.vectors):
            raise ValueError(f"coarse_vectors has {len(self.coarse_vectors)} rows, "
                             f"vectors {len(self.vectors)}")
        self.cbow_threshold = cbow_threshold
        self.max_device_bytes = int(max_device_bytes)
        self._tables = {torch.device("cpu"): (self.vectors, self.coarse_vectors)}

    def __len__(self) -> int:
        return len(self.vectors)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.vectors, self.coarse_vectors)
                   if t is not None)

    def __call__(self, caption_indices: torch.Tensor) -> torch.Tensor:
        device = caption_indices.device
        vectors, coarse = self._table_for(device)
        index = caption_indices.to(vectors.device, torch.int64)
        if vectors.device.type == "cpu" and index.numel() and (
                index.min() < 0 or index.max() >= len(vectors)):
            raise IndexError(f"caption indices outside 0..{len(vectors) - 1}")
        rows = vectors.index_select(0, index).to(device, non_blocking=True)
        if coarse is None:
            return relevance_matrix(rows, rows)
        coarse_rows = coarse.index_select(0, index).to(device, non_blocking=True)
        return relevance_matrix(rows, rows, coarse_rows, coarse_rows, self.cbow_threshold)

    def _table_for(self, device: torch.device):
        """The tables on ``device`` if they were (or can be) moved there, else the host ones."""
        if device not in self._tables and self.nbytes <= self.max_device_bytes:
            self._tables[device] = tuple(None if t is None else t.to(device)
                                         for t in (self.vectors, self.coarse_vectors))
        return self._tables.get(device, self._tables[torch.device("cpu")])


def _as_table(vectors) -> torch.Tensor:
    if isinstance(vectors, torch.Tensor):
        table = vectors.detach().cpu()
    else:
        table = torch.from_numpy(np.ascontiguousarray(vectors))
    if table.ndim != 2 or not table.is_floating_point():
        raise ValueError(f"relevance vectors must be a 2-d float array, got {tuple(table.shape)} "
                         f"{table.dtype}")
    return table
