"""VSE++ precomputed features (``{split}_ims.npy`` + ``{split}_caps.txt``), and SCAN / VSE∞
region sets under the same names: no image files, features read in place."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from pipeline.core.errors import VseError
from pipeline.data.readers.toolkit import (
    FOLDER_LAYOUT_HINT,
    ConcatenatedRows,
    Dataset,
    LoadReport,
    existing_dir,
    numbered_lines,
    require_file,
)

PRECOMP_SPLITS = ("train", "dev", "test", "testall")
PRECOMP_CAPTIONS_PER_IMAGE = 5


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
    root = existing_dir(root, FOLDER_LAYOUT_HINT)
    names = [s for s in PRECOMP_SPLITS if (root / f"{s}_caps.txt").is_file()]
    if splits is not None:
        names = list(splits)
        for split in names:
            if not re.fullmatch(r"[\w-]+", split):
                raise VseError(f"bad split name {split!r} (letters, digits, _ and - only)")
            require_file(root / f"{split}_caps.txt")
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


def _read_precomp_captions(path: Path, report: LoadReport) -> list[str]:
    captions = []
    for lineno, line in numbered_lines(path):
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
        features = np.load(require_file(path), mmap_mode="r", allow_pickle=False)
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
