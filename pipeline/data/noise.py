"""Noisy correspondence: training pairs whose caption is shown with another image, by a noise
index written once and kept in the run folder (docs/PROTOCOL.md, "Noisy correspondence").

Two modes (``registry.NOISE_MODES``):

- ``caption`` (NCR's): a fraction r of the training captions, drawn at random, get their images
  permuted among themselves. The index has one entry per training caption: the training image
  it is shown with (NCR's, BiCro's and L2RM's layout, ``t2i_index``).
- ``image`` (DECL's and RCL's): a fraction r of the training images, drawn at random, are
  permuted among themselves, and their captions follow them. The index has one entry per
  training image: the training image its captions are shown with.

Both draw with numpy's legacy ``RandomState(seed)`` in the order of NCR's ``data.py``: shuffle the
positions, take the first ⌊r·n⌋, shuffle their values, put them back. A seed reproduces the
file byte for byte. Positions are local to the training split in cache order: training caption
k is the k-th caption of a training image, training image m the m-th training image. The true
rate (captions that end up with another image) is below r: a permutation may leave an entry
where it was.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import VseError
from pipeline.core.fsutil import atomic_path

NOISE_FILE = "noise_index.npy"
NOISE_NOTE = "noise.json"


def draw(n: int, rate: float, seed: int, values: np.ndarray | None = None) -> np.ndarray:
    """NCR's draw: ``values`` (default 0..n-1) with a random ⌊rate·n⌋ of its positions permuted."""
    out = np.arange(n, dtype=np.int64) if values is None else np.array(values, dtype=np.int64)
    rng = np.random.RandomState(seed)
    positions = np.arange(n)
    rng.shuffle(positions)
    chosen = positions[:int(rate * n)]
    moved = out[chosen]
    rng.shuffle(moved)
    out[chosen] = moved
    return out


@dataclass
class NoiseIndex:
    """A noise index over a training split: ``layout`` "caption" or "image" and its entries."""

    layout: str
    entries: np.ndarray  # int64: per training caption or per training image, a training image
    source: str          # "mode=caption rate=0.2 seed=0", or the file it was read from
    caption_image: np.ndarray  # each training caption's own training image (the clean pairs)

    @classmethod
    def make(cls, mode: str, rate: float, seed: int, caption_image: np.ndarray,
             num_images: int) -> NoiseIndex:
        """``caption_image`` (n_captions,): each training caption's training image (0..num_images-1)."""
        entries = (draw(len(caption_image), rate, seed, caption_image) if mode == "caption"
                   else draw(num_images, rate, seed))
        return cls(mode, entries, f"mode={mode} rate={rate:g} seed={seed}", caption_image)

    @classmethod
    def read(cls, path, caption_image: np.ndarray, num_images: int) -> NoiseIndex:
        """A public index file: one entry per training caption or per training image (told by its
        length), integers in 0..num_images-1; anything else refused in one line."""
        path = Path(path)
        try:
            entries = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise VseError(f"cannot read a noise index: not a .npy array ({str(exc).splitlines()[0][:120]})",
                           path) from None
        if entries.ndim != 1 or entries.dtype.kind not in "iu":
            raise VseError(f"a noise index is a 1-D integer array; this is {entries.dtype} of shape "
                           f"{entries.shape}", path)
        if len(entries) == len(caption_image):
            layout = "caption"
        elif len(entries) == num_images:
            layout = "image"
        else:
            raise VseError(f"{len(entries)} entries: the training split has {len(caption_image)} captions "
                           f"and {num_images} images (one entry per caption, or per image)", path)
        if len(entries) and (entries.min() < 0 or entries.max() >= num_images):
            raise VseError(f"entries {int(entries.min())}..{int(entries.max())}: training images are "
                           f"0..{num_images - 1}", path)
        return cls(layout, entries.astype(np.int64), str(path), caption_image)

    def per_caption(self) -> np.ndarray:
        """The training image each training caption is shown with."""
        return self.entries if self.layout == "caption" else self.entries[self.caption_image]

    def noisy(self) -> np.ndarray:
        """(n_captions,) bool: the training captions shown with another image than their own."""
        return self.per_caption() != self.caption_image

    def true_rate(self) -> float:
        """The share of training captions shown with another image than their own."""
        return float(np.mean(self.noisy())) if len(self.caption_image) else 0.0

    def sha256(self) -> str:
        return hashlib.sha256(self.entries.astype("<i8").tobytes()).hexdigest()

    def save(self, folder: Path) -> None:
        """``noise_index.npy`` (its own layout) and ``noise.json`` (what it is) in ``folder``."""
        with atomic_path(Path(folder) / NOISE_FILE) as tmp:
            with open(tmp, "wb") as fh:
                np.save(fh, self.entries.astype("<i8"), allow_pickle=False)
        note = {"layout": self.layout, "source": self.source, "sha256": self.sha256(),
                "true_rate": self.true_rate(), "entries": len(self.entries)}
        with atomic_path(Path(folder) / NOISE_NOTE) as tmp:
            Path(tmp).write_text(json.dumps(note, indent=2) + "\n")


def saved_sha256(folder: Path) -> str | None:
    """The sha256 of the noise index a run folder kept, or None."""
    note = Path(folder) / NOISE_NOTE
    if not note.is_file():
        return None
    try:
        return json.loads(note.read_text())["sha256"]
    except (ValueError, KeyError, TypeError):
        raise VseError("cannot read the run's noise note", note) from None
