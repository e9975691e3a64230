"""A corpus of bad inputs, generated in tmp_path and driven through the `vse` command line:
each gives exit status 1 and one line ``error: <file>: <problem>``, or a documented,
counted skip — never a traceback from inside a library.

Reader-level behaviour is tested in test_datasets.py (open_image modes and errors, UTF-8,
duplicate keys, split entries naming unknown images …), test_cache.py (broken caches) and
test_train.py (checkpoint unpickling); here the same inputs go through the whole CLI.
"""

from __future__ import annotations

import shutil
import struct
import zlib
from pathlib import Path

import numpy as np

DEMO = Path(__file__).resolve().parents[1] / "data"


def demo_rows(num_images: int) -> dict[str, list[str]]:
    """The first ``num_images`` demo images (by name) → their token-file rows, verbatim."""
    rows: dict[str, list[str]] = {}
    for line in (DEMO / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines():
        rows.setdefault(line.split("#", 1)[0], []).append(line)
    return {name: rows[name] for name in sorted(rows)[:num_images]}


def flickr8k_layout(root: Path, num_images: int, token_lines=None) -> Path:
    """A Flickr8k-layout folder of real demo images (copied) and their captions; splits are
    the first 2/3 of the images (train), then dev and test halves of the rest."""
    rows = demo_rows(num_images)
    names = list(rows)
    (root / "images").mkdir(parents=True)
    for name in names:
        shutil.copy(DEMO / "images" / name, root / "images" / name)
    lines = token_lines if token_lines is not None else [r for name in names for r in rows[name]]
    (root / "Flickr8k.token.txt").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    train = num_images * 2 // 3
    dev = train + (num_images - train) // 2
    for split, part in (("train", names[:train]), ("dev", names[train:dev]), ("test", names[dev:])):
        (root / f"Flickr_8k.{split}Images.txt").write_text("".join(f"{n}\n" for n in part))
    return root
