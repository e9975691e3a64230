"""A small Flickr8k-layout dataset of real demo images, for RC-mode tests."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import DEMO_DATA

SPLIT_FILES = {"train": "Flickr_8k.trainImages.txt", "dev": "Flickr_8k.devImages.txt",
               "test": "Flickr_8k.testImages.txt"}


def make_flickr8k(root: Path, sizes=(("train", 8), ("dev", 2), ("test", 2))) -> Path:
    """The first demo images (sorted names) with their 5 captions, split in that order."""
    rows: dict[str, list[str]] = {}
    for line in (DEMO_DATA / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines():
        rows.setdefault(line.split("#")[0], []).append(line)
    names = sorted(rows)[:sum(n for _, n in sizes)]
    (root / "images").mkdir(parents=True)
    for name in names:
        shutil.copyfile(DEMO_DATA / "images" / name, root / "images" / name)
    (root / "Flickr8k.token.txt").write_text("".join(f"{r}\n" for n in names for r in rows[n]),
                                             encoding="utf-8")
    start = 0
    for split, n in sizes:
        (root / SPLIT_FILES[split]).write_text("".join(f"{x}\n" for x in names[start:start + n]))
        start += n
    return root
