"""In-memory description of an image–caption dataset, and the readers of on-disk layouts.

A ``Dataset`` is metadata only (ids, paths, captions, splits): pixels and features are
read lazily by the stages that need them.

Readers (``load_dataset(kind, root, **opts)``):

- ``flickr8k``       the official Flickr8k layout (token file + three split files).
- ``karpathy``       Karpathy's split JSON (``dataset_{coco,flickr30k,flickr8k}.json``).
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

import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from .errors import VseError
from .index import CaptionIndex

# The dataset layouts `--dataset` accepts (readers: ``load_dataset``); the ones with image files
# (RC training, evaluation on images, relevance on a dataset's captions) are IMAGE_DATASET_KINDS.
DATASET_KINDS = ("flickr8k", "karpathy", "vsepp-precomp")
IMAGE_DATASET_KINDS = ("flickr8k", "karpathy")
FLICKR8K_TOKEN_FILE = "Flickr8k.token.txt"
FLICKR8K_SPLIT_FILES = {
    "train": "Flickr_8k.trainImages.txt",
    "dev": "Flickr_8k.devImages.txt",
    "test": "Flickr_8k.testImages.txt",
}
# Image folder names used by the different Flickr8k/Flickr30k distributions, in the order
# they are tried.
IMAGE_DIR_NAMES = ("images", "Flicker8k_Dataset", "Images", "flickr30k-images")
KARPATHY_SPLITS = {"train": "train", "val": "dev", "test": "test", "restval": "restval"}
PRECOMP_SPLITS = ("train", "dev", "test", "testall")
PRECOMP_CAPTIONS_PER_IMAGE = 5


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


# ---------------------------------------------------------------------------- readers


def load_dataset(kind: str, root, **opts) -> Dataset:
    """Read a dataset of the given kind (one of ``DATASET_KINDS``)."""
    readers = _readers()
    if kind not in readers:
        raise VseError(f"unknown dataset kind {kind!r} (known: {', '.join(readers)})")
    return readers[kind](root, **opts)


def _readers() -> dict:
    return {"flickr8k": load_flickr8k, "karpathy": load_karpathy, "vsepp-precomp": load_vsepp_precomp}


def load_flickr8k(root, *, image_dir=None, captions_per_image: int | None = 5) -> Dataset:
    """Official Flickr8k layout: ``Flickr8k.token.txt`` (``<image>#<n>\\t<caption>``),
    ``Flickr_8k.{train,dev,test}Images.txt`` and an image folder (``images/``,
    ``Flicker8k_Dataset/`` or ``Images/``, detected; or ``image_dir``).

    The official token file has 5 rows keyed ``2258277193_586949ec62.jpg.1`` whose image
    does not exist; they are skipped as ``caption_missing_image``.
    """
    root = _existing_dir(root, FOLDER_LAYOUT_HINT)
    images_dir = _find_image_dir(root, image_dir)
    available = _list_files(images_dir)
    report = LoadReport()
    token_path = root / FLICKR8K_TOKEN_FILE
    captions: dict[str, list[str]] = {}
    seen_keys: set[str] = set()
    for lineno, line in _numbered_lines(token_path):
        if not line.strip():
            continue
        where = f"{token_path.name}:{lineno}"
        key, tab, caption = line.partition("\t")
        key = key.strip()
        name, hash_sign, _ = key.rpartition("#")
        if not tab or not hash_sign or not name:
            report.add("caption_malformed_line", where)
        elif not _is_safe_relative(name):
            report.add("unsafe_path", f"{name} ({where})")
        elif name not in available:
            report.add("caption_missing_image", f"{key} ({where})")
        elif key in seen_keys:
            report.add("caption_duplicate_key", f"{key} ({where})")
        elif not caption.strip():
            report.add("caption_empty", f"{key} ({where})")
        else:
            seen_keys.add(key)
            captions.setdefault(name, []).append(caption.strip())
    if not captions:
        raise VseError("no usable caption rows (expected '<image>#<n><TAB><caption>')",
                       token_path)
    for name in sorted(available.difference(captions)):
        report.add("image_without_captions", name)
    split_lists = {split: _read_split_file(root / filename, report)
                   for split, filename in FLICKR8K_SPLIT_FILES.items()}
    return _assemble("flickr8k", root, captions, {n: images_dir / n for n in captions},
                     split_lists, captions_per_image, report)


def load_karpathy(root, *, file: str | None = None, image_root=None, restval: bool = False,
                  captions_per_image: int | None = 5, check_images: bool = True) -> Dataset:
    """Karpathy's split JSON: ``images[]`` with ``filepath`` (optional), ``filename``,
    ``split`` (train/val/test/restval) and ``sentences[].raw``.

    ``root`` is the JSON file or a folder holding exactly one ``dataset_*.json`` (or name
    it with ``file``).  Images live at ``<image_root>/<filepath>/<filename>``; by default
    ``image_root`` is the JSON's folder or its image subfolder (``images/`` …) holding the
    first image.  ``val`` becomes ``dev``; ``restval=True`` appends ``restval`` to ``train``
    (the papers' "+rV"), otherwise it stays a split of its own.  With ``check_images``
    images whose file is missing are skipped and counted.
    """
    json_path = _find_karpathy_json(Path(root), file)
    try:
        data = json.loads(_decode_utf8(json_path))
    except json.JSONDecodeError as exc:
        raise VseError(f"line {exc.lineno}: invalid JSON ({exc.msg})", json_path) from None
    entries = data.get("images") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise VseError("not a Karpathy split file (no 'images' list)", json_path)
    report = LoadReport()
    parsed = []  # (image id, split, [captions])
    for i, entry in enumerate(entries):
        entry = entry if isinstance(entry, dict) else {}
        filename, filepath = entry.get("filename"), entry.get("filepath") or ""
        if not (filename and isinstance(filename, str) and isinstance(filepath, str)
                and isinstance(entry.get("split"), str)):
            raise VseError(f"images[{i}]: needs 'filename' and 'split' strings", json_path)
        if entry["split"] not in KARPATHY_SPLITS:
            raise VseError(f"images[{i}]: unknown split {entry['split']!r} "
                           f"(expected {', '.join(KARPATHY_SPLITS)})", json_path)
        image_id = f"{filepath.rstrip('/')}/{filename}" if filepath else filename
        if not _is_safe_relative(image_id):
            report.add("unsafe_path", f"{image_id} (images[{i}])")
            continue
        texts = []
        for s, sentence in enumerate(entry.get("sentences") or []):
            raw = sentence.get("raw") if isinstance(sentence, dict) else None
            if not isinstance(raw, str):
                report.add("caption_malformed_line", f"images[{i}].sentences[{s}]")
            elif not raw.strip():
                report.add("caption_empty", f"images[{i}].sentences[{s}]")
            else:
                texts.append(raw.strip())
        parsed.append((image_id, KARPATHY_SPLITS[entry["split"]], texts))
    image_root = (_existing_dir(image_root) if image_root is not None
                  else _guess_image_root(json_path.parent, [p[0] for p in parsed]))
    exists = _FileLookup() if check_images else None
    captions: dict[str, list[str]] = {}
    split_lists: dict[str, list[str]] = {}
    for image_id, split, texts in parsed:
        if image_id in captions:
            report.add("image_duplicate_id", image_id)
        elif exists is not None and not exists(image_root / image_id):
            report.add("image_missing", image_id)
        elif not texts:
            report.add("image_without_captions", image_id)
        else:
            captions[image_id] = texts
            target = "train" if restval and split == "restval" else split
            split_lists.setdefault(target, []).append(image_id)
    if not captions:
        hint = (f"none of the {len(parsed)} listed images exist under {image_root} "
                "(pass image_root, or check_images=False)" if parsed and exists is not None
                else "no usable images")
        raise VseError(hint, json_path)
    split_lists = {s: split_lists[s] for s in ("train", "dev", "test", "restval")
                   if s in split_lists}
    name = json_path.stem.removeprefix("dataset_")
    return _assemble(name, json_path.parent, captions,
                     {i: image_root / i for i in captions}, split_lists,
                     captions_per_image, report)


def load_vsepp_precomp(root, *, splits=None,
                       captions_per_image: int | None = PRECOMP_CAPTIONS_PER_IMAGE) -> Dataset:
    """VSE++ precomputed features: ``{split}_ims.npy`` and ``{split}_caps.txt`` for the
    splits present among train/dev/test/testall (or those named in ``splits``).

    Captions 5k..5k+4 of a split are image k.  An image array with one row per caption
    (as VSE++ ships Flickr30k/8k) is reduced to every 5th row.  The splits are concatenated
    into one Dataset (image ids ``<split>/<k>``); ``features`` reads the ``.npy`` files
    memory-mapped.  ``test`` and ``testall`` of COCO overlap: they become separate images.
    """
    if captions_per_image not in (PRECOMP_CAPTIONS_PER_IMAGE, None):
        raise VseError("vsepp-precomp has 5 captions per image by construction "
                       f"(captions_per_image={captions_per_image} is not possible)", root)
    root = _existing_dir(root, FOLDER_LAYOUT_HINT)
    names = [s for s in PRECOMP_SPLITS if (root / f"{s}_caps.txt").is_file()]
    if splits is not None:
        names = list(splits)
        for split in names:
            if not re.fullmatch(r"[\w-]+", split):
                raise VseError(f"bad split name {split!r} (letters, digits, _ and - only)")
            _require_file(root / f"{split}_caps.txt")
    if not names:
        raise VseError(f"no <split>_caps.txt for any of {', '.join(PRECOMP_SPLITS)}", root)
    report = LoadReport()
    image_ids, captions, parts, split_index = [], [], [], {}
    for split in names:
        split_captions = _read_precomp_captions(root / f"{split}_caps.txt", report)
        features = _read_precomp_features(root / f"{split}_ims.npy", len(split_captions))
        start = len(image_ids)
        image_ids.extend(f"{split}/{k}" for k in range(len(features)))
        captions.extend(split_captions)
        parts.append(features)
        split_index[split] = np.arange(start, len(image_ids))
    return Dataset(
        name=root.name,
        root=root,
        image_ids=image_ids,
        image_paths=None,
        captions=captions,
        caption_image=np.repeat(np.arange(len(image_ids)), PRECOMP_CAPTIONS_PER_IMAGE),
        splits=split_index,
        report=report,
        features=parts[0] if len(parts) == 1 else ConcatenatedRows(parts),
    )


# ---------------------------------------------------------------------------- images


def open_image(path) -> Image.Image:
    """Decode an image file fully and return it as RGB.

    Grayscale, palette and CMYK images are converted; images with transparency are
    composited onto white.  Empty, truncated, unreadable or unknown-format files, and
    images larger than ``PIL.Image.MAX_IMAGE_PIXELS`` (decompression bombs), raise
    ``VseError`` naming the file.  EXIF orientation is not applied (the published feature
    pipelines do not apply it either).
    """
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            raise VseError("empty image file (0 bytes)", path)
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
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


# ---------------------------------------------------------------------------- helpers


# Said when a folder layout (flickr8k, vsepp-precomp) is given a file as its root.
FOLDER_LAYOUT_HINT = "; only the karpathy layout takes a file (its dataset_*.json)"


def _existing_dir(path, hint: str = "") -> Path:
    path = Path(path).absolute()
    if not path.is_dir():
        raise VseError("dataset folder not found" if not path.exists() else "not a folder" + hint,
                       path)
    return path


def _require_file(path: Path) -> Path:
    if not path.is_file():
        raise VseError("file not found", path)
    return path


def _decode_utf8(path: Path) -> str:
    """The file's text; invalid UTF-8 is a VseError naming the line."""
    try:
        raw = _require_file(path).read_bytes()
    except OSError as exc:
        raise VseError(f"cannot read ({exc.strerror})", path) from None
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise VseError(f"line {line}: not valid UTF-8 (byte 0x{raw[exc.start]:02x}); "
                       "re-save the file as UTF-8", path) from None


def _numbered_lines(path: Path):
    """(line number, line) pairs, 1-based, without line terminators (LF or CRLF)."""
    lines = _decode_utf8(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return ((i, line.rstrip("\r")) for i, line in enumerate(lines, 1))


def _is_safe_relative(name: str) -> bool:
    """True when ``name`` is a relative path that cannot leave the folder it is joined to."""
    return (bool(name) and not name.startswith("/") and "\x00" not in name
            and "\\" not in name and ".." not in name.split("/"))


def _list_files(folder: Path) -> set[str]:
    with os.scandir(folder) as entries:
        return {e.name for e in entries if e.is_file() and not e.name.startswith(".")}


class _FileLookup:
    """``lookup(path)`` → whether the file exists, listing each folder once."""

    def __init__(self):
        self.folders: dict[Path, set[str]] = {}

    def __call__(self, path: Path) -> bool:
        folder = path.parent
        if folder not in self.folders:
            self.folders[folder] = _list_files(folder) if folder.is_dir() else set()
        return path.name in self.folders[folder]


def _find_image_dir(root: Path, image_dir) -> Path:
    if image_dir is not None:
        folder = Path(image_dir) if Path(image_dir).is_absolute() else root / image_dir
        return _existing_dir(folder)
    for name in IMAGE_DIR_NAMES:
        if (root / name).is_dir():
            return root / name
    raise VseError(f"no image folder ({', '.join(n + '/' for n in IMAGE_DIR_NAMES)})", root)


def image_folders(root) -> list[Path]:
    """Where a dataset's images may be, in the order tried: ``root``, then its image
    subfolders (``IMAGE_DIR_NAMES``). Image ids are paths relative to one of them."""
    root = Path(root)
    return [root] + [root / name for name in IMAGE_DIR_NAMES]


def _guess_image_root(folder: Path, image_ids: list[str]) -> Path:
    """The JSON's folder or its first image subfolder that holds the first listed image."""
    for candidate in image_folders(folder):
        if image_ids and (candidate / image_ids[0]).is_file():
            return candidate
    return folder


def _find_karpathy_json(root: Path, file: str | None) -> Path:
    if root.is_file():
        return root.absolute()
    folder = _existing_dir(root)
    if file is not None:
        return _require_file(folder / file)
    found = sorted(folder.glob("dataset_*.json"))
    if len(found) != 1:
        problem = "no dataset_*.json" if not found else (
            f"several dataset_*.json ({', '.join(p.name for p in found)}): give the file itself "
            f"as the root, e.g. {found[0]}")
        raise VseError(problem, folder)
    return found[0]


def _read_split_file(path: Path, report: LoadReport) -> list[str]:
    names = []
    for lineno, line in _numbered_lines(path):
        name = line.strip()
        if not name:
            continue
        if _is_safe_relative(name):
            names.append(name)
        else:
            report.add("unsafe_path", f"{name} ({path.name}:{lineno})")
    return names


def _assemble(name: str, root: Path, captions: dict[str, list[str]],
              paths: dict[str, Path], split_lists: dict[str, list[str]],
              captions_per_image: int | None, report: LoadReport) -> Dataset:
    """Apply the captions-per-image policy and index images, captions and splits.

    ``captions`` maps image id → its captions in reading order (dict order = image order).
    """
    if captions_per_image is not None and captions_per_image < 1:
        raise VseError(f"captions_per_image must be positive or None, "
                       f"got {captions_per_image}")
    kept: dict[str, list[str]] = {}
    dropped: set[str] = set()
    for image_id, texts in captions.items():
        if captions_per_image is None or len(texts) == captions_per_image:
            kept[image_id] = texts
        elif len(texts) > captions_per_image:
            report.add("image_extra_captions_dropped", f"{image_id} ({len(texts)} captions)")
            kept[image_id] = texts[:captions_per_image]
        else:
            report.add("image_too_few_captions", f"{image_id} ({len(texts)} captions)")
            dropped.add(image_id)
    if not kept:
        raise VseError(f"no image has {captions_per_image} captions", root)
    index = {image_id: i for i, image_id in enumerate(kept)}
    splits: dict[str, np.ndarray] = {}
    owner: dict[str, str] = {}
    for split, names in split_lists.items():
        rows = []
        for image_id in names:
            if image_id in dropped:
                continue  # already counted as image_too_few_captions
            if image_id not in index:
                report.add("split_unknown_image", f"{image_id} ({split})")
            elif owner.get(image_id) == split:
                report.add("split_duplicate_image", f"{image_id} ({split})")
            elif image_id in owner:
                raise VseError(f"image {image_id} is in both the {owner[image_id]} and the "
                               f"{split} split", root)
            else:
                owner[image_id] = split
                rows.append(index[image_id])
        splits[split] = np.asarray(rows, dtype=np.int64)
    counts = np.fromiter((len(t) for t in kept.values()), dtype=np.int64, count=len(kept))
    return Dataset(
        name=name,
        root=root,
        image_ids=list(kept),
        image_paths=[paths[image_id] for image_id in kept],
        captions=[text for texts in kept.values() for text in texts],
        caption_image=np.repeat(np.arange(len(kept), dtype=np.int64), counts),
        splits=splits,
        report=report,
    )


def _read_precomp_captions(path: Path, report: LoadReport) -> list[str]:
    captions = []
    for lineno, line in _numbered_lines(path):
        if not line.strip():
            # Kept: dropping it would shift every later caption onto the wrong image.
            report.add("caption_empty_kept", f"{path.name}:{lineno}")
        captions.append(line.strip())
    if not captions or len(captions) % PRECOMP_CAPTIONS_PER_IMAGE:
        raise VseError(f"{len(captions)} captions is not a positive multiple of "
                       f"{PRECOMP_CAPTIONS_PER_IMAGE}", path)
    return captions


def _read_precomp_features(path: Path, num_captions: int) -> np.ndarray:
    try:
        features = np.load(_require_file(path), mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise VseError(f"not a readable .npy array ({exc})", path) from None
    if features.ndim != 2:
        # SCAN / bottom-up-attention "precomp" folders use VSE++'s file names for (N, 36, 2048)
        # region features. Refused rather than pooled: no published VSE++-family number was
        # measured on pooled regions, and the models here take one vector per image.
        what = (f"region features ({features.shape[1]} regions × {features.shape[2]}, SCAN style) "
                "are not supported" if features.ndim == 3 else "not a 2-D array")
        raise VseError(f"shape {features.shape}: {what}; vsepp-precomp needs one feature "
                       "vector per image (or per caption), shape (rows, D)", path)
    num_images = num_captions // PRECOMP_CAPTIONS_PER_IMAGE
    if len(features) not in (num_images, num_captions):
        raise VseError(f"shape {features.shape} does not match {num_captions} captions "
                       f"(expected {num_images} or {num_captions} rows)", path)
    if len(features) == num_captions:
        features = features[::PRECOMP_CAPTIONS_PER_IMAGE]  # one row per caption
    return features
