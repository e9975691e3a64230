"""The COCO reader (captions_{train,val}<year>.json), added as one module plus one registry line,
and the reader registry as the one list of dataset layouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import train, vse
from PIL import Image

from pipeline.core.errors import VseError
from pipeline.core.registry import DATASET_KINDS, IMAGE_DATASET_KINDS, READERS
from pipeline.data.readers import load_dataset


def write_coco(root: Path, year="2017", train=(("a.jpg", 6), ("b.jpg", 5)), val=(("c.jpg", 5),),
               missing=()) -> Path:
    (root / "annotations").mkdir(parents=True)
    ann_id = 0
    for split, images in (("train", train), ("val", val)):
        entries, annotations = [], []
        for k, (name, n) in enumerate(images):
            image_id = 100 * (split == "val") + k
            entries.append({"id": image_id, "file_name": name, "width": 4, "height": 4})
            if name not in missing:
                (root / f"{split}{year}").mkdir(exist_ok=True)
                Image.new("RGB", (4, 4)).save(root / f"{split}{year}" / name)
            for c in range(n):
                annotations.append({"id": ann_id, "image_id": image_id, "caption": f" {name}  says {c}\n"})
                ann_id += 1
        (root / "annotations" / f"captions_{split}{year}.json").write_text(
            json.dumps({"images": entries, "annotations": annotations}), encoding="utf-8")
    return root


def test_coco_reads_splits_captions_in_order_and_keeps_five(tmp_path):
    ds = load_dataset("coco", write_coco(tmp_path))
    assert ds.image_ids == ["train2017/a.jpg", "train2017/b.jpg", "val2017/c.jpg"]
    assert {name: list(rows) for name, rows in ds.splits.items()} == {"train": [0, 1], "dev": [2]}
    assert ds.captions[:5] == [f"a.jpg says {c}" for c in range(5)]  # whitespace normalised
    assert ds.report.counts == {"image_extra_captions_dropped": 1}   # a.jpg had 6
    assert ds.image_paths[2] == tmp_path / "val2017" / "c.jpg"


def test_coco_counts_missing_images_and_orphan_captions(tmp_path):
    root = write_coco(tmp_path, missing=("b.jpg",))
    data = json.loads((root / "annotations" / "captions_train2017.json").read_text())
    data["annotations"].append({"id": 999, "image_id": 77, "caption": "nobody's"})
    (root / "annotations" / "captions_train2017.json").write_text(json.dumps(data))
    ds = load_dataset("coco", root)
    assert ds.image_ids == ["train2017/a.jpg", "val2017/c.jpg"]
    assert ds.report.counts["image_missing"] == 1
    assert ds.report.counts["caption_missing_image"] == 6  # b.jpg's 5 and the orphan


def test_coco_picks_the_year_asked_for_and_refuses_bad_files(tmp_path):
    write_coco(tmp_path / "both", year="2014")
    write_coco(tmp_path / "y17", year="2017")
    for f in (tmp_path / "y17" / "annotations").iterdir():
        f.rename(tmp_path / "both" / "annotations" / f.name)
    (tmp_path / "y17" / "train2017").rename(tmp_path / "both" / "train2017")
    (tmp_path / "y17" / "val2017").rename(tmp_path / "both" / "val2017")
    assert load_dataset("coco", tmp_path / "both").image_ids[0].startswith("train2017/")  # newest
    assert load_dataset("coco", tmp_path / "both", year="2014").image_ids[0].startswith("train2014/")
    with pytest.raises(VseError, match="no captions_train2010.json"):
        load_dataset("coco", tmp_path / "both", year="2010")
    (tmp_path / "both" / "annotations" / "captions_val2017.json").write_text('{"images": 3}')
    with pytest.raises(VseError, match="not a COCO caption file"):
        load_dataset("coco", tmp_path / "both")
    (tmp_path / "empty").mkdir()
    with pytest.raises(VseError, match="no COCO caption file"):
        load_dataset("coco", tmp_path / "empty")


def test_coco_through_the_cli_extract_and_train(tmp_path):
    """A new reader works through every command that takes --dataset, with no other change."""
    root = write_coco(tmp_path / "coco", train=tuple((f"t{i}.jpg", 5) for i in range(6)),
                      val=tuple((f"v{i}.jpg", 5) for i in range(3)))
    out = tmp_path / "coco.h5"
    result = vse("extract", "--dataset", "coco", "--root", root, "--backbone", "tiny", "--out", out,
                 "--quiet", "--splits", "train,dev")
    assert result.exit_code == 0, result.output
    info = vse("info", out)
    assert all(text in info.output for text in ("9 × 32", "captions: 45", "dev: 3 images")), info.output
    run = train(out, tmp_path / "run", "--val-split", "dev", "--batch-size", 4)
    assert run.exit_code == 0, run.output
    assert (tmp_path / "run" / "best.pt").is_file()


def test_the_reader_registry_is_the_one_list_of_layouts():
    assert DATASET_KINDS == ("flickr8k", "karpathy", "coco", "csv", "vsepp-precomp")
    assert IMAGE_DATASET_KINDS == ("flickr8k", "karpathy", "coco", "csv")
    resolved = READERS.resolved()
    assert all(callable(reader) for reader in resolved.values())
    assert READERS.option_names()[:2] == ("csv_img_key", "csv_caption_key")
    with pytest.raises(VseError, match="only for --dataset csv"):
        READERS.reader_options("coco", csv_img_key="x")
    with pytest.raises(VseError, match="unknown dataset kind 'nope'"):
        load_dataset("nope", ".")
