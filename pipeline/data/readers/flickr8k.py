"""The official Flickr8k layout: ``Flickr8k.token.txt`` (``<image>#<n>\t<caption>``), the three
``Flickr_8k.{train,dev,test}Images.txt`` split files and an image folder."""

from __future__ import annotations

from pipeline.core.errors import VseError
from pipeline.data.readers.toolkit import (
    FOLDER_LAYOUT_HINT,
    Dataset,
    LoadReport,
    assemble,
    existing_dir,
    find_image_dir,
    is_safe_relative,
    list_files,
    numbered_lines,
    read_split_file,
)

FLICKR8K_TOKEN_FILE = "Flickr8k.token.txt"
FLICKR8K_SPLIT_FILES = {
    "train": "Flickr_8k.trainImages.txt",
    "dev": "Flickr_8k.devImages.txt",
    "test": "Flickr_8k.testImages.txt",
}


def load_flickr8k(root, *, image_dir=None, captions_per_image: int | None = 5) -> Dataset:
    """Official Flickr8k layout: ``Flickr8k.token.txt`` (``<image>#<n>\\t<caption>``),
    ``Flickr_8k.{train,dev,test}Images.txt`` and an image folder (``images/``,
    ``Flicker8k_Dataset/`` or ``Images/``, detected; or ``image_dir``).

    The official token file has 5 rows keyed ``2258277193_586949ec62.jpg.1`` whose image
    does not exist; they are skipped as ``caption_missing_image``.
    """
    root = existing_dir(root, FOLDER_LAYOUT_HINT)
    images_dir = find_image_dir(root, image_dir)
    available = list_files(images_dir)
    report = LoadReport()
    token_path = root / FLICKR8K_TOKEN_FILE
    captions: dict[str, list[str]] = {}
    seen_keys: set[str] = set()
    for lineno, line in numbered_lines(token_path):
        if not line.strip():
            continue
        where = f"{token_path.name}:{lineno}"
        key, tab, caption = line.partition("\t")
        key = key.strip()
        name, hash_sign, _ = key.rpartition("#")
        if not tab or not hash_sign or not name:
            report.add("caption_malformed_line", where)
        elif not is_safe_relative(name):
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
    split_lists = {split: read_split_file(root / filename, report)
                   for split, filename in FLICKR8K_SPLIT_FILES.items()}
    return assemble("flickr8k", root, captions, {n: images_dir / n for n in captions},
                    split_lists, captions_per_image, report)
