"""COCO's own caption files: ``annotations/captions_{train,val}{2014,2017}.json``.

``{"images": [{"id", "file_name", ...}], "annotations": [{"image_id", "caption", ...}]}``,
images in ``{train,val}{year}/`` beside ``annotations/``. ``root`` is that folder; one year is
read (the newest present, or ``year``). Splits: ``train`` from the train file and ``dev`` from
the val file, as Karpathy's ``val`` becomes ``dev``. COCO's files have no test split: the
papers' 1K/5K test sets come from Karpathy's split (``--dataset karpathy`` with
``dataset_coco.json``). Captions of an image keep the order of the annotations; images with
more than ``captions_per_image`` keep their first ones (COCO has 5 to 7).
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.core.errors import VseError
from pipeline.data.readers.toolkit import (
    FOLDER_LAYOUT_HINT,
    Dataset,
    FileLookup,
    LoadReport,
    assemble,
    existing_dir,
    is_safe_relative,
    read_json,
)

COCO_SPLITS = {"train": "train", "val": "dev"}  # COCO's name → vse's
_CAPTION_FILE = re.compile(r"captions_(train|val)(\d{4})\.json")


def load_coco(root, *, year: str | None = None, captions_per_image: int | None = 5,
              check_images: bool = True) -> Dataset:
    """Read COCO's caption annotations of one year from ``root`` (its ``annotations/`` folder,
    or ``root`` itself, holds ``captions_{train,val}<year>.json``)."""
    root = existing_dir(root, FOLDER_LAYOUT_HINT)
    files = _caption_files(root, year)
    report = LoadReport()
    exists = FileLookup() if check_images else None
    captions: dict[str, list[str]] = {}
    paths: dict[str, Path] = {}
    split_lists: dict[str, list[str]] = {}
    for split, path in files.items():
        images, annotations = _read_annotations(path)
        folder = root / f"{split}{path.stem[-4:]}"
        by_id: dict[int, str] = {}
        for i, entry in enumerate(images):
            name = entry.get("file_name") if isinstance(entry, dict) else None
            if not isinstance(name, str) or not isinstance(entry.get("id"), int):
                raise VseError(f"images[{i}]: needs an integer 'id' and a 'file_name' string", path)
            image_id = f"{folder.name}/{name}"
            if not is_safe_relative(name):
                report.add("unsafe_path", f"{name} (images[{i}])")
            elif image_id in paths or entry["id"] in by_id:
                report.add("image_duplicate_id", image_id)
            elif exists is not None and not exists(folder / name):
                report.add("image_missing", image_id)
            else:
                by_id[entry["id"]] = image_id
                paths[image_id] = folder / name
        for a, entry in enumerate(annotations):
            owner = by_id.get(entry.get("image_id")) if isinstance(entry, dict) else None
            text = entry.get("caption") if isinstance(entry, dict) else None
            where = f"{path.name}: annotations[{a}]"
            if not isinstance(text, str):
                report.add("caption_malformed_line", where)
            elif owner is None:
                report.add("caption_missing_image", where)
            elif not text.strip():
                report.add("caption_empty", where)
            else:
                captions.setdefault(owner, []).append(" ".join(text.split()))
        listed = [image_id for image_id in by_id.values()]
        for image_id in listed:
            if image_id not in captions:
                report.add("image_without_captions", image_id)
        split_lists[COCO_SPLITS[split]] = [i for i in listed if i in captions]
    if not captions:
        raise VseError("no image with a caption and an image file (images go in train<year>/ and "
                       "val<year>/ beside annotations/)", root)
    return assemble("coco", root, captions, paths, split_lists, captions_per_image, report)


def _caption_files(root: Path, year: str | None) -> dict[str, Path]:
    """``{"train": path, "val": path}`` of one year (the val file may be absent)."""
    folder = root / "annotations" if (root / "annotations").is_dir() else root
    found: dict[str, dict[str, Path]] = {}
    for path in folder.glob("captions_*.json"):
        match = _CAPTION_FILE.fullmatch(path.name)
        if match:
            found.setdefault(match.group(2), {})[match.group(1)] = path
    if year is not None and str(year) not in found:
        raise VseError(f"no captions_train{year}.json or captions_val{year}.json", folder)
    if not found:
        raise VseError("no COCO caption file (annotations/captions_{train,val}<year>.json)", folder)
    chosen = found[str(year) if year is not None else max(found)]
    return {split: chosen[split] for split in COCO_SPLITS if split in chosen}


def _read_annotations(path: Path) -> tuple[list, list]:
    data = read_json(path)
    images = data.get("images") if isinstance(data, dict) else None
    annotations = data.get("annotations") if isinstance(data, dict) else None
    if not isinstance(images, list) or not isinstance(annotations, list):
        raise VseError("not a COCO caption file (needs 'images' and 'annotations' lists)", path)
    return images, annotations
