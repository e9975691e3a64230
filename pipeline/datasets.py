"""In-memory description of an image–caption dataset, and the readers of on-disk layouts.

A ``Dataset`` is metadata only (ids, paths, captions, splits): pixels and features are
read lazily by the stages that need them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class LoadReport:
    """What a reader skipped or changed, counted, so nothing is dropped silently."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, example: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        ex = self.examples.setdefault(kind, [])
        if len(ex) < 3:
            ex.append(example)

    def lines(self) -> list[str]:
        return [f"{kind}: {n} (e.g. {', '.join(self.examples.get(kind, []))})"
                for kind, n in sorted(self.counts.items())]


@dataclass
class Dataset:
    """Images, captions and splits.

    Captions are ordered by image: with the 5-caption protocol captions 5k..5k+4 belong to
    image k, and in general ``caption_image[j]`` is the index of caption j's image.
    ``splits[name]`` holds image indices (int64, in the order of the split file).
    ``image_paths`` may be ``None`` for feature-only datasets (VSE++ precomputed features).
    """

    name: str
    root: Path
    image_ids: list[str]
    image_paths: list[Path] | None
    captions: list[str]
    caption_image: np.ndarray
    splits: dict[str, np.ndarray]
    report: LoadReport = field(default_factory=LoadReport)
    features: np.ndarray | None = None  # only for precomputed-feature datasets

    def __post_init__(self):
        self.caption_image = np.asarray(self.caption_image, dtype=np.int64)
        self.splits = {k: np.asarray(v, dtype=np.int64) for k, v in self.splits.items()}

    @property
    def num_images(self) -> int:
        return len(self.image_ids)
