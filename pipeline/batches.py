"""Training batches from a feature cache: (image feature, caption tokens, image id, caption id).

Each training caption is one pair with its image (as VSE++). The order of an epoch depends
only on (seed, epoch), so a run resumed in the middle of an epoch sees exactly the batches
an uninterrupted run would. Features are read from the HDF5 cache per batch (sorted,
de-duplicated rows), so no worker holds a copy of the dataset unless ``preload`` is asked for.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from .cache import FeatureCache
from .text import TokenizedCaptions


@dataclass
class Batch:
    images: torch.Tensor          # (B, D) features, or (B, 3, H, W) pixels in RC mode
    tokens: torch.Tensor          # (B, T) int64
    lengths: torch.Tensor         # (B,)
    image_ids: torch.Tensor       # (B,) image index of each pair (same image ⇒ not negatives)
    caption_ids: torch.Tensor     # (B,) caption index into the cache (for relevance lookup)

    def pin_memory(self) -> "Batch":
        return Batch(*(t.pin_memory() for t in self.astuple()))

    def to(self, device, non_blocking: bool = True) -> "Batch":
        return Batch(*(t.to(device, non_blocking=non_blocking) for t in self.astuple()))

    def astuple(self):
        return (self.images, self.tokens, self.lengths, self.image_ids, self.caption_ids)


def epoch_order(num_items: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of training items for one epoch (depends on seed and epoch only)."""
    return np.random.default_rng([seed, epoch]).permutation(num_items)


def batch_slices(num_items: int, batch_size: int, drop_last: bool) -> list[slice]:
    stop = num_items - num_items % batch_size if drop_last else num_items
    return [slice(a, min(a + batch_size, stop)) for a in range(0, stop, batch_size)]


class FeatureRows:
    """Row access to the cache's features: the file opened lazily once per process (so
    DataLoader workers each hold a handle, not a copy), or the whole array if ``preload``."""

    def __init__(self, cache_path, preload: bool = False):
        self.cache_path = str(cache_path)
        self._cache, self._pid = None, None
        self._array = self._open().read(np.arange(self._open().num_images)) if preload else None

    def __getstate__(self):  # a worker reopens the file; a preloaded array travels with it
        return {**self.__dict__, "_cache": None, "_pid": None}

    def _open(self):
        if self._cache is None or self._pid != os.getpid():
            self._cache, self._pid = FeatureCache(self.cache_path), os.getpid()
        return self._cache

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return self._array[rows] if self._array is not None else self._open().read(rows)


class CachedPairs(torch.utils.data.Dataset):
    """Batches of one epoch; item ``b`` is the whole b-th batch (one HDF5 read per batch)."""

    def __init__(self, features: FeatureRows, tokens: TokenizedCaptions, caption_ids: np.ndarray,
                 caption_image: np.ndarray, order: np.ndarray, slices: list[slice]):
        self.features = features
        self.tokens = tokens
        self.caption_ids = caption_ids
        self.caption_image = caption_image
        self.order = order
        self.slices = slices

    def __len__(self) -> int:
        return len(self.slices)

    def __getitem__(self, b: int) -> Batch:
        captions = self.caption_ids[self.order[self.slices[b]]]
        images = self.caption_image[captions]
        tokens, lengths = self.tokens.batch(captions)
        return Batch(torch.from_numpy(self.features(images)), tokens, lengths,
                     torch.from_numpy(images), torch.from_numpy(captions))
