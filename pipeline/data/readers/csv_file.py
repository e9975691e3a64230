"""The ``csv`` reader: one (image path, caption) row per line, as open_clip trains from; its
options are ``csv_layout.CsvLayout``. Splits from a split column, or seeded by image."""

from __future__ import annotations

import csv
import hashlib
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import VseError
from pipeline.data.readers.csv_layout import (
    CSV_SPLIT_KEY,
    CSV_SPLIT_RATIO,
    CSV_SPLIT_SEED,
    CSV_SPLIT_VALUES,
    CSV_SPLITS,
    CsvLayout,
)
from pipeline.data.readers.toolkit import (
    Dataset,
    FileLookup,
    LoadReport,
    assemble,
    decode_utf8,
    relative_path_inside,
    require_file,
)


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
    dataset = assemble(path.stem, folder, captions, {i: folder / paths[i] for i in captions},
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
        relative = relative_path_inside(name, bases) if name else None
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
    rows = _CsvRows(decode_utf8(path), layout.csv_separator, path)
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
    exists = FileLookup()
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
        relative = relative_path_inside(name, bases)
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
    return require_file(path)
