"""What every dataset reader shares: the in-memory ``Dataset``, the skip report and image decoding;
the path and text helpers a reader reads its files with are in ``toolkit``, so each reader module
holds only its own layout.

A ``Dataset`` is metadata only (ids, paths, captions, splits): pixels and features are
read lazily by the stages that need them.

Readers (``load_dataset(kind, root, **opts)``):

- ``flickr8k``       the official Flickr8k layout (token file + three split files).
- ``karpathy``       Karpathy's split JSON (``dataset_{coco,flickr30k,flickr8k}.json``).
- ``csv``            one (image path, caption) row per line, open_clip's convention (``CsvLayout``).
- ``vsepp-precomp``  VSE++ precomputed features (``{split}_ims.npy`` + ``{split}_caps.txt``).

Input policy, the same for every reader:

- Text files must be UTF-8 (a leading BOM is accepted).  Anything else is a ``VseError``
  naming the file and line: caption text is never altered silently.
- Rows that cannot be used (caption of a missing image, duplicate key, empty caption,
  a name that would leave the dataset root, a split entry naming an unknown image) are
  skipped and counted in ``Dataset.report``.
- Images with more than ``captions_per_image`` captions keep their first ones; images with
  fewer are dropped (both counted).  ``captions_per_image=None`` keeps every caption.
- Missing files and structurally broken files raise ``VseError`` naming the file.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from pipeline.core.errors import VseError
from pipeline.data.caption_index import CaptionIndex

# Image folder names used by the different Flickr8k/Flickr30k distributions, in the order
# they are tried.
IMAGE_DIR_NAMES = ("images", "Flicker8k_Dataset", "Images", "flickr30k-images")


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


class ConcatenatedRows:
    """Read-only row-wise concatenation of arrays (e.g. memory-mapped splits), no copy.

    Supports ``len``, ``shape``, ``dtype``, ``ndim`` and row indexing by an int, a slice or
    an integer array; indexing returns an in-memory ``np.ndarray``.
    """

    def __init__(self, parts):
        if not parts:
            raise ValueError("ConcatenatedRows needs at least one array")
        self.parts = list(parts)
        self.starts = np.cumsum([0] + [len(p) for p in self.parts])
        self.shape = (int(self.starts[-1]),) + tuple(self.parts[0].shape[1:])
        self.dtype = self.parts[0].dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index):
        n = len(self)
        if isinstance(index, (int, np.integer)):
            row = int(index) + n if index < 0 else int(index)
            if not 0 <= row < n:
                raise IndexError(f"row {index} out of range for {n} rows")
            part = int(np.searchsorted(self.starts, row, side="right")) - 1
            return np.asarray(self.parts[part][row - self.starts[part]])
        if isinstance(index, slice):
            rows = np.arange(*index.indices(n))
        else:
            rows = np.asarray(index)
            if rows.dtype == bool:
                rows = np.flatnonzero(rows)
            rows = np.where(rows < 0, rows + n, rows).astype(np.int64)
            if rows.size and (rows.min() < 0 or rows.max() >= n):
                raise IndexError(f"row index out of range for {n} rows")
        out = np.empty((len(rows),) + self.shape[1:], dtype=self.dtype)
        part_of = np.searchsorted(self.starts, rows, side="right") - 1
        for part in np.unique(part_of):
            mask = part_of == part
            out[mask] = self.parts[part][rows[mask] - self.starts[part]]
        return out

    def __array__(self, dtype=None, copy=None):
        out = np.concatenate([np.asarray(p) for p in self.parts])
        return out if dtype is None else out.astype(dtype)


@dataclass(kw_only=True)
class Dataset(CaptionIndex):
    """Images, captions and splits: a ``CaptionIndex`` (captions grouped by image, splits of
    image indices in the order of the split file) with the images' files.

    ``image_paths`` may be ``None`` for feature-only datasets (VSE++ precomputed features).
    """

    name: str
    root: Path
    image_paths: list[Path] | None
    report: LoadReport = field(default_factory=LoadReport)
    features: np.ndarray | ConcatenatedRows | None = None  # precomputed-feature datasets
    # How the reader was told to read, and what it decided (csv: columns, separator, the
    # seeded split's ratio and seed), as cache attributes: `vse extract` records them so the
    # same reading can be repeated.
    reader_attrs: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.location is None:
            self.location = self.root
        super().__post_init__()

    def subset(self, split: str) -> Dataset:
        """The images of one split (in split order) with their captions, as a Dataset.

        The result has a single split ``split`` covering all its images.  Precomputed
        features of those images are read into memory.
        """
        images, _, index = CaptionIndex.subset(self, split)
        return Dataset(
            name=self.name,
            root=self.root,
            image_ids=index.image_ids,
            image_paths=None if self.image_paths is None
            else [self.image_paths[i] for i in images],
            captions=index.captions,
            caption_image=index.caption_image,
            splits=index.splits,
            report=self.report,
            features=None if self.features is None else self.features[images],
            reader_attrs=self.reader_attrs,
        )

    def summary(self) -> str:
        """A few human-readable lines: sizes, splits and what the reader skipped."""
        per_image = self.captions_per_image
        layout = (f"{per_image} per image" if per_image is not None
                  else "variable number per image")
        lines = [f"{self.name} ({self.root}): {self.num_images} images, "
                 f"{self.num_captions} captions ({layout})"]
        if self.features is not None:
            lines.append(f"features: {tuple(self.features.shape)} {self.features.dtype}")
        if self.splits:
            lines.append("splits: " + ", ".join(f"{name} {len(idx)}"
                                                for name, idx in self.splits.items()))
        report = self.report.lines()
        lines.append("skipped or changed:" + ("" if report else " nothing"))
        lines.extend(f"  {line}" for line in report)
        return "\n".join(lines)


# The widest image any stage decodes, long side over short side. Every pipeline resizes the short
# side to a fixed size (256 for a 224 network), so a 1 × 8,000 PNG of 102 bytes would become
# 256 × 2,048,000 pixels (1.5 GB) after its resize: the bound on pixels before decoding does not
# bound the image after the resize, this does (256 × 5,120 at most). Panoramas reach 10:1.
MAX_ASPECT_RATIO = 20


def image_shape_problem(width: int, height: int) -> str | None:
    """Why an image of this size is refused by every stage, or None (the one rule: extract, RC,
    embed, search and serve all apply it)."""
    short, long = sorted((int(width), int(height)))
    if short < 1:
        return f"is {width}x{height} pixels: an image needs at least one pixel a side"
    if long > MAX_ASPECT_RATIO * short:
        return (f"is {width}x{height} pixels, {long / short:.0f} times as long as it is wide; at most "
                f"{MAX_ASPECT_RATIO}:1 (resized to the network's short side it would be too large)")
    return None


def open_image(path) -> Image.Image:
    """Decode an image file fully and return it as RGB.

    Grayscale, palette and CMYK images are converted; images with transparency are
    composited onto white.  Empty, truncated, unreadable or unknown-format files, and
    images larger than ``PIL.Image.MAX_IMAGE_PIXELS`` (decompression bombs) or wider than
    ``MAX_ASPECT_RATIO``, raise ``VseError`` naming the file.  EXIF orientation is not applied
    (the published feature pipelines do not apply it either).
    """
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            raise VseError("empty image file (0 bytes)", path)
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                problem = image_shape_problem(*image.size)  # before decoding a pixel
                if problem:
                    raise VseError(f"image {problem}", path)
                image.load()
                return _to_rgb(image)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise VseError(f"image larger than {Image.MAX_IMAGE_PIXELS} pixels "
                       "(possible decompression bomb)", path) from None
    except FileNotFoundError:
        raise VseError("image file not found", path) from None
    except Image.UnidentifiedImageError:
        raise VseError("not an image file PIL can read (unknown format)", path) from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise VseError(f"cannot decode image ({exc})", path) from None


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.has_transparency_data:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if image.mode in ("I", "I;16", "I;16B", "I;16L"):
        # 16-bit grayscale: convert("RGB") would clip at 255; keep the high byte instead.
        values = np.clip(np.asarray(image, dtype=np.int64), 0, 65535) >> 8
        image = Image.fromarray(values.astype(np.uint8))
    return image.convert("RGB")


def image_folders(root) -> list[Path]:
    """Where a dataset's images may be, in the order tried: ``root``, then its image
    subfolders (``IMAGE_DIR_NAMES``). Image ids are paths relative to one of them."""
    root = Path(root)
    return [root] + [root / name for name in IMAGE_DIR_NAMES]
