"""In-memory description of an image–caption dataset, and the readers of on-disk layouts.

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

import csv
import hashlib
import io
import json
import math
import os
import posixpath
import re
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
from PIL import Image

from pipeline.core.errors import VseError
from pipeline.data.caption_index import CaptionIndex

# The dataset layouts `--dataset` accepts (readers: ``load_dataset``); the ones with image files
# (RC training, evaluation on images, relevance on a dataset's captions) are IMAGE_DATASET_KINDS:
# all but the feature-only ones.
DATASET_KINDS = ("flickr8k", "karpathy", "csv", "vsepp-precomp")
FEATURE_ONLY_DATASET_KINDS = ("vsepp-precomp",)
IMAGE_DATASET_KINDS = tuple(k for k in DATASET_KINDS if k not in FEATURE_ONLY_DATASET_KINDS)
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


# ---------------------------------------------------------------------------- readers


def load_dataset(kind: str, root, **opts) -> Dataset:
    """Read a dataset of the given kind (one of ``DATASET_KINDS``)."""
    readers = _readers()
    if kind not in readers:
        raise VseError(f"unknown dataset kind {kind!r} (known: {', '.join(readers)})")
    return readers[kind](root, **opts)


def _readers() -> dict:
    return {"flickr8k": load_flickr8k, "karpathy": load_karpathy, "csv": load_csv,
            "vsepp-precomp": load_vsepp_precomp}


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


# ---------------------------------------------------------------------------- csv


CSV_SPLITS = ("train", "dev", "test")
# A split column's values: train/dev/test, and "val" for dev as in Karpathy's files.
CSV_SPLIT_VALUES = {**{s: s for s in CSV_SPLITS},
                    **{k: v for k, v in KARPATHY_SPLITS.items() if v in CSV_SPLITS}}
CSV_SPLIT_KEY = "split"            # the split column read when the file has one
CSV_SPLIT_RATIO = (0.8, 0.1, 0.1)  # train/dev/test shares of a seeded split, by image
CSV_SPLIT_SEED = 0


@dataclass(frozen=True)
class CsvLayout:
    """How a ``csv`` dataset file is read: open_clip's CSV convention (an image path column,
    a caption column, a separator), with a split column or else a seeded split by image.

    Field names are the command-line options' (``--csv-img-key`` → ``csv_img_key``) and those
    of the feature-cache attributes `vse extract` records them in.  ``None`` is the default
    behaviour; a value given is a demand: a named split or id column must exist, and a split
    ratio or seed is refused for a file whose split column is read.
    """

    csv_img_key: str = "filepath"    # image path, relative to the CSV's folder
    csv_caption_key: str = "title"
    csv_separator: str = ","         # one character; "\\t" (backslash t) or "tab" for TSV
    csv_split_key: str | None = None  # None: CSV_SPLIT_KEY when the file has it; "": no column
    csv_id_key: str | None = None    # None: the image path is the image id
    split_ratio: tuple[float, float, float] | None = None  # "0.8,0.1,0.1"; None: CSV_SPLIT_RATIO
    split_seed: int | None = None    # None: CSV_SPLIT_SEED

    def __post_init__(self):
        for name in ("csv_img_key", "csv_caption_key"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise VseError(f"{option_flag(name)} must name a column, got {value!r}")
            object.__setattr__(self, name, value.strip())
        for name in ("csv_split_key", "csv_id_key"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise VseError(f"{option_flag(name)} must name a column, got {value!r}")
            if value is not None:
                value = value.strip()
                object.__setattr__(self, name, value if value or name == "csv_split_key" else None)
        if self.csv_img_key == self.csv_caption_key:
            raise VseError(f"--csv-img-key and --csv-caption-key name the same column {self.csv_img_key!r}")
        separator = self.csv_separator
        separator = {"\\t": "\t", "tab": "\t"}.get(separator, separator) if isinstance(separator, str) else ""
        if len(separator) != 1 or separator in '"\r\n' or separator.isalnum():
            raise VseError("--csv-separator must be one character other than a letter, digit, quote or "
                           f"line break (\\t for TSV), got {self.csv_separator!r}")
        object.__setattr__(self, "csv_separator", separator)
        if self.split_ratio is not None:
            object.__setattr__(self, "split_ratio", parse_split_ratio(self.split_ratio))
        if self.split_seed is not None and (isinstance(self.split_seed, bool)
                                            or not isinstance(self.split_seed, int)):
            raise VseError(f"--split-seed must be an integer, got {self.split_seed!r}")

    @property
    def seeded_split(self) -> tuple[tuple[float, float, float], int]:
        """The ratio and seed of a seeded split (the defaults where none was given)."""
        return (self.split_ratio or CSV_SPLIT_RATIO,
                CSV_SPLIT_SEED if self.split_seed is None else self.split_seed)


CSV_OPTION_NAMES = tuple(f.name for f in fields(CsvLayout))


def option_flag(name: str) -> str:
    """The command-line flag of a reader option: ``csv_img_key`` → ``--csv-img-key``."""
    return "--" + name.replace("_", "-")


def parse_split_ratio(value) -> tuple[float, float, float]:
    """``"0.8,0.1,0.1"`` (or three numbers) → train/dev/test shares: each at least 0, train
    above 0, summing to 1 (within 1e-6; a sum of 1.1 is a typo, not a ratio to rescale)."""
    parts = value.split(",") if isinstance(value, str) else value
    try:
        shares = tuple(float(p) for p in parts)
    except (TypeError, ValueError):
        shares = ()
    problem = None
    if len(shares) != 3:
        problem = "give three numbers train,dev,test"
    elif not all(math.isfinite(s) and s >= 0 for s in shares):
        problem = "shares must be finite and at least 0"
    elif shares[0] == 0:
        problem = "the train share must be above 0"
    elif abs(sum(shares) - 1) > 1e-6:
        problem = f"shares must sum to 1, these sum to {sum(shares):g}"
    if problem:
        raise VseError(f"--split-ratio {value if isinstance(value, str) else list(value)!r}: {problem} "
                       "(e.g. 0.8,0.1,0.1)")
    return shares


def dataset_options(kind: str, **csv_values) -> dict:
    """``load_dataset``'s options for ``kind`` from the csv options' values (``CsvLayout``'s
    fields by name, ``None`` = not given): ``{"layout": CsvLayout(...)}`` for ``csv``; ``{}``
    for the other kinds, which refuse a csv option given in one line.  The command line
    (``cli.dataset_root.csv_options``) and RC training build their reader options here."""
    unknown = sorted(set(csv_values) - set(CSV_OPTION_NAMES))
    if unknown:
        raise TypeError(f"not csv options: {', '.join(unknown)}")
    given = {name: value for name, value in csv_values.items() if value is not None}
    if kind != "csv":
        if given:
            raise VseError(f"{', '.join(map(option_flag, given))}: only for --dataset csv "
                           f"(the {kind} layout has no such option)")
        return {}
    return {"layout": CsvLayout(**given)}


def seeded_split(image_ids, ratio=CSV_SPLIT_RATIO, seed: int = CSV_SPLIT_SEED) -> dict[str, list[str]]:
    """A train/dev/test split by image: images ranked by ``sha256("<seed>:<image id>")``, the
    first round(n·train) of the ranking to train, the next round(n·(train + dev)) − that to dev,
    the rest to test (halves round up).  It depends only on the set of ids and the seed — not on
    the order of the rows — and adding an image moves at most one other across each boundary.
    Each split lists its images in the order of ``image_ids``; empty splits are left out."""
    image_ids = list(image_ids)
    ranked = sorted(image_ids, key=lambda i: hashlib.sha256(f"{seed}:{i}".encode("utf-8")).digest())
    n = len(image_ids)
    bounds = [int(math.floor(c * n + 0.5)) for c in np.cumsum(ratio)[:-1]] + [n]
    split_of = {}
    for rank, image_id in enumerate(ranked):
        split_of[image_id] = next(s for s, bound in zip(CSV_SPLITS, bounds) if rank < bound)
    lists = {s: [i for i in image_ids if split_of[i] == s] for s in CSV_SPLITS}
    return {s: names for s, names in lists.items() if names}


def load_csv(root, *, layout: CsvLayout | None = None,
             captions_per_image: int | None = None) -> Dataset:
    """One (image path, caption) row per line, as open_clip trains from (``CsvLayout`` names
    the columns and the separator; standard CSV quoting; the first row is the header).

    ``root`` is the CSV file; image paths are relative to its folder (the dataset root), or
    absolute inside it.  Image ids are those normalised relative paths, or the ``csv_id_key``
    column's values (one id ↔ one file).  Rows of an image are grouped: its captions in file
    order (keys ``<image id>#<n>``), images in the order of their first usable row.  Splits:
    the split column (train/dev/test, ``val`` = dev; every row of an image in one split),
    otherwise ``seeded_split`` by image, recorded in ``reader_attrs`` with its ratio and seed.
    Unusable rows (field count unlike the header's, empty path or caption, a path that leaves
    the folder, a missing image file, an id naming two files, a repeated (image, caption)
    pair) are skipped and counted; a bad split value is refused naming its line.
    """
    layout = layout or CsvLayout()
    path, rows, header = _open_csv(root, layout)
    folder = path.parent
    columns = _CsvColumns(header, layout, path)
    report = LoadReport()
    captions, paths, split_of = _read_csv_rows(rows, columns, path, report)
    if not captions:
        problem = "no rows under the header" if not report.counts else (
            "no usable rows (" + ", ".join(f"{k}: {n}" for k, n in sorted(report.counts.items()))
            + f"; image paths are read relative to {folder})")
        raise VseError(problem, path)
    if columns.split is None:
        ratio, seed = layout.seeded_split
        split_lists = seeded_split(captions, ratio, seed)
        split_attrs = {"split_ratio": list(ratio), "split_seed": seed}
    else:
        split_lists = {s: [i for i in captions if split_of[i] == s] for s in CSV_SPLITS}
        split_lists = {s: names for s, names in split_lists.items() if names}
        split_attrs = {}
    dataset = _assemble(path.stem, folder, captions, {i: folder / paths[i] for i in captions},
                        split_lists, captions_per_image, report)
    dataset.reader_attrs = {
        "dataset_file": str(path.resolve()), "csv_img_key": layout.csv_img_key,
        "csv_caption_key": layout.csv_caption_key, "csv_separator": layout.csv_separator,
        "csv_split_key": "" if columns.split is None else header[columns.split],
        "csv_id_key": layout.csv_id_key or "", **split_attrs}
    return dataset


@dataclass(frozen=True)
class CsvItem:
    """One usable row of a CSV read as a table of items (`vse embed`): ``where`` is
    ``<file name>:<line>``; ``image`` the path relative to the CSV's folder (existence is not
    checked: a missing file is the embedder's to report), ``image_id`` the id column's value or
    that path; ``caption`` may be empty."""

    where: str
    image: str
    image_id: str
    caption: str


def read_csv_items(path, layout: CsvLayout | None = None, *, captions: bool = True) -> list[CsvItem]:
    """The rows of a CSV in ``layout``'s columns (the caption column only when ``captions``),
    for embedding rather than training: no split, no grouping.  A path that leaves the CSV's
    folder, a row of the wrong width or an empty path is refused in one line naming it."""
    layout = layout or CsvLayout()
    path, rows, header = _open_csv(path, layout)
    folder = path.parent

    def find(name, flag):
        return find_column(header, name, flag, layout.csv_separator, path)

    image = find(layout.csv_img_key, "--csv-img-key")
    caption = find(layout.csv_caption_key, "--csv-caption-key") if captions else None
    id_column = None if layout.csv_id_key is None else find(layout.csv_id_key, "--csv-id-key")
    bases = list(dict.fromkeys([folder, folder.resolve()]))
    items = []
    for line, row in rows:
        if not any(value.strip() for value in row):
            continue
        if len(row) != len(header):
            raise VseError(f"line {line}: {len(row)} fields, the header has {len(header)}", path)
        name = row[image].strip()
        relative = _csv_image_path(name, bases) if name else None
        if relative is None:
            raise VseError(f"line {line}: image path {name!r} " + ("is empty" if not name else
                           f"leaves the CSV's folder {folder}"), path)
        image_id = relative if id_column is None else row[id_column].strip()
        if not image_id:
            raise VseError(f"line {line}: the id column {layout.csv_id_key!r} is empty", path)
        items.append(CsvItem(f"{path.name}:{line}", relative, image_id,
                             row[caption].strip() if caption is not None else ""))
    if not items:
        raise VseError("no rows under the header", path)
    return items


def _open_csv(where, layout: CsvLayout) -> tuple[Path, _CsvRows, list[str]]:
    """The CSV file named by ``where``, its rows from the one after the header on, and the
    header (the first row that is not blank, names stripped); VseError if there is none."""
    path = _csv_file(where)
    rows = _CsvRows(_decode_utf8(path), layout.csv_separator, path)
    header = next((row for _, row in rows if any(value.strip() for value in row)), None)
    if header is None:
        raise VseError("empty file (no header row)", path)
    return path, rows, [name.strip() for name in header]


class _CsvRows:
    """(first line number, fields) of each row of a CSV text; strict quoting: a quote left
    open (which would swallow the rows after it) or text after a closing quote is a VseError
    naming the line where the row starts."""

    def __init__(self, text: str, separator: str, path: Path):
        self.reader = csv.reader(io.StringIO(text, newline=""), delimiter=separator, strict=True)
        self.path = path

    def __iter__(self):
        while True:
            start = self.reader.line_num + 1
            try:
                row = next(self.reader)
            except StopIteration:
                return
            except csv.Error as exc:
                hint = "; a quote opened on this row is never closed" if "end of data" in str(exc) else ""
                raise VseError(f"line {start}: not readable as CSV ({exc}{hint})", self.path) from None
            yield start, row


class _CsvColumns:
    """Positions of a layout's columns in a header; VseError naming a missing one."""

    def __init__(self, header: list[str], layout: CsvLayout, path: Path):
        self.header, self.path, self.separator = header, path, layout.csv_separator
        self.image = self.find(layout.csv_img_key, "--csv-img-key")
        self.caption = self.find(layout.csv_caption_key, "--csv-caption-key")
        self.id = None if layout.csv_id_key is None else self.find(layout.csv_id_key, "--csv-id-key")
        key = layout.csv_split_key
        if key is None:
            self.split = self.find(CSV_SPLIT_KEY, "--csv-split-key") if CSV_SPLIT_KEY in header else None
        else:
            self.split = self.find(key, "--csv-split-key") if key else None
        if self.split is not None and (layout.split_ratio is not None or layout.split_seed is not None):
            raise VseError(f"--split-ratio/--split-seed make a seeded split, but the file's split column "
                           f"{header[self.split]!r} is read (--csv-split-key '' ignores it)", path)

    def find(self, name: str, flag: str) -> int:
        return find_column(self.header, name, flag, self.separator, self.path)


def find_column(header: list[str], name: str, flag: str, separator: str, path: Path) -> int:
    """The position of column ``name`` (option ``flag``) in ``header``; VseError if missing or repeated."""
    found = [i for i, column in enumerate(header) if column == name]
    if len(found) > 1:
        raise VseError(f"column {name!r} ({flag}) appears {len(found)} times in the header", path)
    if not found:
        hint = (f"; a single column: is the separator {separator!r} right (--csv-separator)?"
                if len(header) == 1 else "")
        raise VseError(f"no column {name!r} ({flag}); the header has {', '.join(map(repr, header))}{hint}",
                       path)
    return found[0]


def _read_csv_rows(rows: _CsvRows, columns: _CsvColumns, path: Path, report: LoadReport):
    """Captions by image id (dict order: first usable row), each id's relative path, each
    id's split (``None`` without a split column)."""
    folder = path.parent
    bases = list(dict.fromkeys([folder, folder.resolve()]))
    exists = _FileLookup()
    captions: dict[str, list[str]] = {}
    path_of: dict[str, str] = {}   # image id → relative path
    id_of: dict[str, str] = {}     # relative path → image id
    split_of: dict[str, str] = {}
    first_split_line: dict[str, int] = {}
    seen: set[tuple[str, str]] = set()
    width = len(columns.header)
    for line, row in rows:
        where = f"{path.name}:{line}"
        if not any(value.strip() for value in row):
            continue  # a blank line
        if len(row) != width:
            report.add("row_malformed", f"{where} ({len(row)} fields, the header has {width})")
            continue
        split = None
        if columns.split is not None:
            value = row[columns.split].strip()
            split = CSV_SPLIT_VALUES.get(value.lower())
            if split is None:
                raise VseError(f"line {line}: split {value!r} is not one of train, dev, test (or val)", path)
        name = row[columns.image].strip()
        caption = row[columns.caption].strip()
        if not name:
            report.add("image_path_empty", where)
            continue
        relative = _csv_image_path(name, bases)
        if relative is None:
            report.add("unsafe_path", f"{name} ({where})")
            continue
        if not exists(folder / relative):
            report.add("caption_missing_image", f"{relative} ({where})")
            continue
        image_id = relative if columns.id is None else row[columns.id].strip()
        if not image_id:
            report.add("image_id_empty", where)
            continue
        if path_of.get(image_id, relative) != relative or id_of.get(relative, image_id) != image_id:
            report.add("image_id_conflict", f"{image_id} = {relative} ({where})")
            continue
        path_of[image_id], id_of[relative] = relative, image_id
        if split is not None:
            if split_of.setdefault(image_id, split) != split:
                raise VseError(f"line {line}: image {image_id} is in the {split} split here but in "
                               f"{split_of[image_id]} on line {first_split_line[image_id]} (every row of "
                               "an image must name the same split)", path)
            first_split_line.setdefault(image_id, line)
        if not caption:
            report.add("caption_empty", f"{image_id} ({where})")
        elif (image_id, caption) in seen:
            report.add("caption_duplicate", f"{image_id} ({where})")
        else:
            seen.add((image_id, caption))
            captions.setdefault(image_id, []).append(caption)
    return captions, path_of, split_of


def _csv_file(root) -> Path:
    path = Path(root).absolute()
    if path.is_dir():
        found = sorted(p.name for p in path.iterdir() if p.suffix.lower() in (".csv", ".tsv"))
        raise VseError("a folder: --dataset csv takes the CSV file itself"
                       + (f" (here: {', '.join(found[:5])})" if found else ""), path)
    return _require_file(path)


def _csv_image_path(name: str, folders) -> str | None:
    """``name`` as a normalised path relative to the CSV's folder, or ``None`` when it leaves
    it.  An absolute path is accepted when it lies inside the folder (as written, or with the
    folder's symlinks resolved): the same rule as a relative one, which may not use ``..``."""
    if name.startswith("/"):
        absolute = Path(os.path.normpath(name))
        for folder in folders:
            if absolute.is_relative_to(folder) and absolute != folder:
                name = absolute.relative_to(folder).as_posix()
                break
        else:
            return None
    if not _is_safe_relative(name):
        return None
    name = posixpath.normpath(name)
    return None if name == "." else name


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
    if features.ndim not in (2, 3):
        raise VseError(f"shape {features.shape}: not (rows, D) vectors nor (rows, K, D) sets of regions",
                       path)
    num_images = num_captions // PRECOMP_CAPTIONS_PER_IMAGE
    if features.ndim == 3:
        # SCAN / bottom-up-attention "precomp" folders: (N, 36, 2048) region features under VSE++'s
        # file names, one set per image, read in place (memory-mapped; never loaded or copied whole)
        if 0 in features.shape[1:]:
            raise VseError(f"shape {features.shape}: a set of regions needs K >= 1 members of D >= 1", path)
        if features.dtype not in (np.float32, np.float16) or not features.flags.c_contiguous:
            raise VseError(f"regions must be a C-order float32 or float16 array, not {features.dtype}"
                           f"{'' if features.flags.c_contiguous else ' in Fortran order'}", path)
        if len(features) != num_images:
            raise VseError(f"shape {features.shape} does not match {num_captions} captions (region sets "
                           f"come one per image: expected {num_images} rows)", path)
        return features
    if len(features) not in (num_images, num_captions):
        raise VseError(f"shape {features.shape} does not match {num_captions} captions "
                       f"(expected {num_images} or {num_captions} rows)", path)
    if len(features) == num_captions:
        features = features[::PRECOMP_CAPTIONS_PER_IMAGE]  # one row per caption
    return features
