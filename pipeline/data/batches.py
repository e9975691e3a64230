"""Training batches of one epoch: (image input, caption input, image id, caption id).

Each training caption is one pair with its image (as VSE++). The order of an epoch depends
only on (seed, epoch), so a run resumed in the middle of an epoch sees exactly the batches
an uninterrupted run would.

The cached trainer and RC mode differ only in their *pair source*, which says where the
image input of a pair comes from:

- ``CachedFeatures``: rows of a feature cache, read per batch (sorted, de-duplicated rows),
  so no worker holds a copy of the dataset unless ``preload`` is asked for.
- ``pipeline.data.image_source.ImageSource``: decoded images, randomly cropped; the CNN runs in the model.

The caption input comes from the run's caption side (``pipeline.data.captions``): tokens for the
GRU, or rows of frozen caption vectors held in memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from pipeline.backbones.pixels import PixelBackbone
from pipeline.core.errors import VseError
from pipeline.data.cache import IMAGE_PIPELINE_ATTRS, FeatureCache


@dataclass
class Batch:
    images: torch.Tensor          # (B, D) float features, or (B, 3, S, S) uint8 crops in RC mode
    captions: tuple               # the text encoder's input: (tokens (B, T), lengths (B,)) or (vectors,)
    image_ids: torch.Tensor       # (B,) image index of each pair (same image ⇒ not negatives)
    caption_ids: torch.Tensor     # (B,) caption index into the source (for relevance lookup)
    host_captions: tuple = ()     # indices of ``captions`` that stay on the CPU (the GRU's lengths)

    def pin_memory(self) -> "Batch":
        return self._map(lambda t: t.pin_memory())

    def to(self, device, non_blocking: bool = True) -> "Batch":
        """Everything on ``device`` but the caption inputs the caption side reads on the CPU
        (``host_captions``: the GRU's lengths, which pack_padded_sequence reads there; moved
        there and back they would cost a host sync every step)."""
        return Batch(self.images.to(device, non_blocking=non_blocking),
                     tuple(t if i in self.host_captions else t.to(device, non_blocking=non_blocking)
                           for i, t in enumerate(self.captions)),
                     self.image_ids.to(device, non_blocking=non_blocking),
                     self.caption_ids.to(device, non_blocking=non_blocking), self.host_captions)

    def _map(self, fn) -> "Batch":
        return Batch(fn(self.images), tuple(fn(t) for t in self.captions), fn(self.image_ids),
                     fn(self.caption_ids), self.host_captions)


def epoch_order(num_items: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of training items for one epoch (depends on seed and epoch only)."""
    return np.random.default_rng([seed, epoch]).permutation(num_items)


def batch_slices(num_items: int, batch_size: int, drop_last: bool) -> list[slice]:
    stop = num_items - num_items % batch_size if drop_last else num_items
    return [slice(a, min(a + batch_size, stop)) for a in range(0, stop, batch_size)]


@dataclass
class LoadFailure:
    """What a loader worker returns instead of a Batch when an input cannot be read: raised
    in the main process it is the usual one-line error (an exception raised inside a worker
    would arrive wrapped in the worker's traceback)."""

    message: str

    def error(self) -> VseError:
        return VseError(self.message)


class ImageInputs(Protocol):
    """Picklable (it travels to loader workers): the image inputs of a training batch."""

    def batch(self, rows: np.ndarray, epoch: int, positions: np.ndarray) -> torch.Tensor:
        """Inputs of image ``rows``; random augmentation (if any) is drawn from (epoch, the
        pairs' positions in the epoch order) only, so a resumed run sees the same inputs."""


class PairSource(Protocol):
    """Where a run's image–caption pairs come from (``CachedFeatures`` or ``rc.ImageSource``).
    A source with a backbone also gives ``checkpoint_entry(backbone)``, the CNN's part of a
    checkpoint."""

    index: object            # image_ids, captions, caption_image, split(name), read(rows), attrs
    inputs: ImageInputs      # training batches (``index.read`` gives validation inputs)
    feature_dim: int         # what the model's image projection receives (a set's members: D)
    set_kind: str | None     # None: one vector per image; "grid" (a CNN's map) or "regions": sets
    backbone: PixelBackbone | None  # the CNN the model runs on the inputs (RC mode)
    location: str            # the cache or dataset root, for messages
    feature_source: dict     # recorded in checkpoints: backbone, crops, dataset
    image_pipeline: dict | None  # recorded in checkpoints: how `vse extract` made the features
    encode_batch_size: int   # images per forward pass in validation


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

    def batch(self, rows: np.ndarray, epoch: int, positions: np.ndarray) -> torch.Tensor:
        """Features of ``rows`` (cached features have no augmentation to draw)."""
        return torch.from_numpy(self._array[rows] if self._array is not None else self._open().read(rows))


class CachedFeatures:
    """The pair source of the cached trainer: a feature cache."""

    backbone = None
    encode_batch_size = 512

    def __init__(self, cache_path, preload: bool = False):
        self.index = FeatureCache(cache_path)
        self.inputs = FeatureRows(cache_path, preload=preload)
        self.location = str(cache_path)
        self.feature_dim = self.index.feature_dim
        self.set_kind = (None if not self.index.is_set else
                         "grid" if self.index.attrs.get("grid") else "regions")
        self.feature_source = {k: self.index.attrs.get(k) for k in ("backbone", "crops", "dataset", "grid")
                               if k in self.index.attrs}
        # how an image became its features (None for imported precomputed features: no image
        # pipeline to repeat), kept in checkpoints for `vse embed`
        attrs = self.index.attrs
        self.image_pipeline = ({k: attrs[k] for k in IMAGE_PIPELINE_ATTRS if k in attrs}
                               if attrs.get("weights_sha256") else None)


class PairBatches(torch.utils.data.Dataset):
    """Batches of one epoch; item ``b`` is the whole b-th batch (one read per batch)."""

    def __init__(self, inputs: ImageInputs, captions, caption_ids: np.ndarray,
                 caption_image: np.ndarray, order: np.ndarray, slices: list[slice], epoch: int):
        self.inputs = inputs
        self.captions = captions  # a pipeline.data.captions.CaptionEncoder
        self.caption_ids = caption_ids
        self.caption_image = caption_image
        self.order = order
        self.slices = slices
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.slices)

    def __getitem__(self, b: int) -> Batch | LoadFailure:
        positions = np.arange(self.slices[b].start, self.slices[b].stop)
        captions = self.caption_ids[self.order[positions]]
        images = self.caption_image[captions]
        try:
            inputs = self.inputs.batch(images, self.epoch, positions)
        except VseError as exc:
            return LoadFailure(str(exc))
        return Batch(inputs, self.captions.batch(captions), torch.from_numpy(images),
                     torch.from_numpy(captions), self.captions.host_inputs)
