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

What an index was drawn for (``drawn_for``: the training split's name, its numbers of captions and
images, and the fingerprint of its captions in cache order) is written beside it: in a run folder
in ``noise.json``, beside a file of `vse noise-index` in ``FILE.npy.json`` (``sidecar``), with its
layout and sha256. Reading a file with such a note refuses an index drawn for another training
split, whatever its length; a bare public ``.npy`` (``data/noise/flickr8k/``, NCR's files) is read
by its length, with a note that nothing says what it was drawn for.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import VseError
from pipeline.core.fsutil import atomic_path
from pipeline.core.registry import NOISE_MODES
from pipeline.data.caption_index import caption_fingerprint

NOISE_FILE = "noise_index.npy"
NOISE_NOTE = "noise.json"
NOTE_FORMAT = "vse-noise-index"
LAYOUTS = NOISE_MODES  # what each entry stands for: a training caption or a training image
DRAWN_FOR_KEYS = ("training_captions", "training_images", "caption_fingerprint")  # compared; "split" is told


def drawn_for(split: str, training_captions, num_images: int) -> dict:
    """What an index over a training split is drawn for: ``training_captions`` (the texts of the
    split's captions, in cache order) and its number of images."""
    return {"split": split, "training_captions": len(training_captions), "training_images": int(num_images),
            "caption_fingerprint": caption_fingerprint(training_captions)}


def sidecar(path) -> Path:
    """The note beside an index file: a run folder's ``noise.json``, else ``FILE.json`` (FILE.npy.json)."""
    path = Path(path)
    return path.parent / NOISE_NOTE if path.name == NOISE_FILE else path.with_name(path.name + ".json")


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
    drawn_for: dict | None = None  # ``drawn_for``: the training split it is used with (None: not told)
    note: str | None = None        # what a reader should know (a bare file, read by its length)

    @classmethod
    def make(cls, mode: str, rate: float, seed: int, caption_image: np.ndarray,
             num_images: int, drawn_for: dict | None = None) -> NoiseIndex:
        """``caption_image`` (n_captions,): each training caption's training image (0..num_images-1)."""
        entries = (draw(len(caption_image), rate, seed, caption_image) if mode == "caption"
                   else draw(num_images, rate, seed))
        return cls(mode, entries, f"mode={mode} rate={rate:g} seed={seed}", caption_image, drawn_for)

    @classmethod
    def read(cls, path, caption_image: np.ndarray, num_images: int,
             drawn_for: dict | None = None) -> NoiseIndex:
        """An index file: one entry per training caption or per training image, integers in
        0..num_images-1; anything else refused in one line. With a note beside it (``sidecar``),
        its layout is the note's and, given ``drawn_for`` (the split it is to be used with), an index
        drawn for another split is refused; a bare file's layout is told by its length."""
        path = Path(path)
        try:
            entries = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise VseError(f"cannot read a noise index: not a .npy array ({str(exc).splitlines()[0][:120]})",
                           path) from None
        if entries.ndim != 1 or entries.dtype.kind not in "iu":
            raise VseError(f"a noise index is a 1-D integer array; this is {entries.dtype} of shape "
                           f"{entries.shape}", path)
        entries = entries.astype(np.int64)
        sizes = {"caption": len(caption_image), "image": num_images}
        told = _read_note(path, _sha256(entries))
        note = None
        if told is None:  # a bare file: its length says which layout it is
            layout = next((name for name in LAYOUTS if len(entries) == sizes[name]), None)
            if layout is None:
                raise VseError(f"{len(entries)} entries: the training split has {len(caption_image)} "
                               f"captions and {num_images} images (one entry per caption, or per image)",
                               path)
            note = (f"{path.name} is a bare index: read as {layout}-level by its length; nothing says which "
                    f"split it was drawn for ({sidecar(path).name} beside it would)")
        else:
            layout = told["layout"]
            if len(entries) != sizes[layout]:
                raise VseError(f"a {layout}-level index of {len(entries)} entries ({sidecar(path).name}), "
                               f"but the training split has {sizes[layout]} {layout}s", path)
            _check_drawn_for(told.get("drawn_for"), drawn_for, path)
        if len(entries) and (entries.min() < 0 or entries.max() >= num_images):
            raise VseError(f"entries {int(entries.min())}..{int(entries.max())}: training images are "
                           f"0..{num_images - 1}", path)
        return cls(layout, entries, str(path), caption_image, drawn_for, note)

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
        return _sha256(self.entries)

    def save(self, folder: Path) -> None:
        """``noise_index.npy`` (its own layout) and ``noise.json`` (what it is) in ``folder``. A
        ``noise_index.npy`` already there with these entries is left as it is (a resumed run's)."""
        path = Path(folder) / NOISE_FILE
        if not (path.is_file() and _kept_sha256(path) == self.sha256()):
            self.write(path)
        else:
            self._write_note(sidecar(path))

    def write(self, path) -> None:
        """The index as an int64 ``.npy`` at ``path`` and its note beside it (``sidecar``)."""
        with atomic_path(Path(path)) as tmp:
            with open(tmp, "wb") as fh:
                np.save(fh, self.entries.astype("<i8"), allow_pickle=False)
        self._write_note(sidecar(path))

    def _write_note(self, path: Path) -> None:
        note = {"format": NOTE_FORMAT, "layout": self.layout, "source": self.source, "sha256": self.sha256(),
                "true_rate": self.true_rate(), "entries": len(self.entries), "drawn_for": self.drawn_for}
        with atomic_path(path) as tmp:
            Path(tmp).write_text(json.dumps(note, indent=2) + "\n")


def _sha256(entries: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(entries).astype("<i8").tobytes()).hexdigest()


def _kept_sha256(path: Path) -> str | None:
    try:
        entries = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    return _sha256(entries) if entries.ndim == 1 and entries.dtype.kind in "iu" else None


def saved_sha256(folder: Path) -> str | None:
    """The sha256 of the noise index a run folder kept: its ``noise_index.npy``'s (the truth, what
    the run trained on), else the one ``noise.json`` records; None when it holds neither."""
    kept = Path(folder) / NOISE_FILE
    if kept.is_file():
        digest = _kept_sha256(kept)
        if digest is None:
            raise VseError("the run's noise index is not a 1-D integer .npy array", kept)
        return digest
    note = Path(folder) / NOISE_NOTE
    if not note.is_file():
        return None
    try:
        return json.loads(note.read_text())["sha256"]
    except (ValueError, KeyError, TypeError):
        raise VseError("cannot read the run's noise note", note) from None


def _read_note(path: Path, sha256: str) -> dict | None:
    """The note beside index file ``path`` (``sidecar``), checked: it describes these entries; None
    when there is none."""
    note_path = sidecar(path)
    if not note_path.is_file():
        return None
    try:
        note = json.loads(note_path.read_text(encoding="utf-8"))
        layout, recorded = note["layout"], note["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        raise VseError(f"cannot read the note of the noise index {path.name}", note_path) from None
    if layout not in LAYOUTS:
        raise VseError(f"layout {layout!r}: a noise index is {' or '.join(LAYOUTS)}-level", note_path)
    if recorded != sha256:
        raise VseError(f"describes another index than {path.name} (sha256 {recorded[:12]}…, the file's "
                       f"{sha256[:12]}…): the file was replaced without its note", note_path)
    return note


def _check_drawn_for(recorded, wanted, path: Path) -> None:
    """VseError unless an index drawn for ``recorded`` (a note's ``drawn_for``) is for ``wanted``."""
    if not recorded or not wanted:
        return
    if any(recorded.get(key) != wanted.get(key) for key in DRAWN_FOR_KEYS):
        def told(d):
            return (f"split {d.get('split')!r}: {d.get('training_captions')} captions, "
                    f"{d.get('training_images')} images, caption fingerprint "
                    f"{str(d.get('caption_fingerprint'))[:12]}…")
        raise VseError(f"drawn for another training split ({told(recorded)}); this run's is {told(wanted)}",
                       path)
