"""The toolkit of a dataset reader: what a new layout's module imports to read files the way every
reader does (the input policy of ``base``): one-line errors naming the file and line, UTF-8 text,
paths that cannot leave the dataset's folder, counted skips, and ``assemble``, which applies the
captions-per-image policy and builds the ``Dataset``.

    existing_dir, require_file          a folder / file that must exist (``VseError`` naming it)
    decode_utf8, numbered_lines,        a UTF-8 text file: whole, as numbered lines, as JSON, as a
    read_json, read_split_file          split file (one image name a line; unsafe names counted)
    is_safe_relative,                   a name that cannot leave its folder; a name (relative, or
    relative_path_inside                absolute inside the folder) as a normalised relative path
    list_files, FileLookup              a folder's files, listed once per folder
    find_image_dir, guess_image_root    where a layout's images are (``IMAGE_DIR_NAMES``)
    assemble                            captions, image paths and split lists → ``Dataset``

A new reader is ``load_x(root, *, captions_per_image=5, ...) -> Dataset`` in its own module and a
``READERS`` line (``pipeline.core.registry``); ``Dataset`` and ``LoadReport`` import from here too.
"""

from __future__ import annotations

import json
import os
import posixpath
from pathlib import Path

import numpy as np

from pipeline.core.errors import VseError
from pipeline.data.readers.base import (
    IMAGE_DIR_NAMES,
    ConcatenatedRows,
    Dataset,
    LoadReport,
    image_folders,
)

__all__ = ["ConcatenatedRows", "Dataset", "FOLDER_LAYOUT_HINT", "FileLookup", "IMAGE_DIR_NAMES", "LoadReport",
           "assemble", "decode_utf8", "existing_dir", "find_image_dir", "guess_image_root", "image_folders",
           "is_safe_relative", "list_files", "numbered_lines", "read_json", "read_split_file",
           "relative_path_inside", "require_file"]


# Said when a folder layout (flickr8k, vsepp-precomp) is given a file as its root.
FOLDER_LAYOUT_HINT = "; only the karpathy layout takes a file (its dataset_*.json)"


def existing_dir(path, hint: str = "") -> Path:
    """``path`` made absolute; a VseError unless it is a folder (``hint`` is added when it is a file)."""
    path = Path(path).absolute()
    if not path.is_dir():
        raise VseError("dataset folder not found" if not path.exists() else "not a folder" + hint,
                       path)
    return path


def require_file(path: Path) -> Path:
    """``path``; a VseError naming it unless it is a file."""
    if not path.is_file():
        raise VseError("file not found", path)
    return path


def decode_utf8(path: Path) -> str:
    """The file's text; invalid UTF-8 is a VseError naming the line."""
    try:
        raw = require_file(path).read_bytes()
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


def read_json(path: Path):
    """A UTF-8 JSON file's value; invalid JSON is a VseError naming the file and the line."""
    try:
        return json.loads(decode_utf8(path))
    except json.JSONDecodeError as exc:
        raise VseError(f"line {exc.lineno}: invalid JSON ({exc.msg})", path) from None


def numbered_lines(path: Path):
    """(line number, line) pairs, 1-based, without line terminators (LF or CRLF)."""
    lines = decode_utf8(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return ((i, line.rstrip("\r")) for i, line in enumerate(lines, 1))


def is_safe_relative(name: str) -> bool:
    """True when ``name`` is a relative path that cannot leave the folder it is joined to."""
    return (bool(name) and not name.startswith("/") and "\x00" not in name
            and "\\" not in name and ".." not in name.split("/"))


def relative_path_inside(name: str, folders) -> str | None:
    """``name`` as a normalised path relative to a folder (``folders``: that folder as written and,
    when it differs, with its symlinks resolved), or ``None`` when it leaves it. An absolute path
    is accepted when it lies inside the folder: the same rule as a relative one, which may not use
    ``..`` (``is_safe_relative``). The csv reader's and `vse embed`'s image lists' rule."""
    if name.startswith("/"):
        absolute = Path(os.path.normpath(name))
        for folder in folders:
            if absolute.is_relative_to(folder) and absolute != folder:
                name = absolute.relative_to(folder).as_posix()
                break
        else:
            return None
    if not is_safe_relative(name):
        return None
    name = posixpath.normpath(name)
    return None if name == "." else name


def list_files(folder: Path) -> set[str]:
    """The names of the files in ``folder`` (hidden ones left out)."""
    with os.scandir(folder) as entries:
        return {e.name for e in entries if e.is_file() and not e.name.startswith(".")}


class FileLookup:
    """``lookup(path)`` → whether the file exists, listing each folder once."""

    def __init__(self):
        self.folders: dict[Path, set[str]] = {}

    def __call__(self, path: Path) -> bool:
        folder = path.parent
        if folder not in self.folders:
            self.folders[folder] = list_files(folder) if folder.is_dir() else set()
        return path.name in self.folders[folder]


def find_image_dir(root: Path, image_dir) -> Path:
    """``image_dir`` (relative to ``root`` unless absolute), or the first of ``IMAGE_DIR_NAMES`` under
    ``root``; a VseError when there is none."""
    if image_dir is not None:
        folder = Path(image_dir) if Path(image_dir).is_absolute() else root / image_dir
        return existing_dir(folder)
    for name in IMAGE_DIR_NAMES:
        if (root / name).is_dir():
            return root / name
    raise VseError(f"no image folder ({', '.join(n + '/' for n in IMAGE_DIR_NAMES)})", root)


def guess_image_root(folder: Path, image_ids: list[str]) -> Path:
    """The JSON's folder or its first image subfolder that holds the first listed image."""
    for candidate in image_folders(folder):
        if image_ids and (candidate / image_ids[0]).is_file():
            return candidate
    return folder


def read_split_file(path: Path, report: LoadReport) -> list[str]:
    """The image names of a split file, one a line (blank lines skipped, unsafe names counted)."""
    names = []
    for lineno, line in numbered_lines(path):
        name = line.strip()
        if not name:
            continue
        if is_safe_relative(name):
            names.append(name)
        else:
            report.add("unsafe_path", f"{name} ({path.name}:{lineno})")
    return names


def assemble(name: str, root: Path, captions: dict[str, list[str]],
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
