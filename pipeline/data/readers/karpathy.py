"""Karpathy's split JSON (``dataset_{coco,flickr30k,flickr8k}.json``): the split every COCO and
Flickr30k result in the VSE papers uses."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import VseError
from pipeline.data.readers.toolkit import (
    Dataset,
    FileLookup,
    LoadReport,
    assemble,
    existing_dir,
    guess_image_root,
    is_safe_relative,
    read_json,
    require_file,
)

KARPATHY_SPLITS = {"train": "train", "val": "dev", "test": "test", "restval": "restval"}


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
    data = read_json(json_path)
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
        if not is_safe_relative(image_id):
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
    image_root = (existing_dir(image_root) if image_root is not None
                  else guess_image_root(json_path.parent, [p[0] for p in parsed]))
    exists = FileLookup() if check_images else None
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
    return assemble(name, json_path.parent, captions,
                    {i: image_root / i for i in captions}, split_lists,
                    captions_per_image, report)


def _find_karpathy_json(root: Path, file: str | None) -> Path:
    if root.is_file():
        return root.absolute()
    folder = existing_dir(root)
    if file is not None:
        return require_file(folder / file)
    found = sorted(folder.glob("dataset_*.json"))
    if len(found) != 1:
        problem = "no dataset_*.json" if not found else (
            f"several dataset_*.json ({', '.join(p.name for p in found)}): give the file itself "
            f"as the root, e.g. {found[0]}")
        raise VseError(problem, folder)
    return found[0]
