"""The caption index: which images, which captions, whose caption is whose, which splits.

One concept, one class. A dataset (``datasets.Dataset`` is one), a feature cache
(``FeatureCache.index``), RC mode's image index and the human-judgment matching all speak
of the same things: image ids, captions grouped by image (``caption_image[j]`` is the image
of caption j; with the 5-caption protocol captions 5k..5k+4 belong to image k), splits
(name → image indices, in split order), caption keys (``<image id>#<n>``, as
Flickr8k.token.txt numbers them) and the caption fingerprint (the identity of the caption
list that relevance and caption-feature files are made for).

Pure numpy and hashlib: no file I/O, no torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from pipeline.core.errors import VseError


def caption_fingerprint(captions) -> str:
    """The identity of a caption list: sha256 over the caption texts in order (each utf-8,
    length-prefixed, so no two lists share a digest by concatenation).  Feature caches,
    relevance files and caption-feature files carry it as the ``caption_fingerprint``
    attribute; a file made for other captions is refused by comparing it."""
    digest = hashlib.sha256()
    for caption in captions:
        raw = str(caption).encode("utf-8")
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)
    return digest.hexdigest()


def captions_of_images(caption_image, images, num_images: int) -> tuple[np.ndarray, np.ndarray]:
    """The captions of ``images``, grouped image by image in the given order (each image's
    captions in their original order), and the position in ``images`` of each one's image.
    The one definition of "the captions of a split": caches, extraction and evaluation."""
    position = np.full(num_images, -1, dtype=np.int64)
    position[np.asarray(images, dtype=np.int64)] = np.arange(len(images))
    local = position[np.asarray(caption_image, dtype=np.int64)]
    rows = np.flatnonzero(local >= 0)
    rows = rows[np.argsort(local[rows], kind="stable")]
    return rows, local[rows]


def caption_keys(image_ids, caption_image) -> list[str]:
    """Caption j's key ``<image id>#<n>``: n = j's position among its image's captions in list
    order (Flickr8k.token.txt numbers each image's captions 0..4 in file order, and the
    readers keep that order). The one key→row mapping of the project."""
    caption_image = np.asarray(caption_image, dtype=np.int64)
    if caption_image.size == 0:
        return []
    order = np.argsort(caption_image, kind="stable")
    counts = np.bincount(caption_image, minlength=len(image_ids))
    starts = np.cumsum(counts) - counts
    position = np.empty(len(caption_image), dtype=np.int64)
    position[order] = np.arange(len(caption_image)) - starts[caption_image[order]]
    return [f"{image_ids[i]}#{n}" for i, n in zip(caption_image.tolist(), position.tolist())]


@dataclass
class CaptionIndex:
    """Image ids, captions grouped by image, caption → image, and splits → image indices.

    ``location`` (a file or folder) names where the index came from in error messages.
    Raises ``VseError`` when an index points outside the images it has."""

    image_ids: list[str]
    captions: list[str]
    caption_image: np.ndarray
    splits: dict[str, np.ndarray]
    location: Path | str | None = field(default=None, kw_only=True, repr=False, compare=False)

    def __post_init__(self):
        self.image_ids = list(self.image_ids)
        self.captions = list(self.captions)
        self.caption_image = np.asarray(self.caption_image, dtype=np.int64)
        self.splits = {k: np.asarray(v, dtype=np.int64) for k, v in self.splits.items()}
        n = len(self.image_ids)
        if len(self.captions) != len(self.caption_image):
            raise VseError(f"{len(self.captions)} captions but {len(self.caption_image)} caption → image "
                           "entries", self.location)
        for name, rows in [("caption_image", self.caption_image),
                           *((f"split {k!r}", v) for k, v in self.splits.items())]:
            if rows.size and (rows.min() < 0 or rows.max() >= n):
                raise VseError(f"{name} holds image indices outside 0..{n - 1}", self.location)

    # -- sizes and names

    @property
    def num_images(self) -> int:
        return len(self.image_ids)

    @property
    def num_captions(self) -> int:
        return len(self.captions)

    @property
    def split_names(self) -> list[str]:
        return list(self.splits)

    @property
    def captions_per_image(self) -> int | None:
        """k when every image has exactly k captions laid out k·i..k·i+k-1, else None."""
        n, m = self.num_images, self.num_captions
        if n == 0 or m % n:
            return None
        k = m // n
        return k if np.array_equal(self.caption_image, np.repeat(np.arange(n, dtype=np.int64), k)) else None

    # -- lookups

    def split(self, name: str) -> np.ndarray:
        """Image indices of split ``name``, in split order (the one 'no such split' message)."""
        if name not in self.splits:
            raise VseError(f"no split {name!r} (splits: {', '.join(self.splits) or 'none'})", self.location)
        return self.splits[name]

    def captions_of(self, images) -> tuple[np.ndarray, np.ndarray]:
        """``captions_of_images`` of this index: caption indices of ``images`` grouped image by
        image, and each one's position in ``images``."""
        return captions_of_images(self.caption_image, images, self.num_images)

    def split_captions(self, name: str) -> np.ndarray:
        """Caption indices of the images of split ``name``: image by image in split order,
        each image's captions in index order."""
        return self.captions_of(self.split(name))[0]

    def split_rows(self, name: str, max_images: int | None = None):
        """Split ``name``'s images (the first ``max_images``), their captions grouped image by
        image, and each caption's position among those images: what an evaluation encodes."""
        images = self.split(name)[:max_images]
        captions, local = self.captions_of(images)
        return images, captions, local

    @cached_property
    def caption_keys(self) -> list[str]:
        """``<image id>#<n>`` of every caption (``caption_keys``)."""
        return caption_keys(self.image_ids, self.caption_image)

    @cached_property
    def fingerprint(self) -> str:
        """``caption_fingerprint`` of the captions."""
        return caption_fingerprint(self.captions)

    # -- deriving indices

    def select(self, splits=None) -> tuple[np.ndarray, CaptionIndex]:
        """The images of ``splits`` (all by default) as a new index, and their rows here.

        Rows keep this index's order (not split order), each image's captions follow it, and
        every requested split is renumbered to the new rows: what `vse extract` writes as a
        cache's index, and what RC mode and judgments rebuild from a dataset."""
        names = list(self.splits) if splits is None else list(splits)
        unknown = [s for s in names if s not in self.splits]
        if unknown or not names:
            raise VseError(f"no split {', '.join(map(repr, unknown)) or 'at all'} in the dataset "
                           f"(splits: {', '.join(self.splits) or 'none'})", self.location)
        rows = np.unique(np.concatenate([self.splits[s] for s in names]))
        if rows.size == 0:
            raise VseError(f"the splits {', '.join(names)} hold no images", self.location)
        position = np.full(self.num_images, -1, dtype=np.int64)
        position[rows] = np.arange(len(rows))
        kept, caption_image = self.captions_of(rows)
        return rows, CaptionIndex([self.image_ids[r] for r in rows], [self.captions[j] for j in kept],
                                  caption_image, {s: position[self.splits[s]] for s in names},
                                  location=self.location)

    def subset(self, split: str) -> tuple[np.ndarray, np.ndarray, CaptionIndex]:
        """The images of one split in split order, as an index whose only split covers them
        all; returns (image rows, caption rows, index)."""
        images = self.split(split)
        captions, local = self.captions_of(images)
        return images, captions, CaptionIndex([self.image_ids[i] for i in images],
                                              [self.captions[j] for j in captions], local,
                                              {split: np.arange(len(images))}, location=self.location)


class IndexedRows:
    """Rows of images described by a ``CaptionIndex`` (``self.index``): a feature cache, RC's
    images. Its lookups are the index's own, so every holder answers them alike."""

    index: CaptionIndex

    @property
    def image_ids(self) -> list[str]:
        return self.index.image_ids

    @property
    def captions(self) -> list[str]:
        return self.index.captions

    @property
    def caption_image(self) -> np.ndarray:
        return self.index.caption_image

    @property
    def split_names(self) -> list[str]:
        return self.index.split_names

    @property
    def caption_fingerprint(self) -> str:
        return self.index.fingerprint

    def split(self, name: str) -> np.ndarray:
        return self.index.split(name)

    def split_captions(self, name: str) -> np.ndarray:
        return self.index.split_captions(name)

    def split_rows(self, name: str, max_images: int | None = None):
        return self.index.split_rows(name, max_images)
