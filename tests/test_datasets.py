"""Dataset readers, their bad-input handling, open_image, and the bundled demo data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import vse
from PIL import Image

from pipeline.core.errors import VseError
from pipeline.data.readers import ConcatenatedRows, Dataset, LoadReport, load_dataset, open_image

REPO = Path(__file__).resolve().parents[1]
SHARED_FLICKR8K = REPO.parent / "shared" / "data" / "flickr8k"


# ---------------------------------------------------------------- fixture builders


def tiny_jpeg(path: Path, colour=(200, 30, 30)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), colour).save(path, "JPEG")
    return path


def caption_rows(name: str, n: int = 5) -> list[str]:
    return [f"{name}#{i}\t{name} caption {i} ." for i in range(n)]


def write_flickr8k(root: Path, names, *, token_rows=None, splits=None,
                   image_dir="images") -> Path:
    """A Flickr8k-layout folder; default: all images captioned 5×, split 2/1/1."""
    for name in names:
        tiny_jpeg(root / image_dir / name)
    rows = token_rows if token_rows is not None else [
        row for name in names for row in caption_rows(name)]
    (root / "Flickr8k.token.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    splits = splits or {"train": names[:2], "dev": names[2:3], "test": names[3:4]}
    for split, listed in splits.items():
        (root / f"Flickr_8k.{split}Images.txt").write_text(
            "".join(f"{n}\n" for n in listed), encoding="utf-8")
    return root


NAMES = ["a.jpg", "b.jpg", "c.jpg", "d.jpg"]


# ---------------------------------------------------------------- flickr8k


@pytest.mark.parametrize("image_dir", ["images", "Flicker8k_Dataset", "Images"])
def test_flickr8k_layout_order_and_splits(tmp_path, image_dir):
    root = write_flickr8k(tmp_path, NAMES, image_dir=image_dir,
                          splits={"train": ["c.jpg", "a.jpg"], "dev": ["b.jpg"],
                                  "test": ["d.jpg"]})
    ds = load_dataset("flickr8k", root)
    assert ds.image_ids == NAMES
    assert ds.image_paths == [tmp_path / image_dir / n for n in NAMES]
    assert ds.captions[5:10] == [f"b.jpg caption {i} ." for i in range(5)]
    np.testing.assert_array_equal(ds.caption_image, np.repeat(np.arange(4), 5))
    assert ds.captions_per_image == 5
    np.testing.assert_array_equal(ds.splits["train"], [2, 0])  # split-file order
    np.testing.assert_array_equal(ds.splits["dev"], [1])
    np.testing.assert_array_equal(ds.splits["test"], [3])
    assert ds.report.counts == {}


def test_flickr8k_quirk_rows_of_missing_image_are_reported_not_assigned(tmp_path):
    rows = caption_rows("a.jpg")
    # The official file's quirk: 5 rows keyed by "<existing name>.1" (no such image).
    rows += [f"a.jpg.1#{i}\tquirk caption {i}" for i in range(5)]
    rows += [r for n in NAMES[1:] for r in caption_rows(n)]
    ds = load_dataset("flickr8k", write_flickr8k(tmp_path, NAMES, token_rows=rows))
    assert ds.report.counts == {"caption_missing_image": 5}
    assert "a.jpg.1#0 (Flickr8k.token.txt:6)" in ds.report.examples["caption_missing_image"]
    assert not any("quirk" in c for c in ds.captions)
    assert ds.num_captions == 20 and ds.captions_per_image == 5


def test_flickr8k_split_file_naming_unknown_image_is_skipped(tmp_path):
    root = write_flickr8k(tmp_path, NAMES, splits={"train": ["a.jpg", "zzz.jpg", "b.jpg"],
                                                   "dev": ["c.jpg"], "test": ["d.jpg"]})
    ds = load_dataset("flickr8k", root)
    np.testing.assert_array_equal(ds.splits["train"], [0, 1])
    assert ds.report.counts == {"split_unknown_image": 1}


def test_flickr8k_refuses_paths_escaping_the_root(tmp_path):
    root = tmp_path / "ds"
    secret = tiny_jpeg(tmp_path / "secret.jpg")  # exists, but outside the dataset root
    rows = [r for n in NAMES for r in caption_rows(n)]
    rows += ["../../etc/passwd#0\troot:x:0:0", "../secret.jpg#0\tsecret", "/etc/passwd#1\tx"]
    write_flickr8k(root, NAMES, token_rows=rows,
                   splits={"train": ["a.jpg", "../../etc/passwd"], "dev": ["c.jpg"],
                           "test": ["../secret.jpg"]})
    ds = load_dataset("flickr8k", root)
    assert ds.report.counts == {"unsafe_path": 5}
    assert all(p.parent == root / "images" for p in ds.image_paths)
    assert secret not in ds.image_paths and len(ds.captions) == 20
    assert len(ds.splits["test"]) == 0


def test_flickr8k_duplicates(tmp_path):
    rows = [r for n in NAMES for r in caption_rows(n)] + ["a.jpg#2\tsecond copy of key #2"]
    root = write_flickr8k(tmp_path, NAMES, token_rows=rows,
                          splits={"train": ["a.jpg", "b.jpg", "a.jpg"], "dev": ["c.jpg"],
                                  "test": ["d.jpg"]})
    ds = load_dataset("flickr8k", root)
    assert ds.report.counts == {"caption_duplicate_key": 1, "split_duplicate_image": 1}
    assert "second copy of key #2" not in ds.captions
    np.testing.assert_array_equal(ds.splits["train"], [0, 1])


def test_flickr8k_image_in_two_splits_is_an_error(tmp_path):
    root = write_flickr8k(tmp_path, NAMES, splits={"train": ["a.jpg"], "dev": ["b.jpg"],
                                                   "test": ["a.jpg"]})
    with pytest.raises(VseError, match="a.jpg is in both the train and the test split"):
        load_dataset("flickr8k", root)


def test_flickr8k_invalid_utf8_names_file_and_line(tmp_path):
    root = write_flickr8k(tmp_path, NAMES)
    token = root / "Flickr8k.token.txt"
    lines = token.read_bytes().split(b"\n")
    lines[6] = b"b.jpg#1\tcaf\xe9 latin-1"
    token.write_bytes(b"\n".join(lines))
    with pytest.raises(VseError) as err:
        load_dataset("flickr8k", root)
    assert str(err.value).startswith(f"{token}: line 7: not valid UTF-8 (byte 0xe9)")


def test_flickr8k_accepts_bom_crlf_and_unicode(tmp_path):
    root = write_flickr8k(tmp_path, NAMES)
    token = root / "Flickr8k.token.txt"
    text = token.read_text(encoding="utf-8").replace("a.jpg caption 0 .", "un café ☕")
    token.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8"))
    ds = load_dataset("flickr8k", root)
    assert ds.captions[0] == "un café ☕"
    assert ds.image_ids[0] == "a.jpg" and ds.report.counts == {}


def test_flickr8k_caption_count_policy(tmp_path):
    rows = caption_rows("a.jpg", 7) + caption_rows("b.jpg", 5)
    rows += caption_rows("c.jpg", 4) + ["c.jpg#4\t   "]  # 4 real + 1 empty
    rows += ["d.jpg has no tab"] + caption_rows("d.jpg", 5)
    root = write_flickr8k(tmp_path, NAMES, token_rows=rows)

    five = load_dataset("flickr8k", root)
    assert five.image_ids == ["a.jpg", "b.jpg", "d.jpg"]
    assert five.captions[:5] == [f"a.jpg caption {i} ." for i in range(5)]
    assert five.captions_per_image == 5
    assert five.report.counts == {"caption_empty": 1, "caption_malformed_line": 1,
                                  "image_extra_captions_dropped": 1,
                                  "image_too_few_captions": 1}
    assert len(five.splits["dev"]) == 0  # c.jpg was dropped from the 5-caption protocol

    every = load_dataset("flickr8k", root, captions_per_image=None)
    assert every.image_ids == NAMES and every.num_captions == 7 + 5 + 4 + 5
    np.testing.assert_array_equal(every.caption_image, np.repeat(np.arange(4), [7, 5, 4, 5]))
    assert every.captions_per_image is None
    assert every.report.counts == {"caption_empty": 1, "caption_malformed_line": 1}


def test_flickr8k_counts_images_without_captions(tmp_path):
    root = write_flickr8k(tmp_path, NAMES)
    tiny_jpeg(root / "images" / "uncaptioned.jpg")
    ds = load_dataset("flickr8k", root)
    assert ds.report.examples == {"image_without_captions": ["uncaptioned.jpg"]}
    assert "uncaptioned.jpg" not in ds.image_ids


@pytest.mark.parametrize("missing", ["Flickr8k.token.txt", "Flickr_8k.devImages.txt"])
def test_flickr8k_missing_file_is_named(tmp_path, missing):
    root = write_flickr8k(tmp_path, NAMES)
    (root / missing).unlink()
    with pytest.raises(VseError, match=f"{missing}: file not found"):
        load_dataset("flickr8k", root)


def test_flickr8k_missing_folders_and_unusable_token_file(tmp_path):
    with pytest.raises(VseError, match="dataset folder not found"):
        load_dataset("flickr8k", tmp_path / "nowhere")
    root = write_flickr8k(tmp_path / "noimages", NAMES)
    (root / "images").rename(root / "pictures")
    with pytest.raises(VseError, match=r"no image folder \(images/"):
        load_dataset("flickr8k", root)
    assert load_dataset("flickr8k", root, image_dir="pictures").num_images == 4
    csv = write_flickr8k(tmp_path / "csv", NAMES, token_rows=["image,caption", "a.jpg,x"])
    with pytest.raises(VseError, match="Flickr8k.token.txt: no usable caption rows"):
        load_dataset("flickr8k", csv)


def test_unknown_kind():
    with pytest.raises(VseError, match="unknown dataset kind 'mscoco'"):
        load_dataset("mscoco", ".")


# ---------------------------------------------------------------- karpathy


def karpathy_entry(filepath, filename, split, n=5):
    entry = {"filename": filename, "split": split,
             "sentences": [{"raw": f"{filename} says {i}", "tokens": []} for i in range(n)]}
    if filepath is not None:
        entry["filepath"] = filepath
    return entry


def write_karpathy(root: Path, entries, name="dataset_coco.json", images=True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if images:
        for e in entries:
            if ".." not in (e.get("filepath") or "") + e["filename"]:
                tiny_jpeg(root / (e.get("filepath") or "") / e["filename"])
    path = root / name
    path.write_text(json.dumps({"images": entries, "dataset": "coco"}), encoding="utf-8")
    return path


COCO_ENTRIES = [
    karpathy_entry("train2014", "t0.jpg", "train"),
    karpathy_entry("val2014", "v0.jpg", "val"),
    karpathy_entry("val2014", "r0.jpg", "restval"),
    karpathy_entry("val2014", "s0.jpg", "test"),
    karpathy_entry("train2014", "t1.jpg", "train"),
    karpathy_entry("val2014", "r1.jpg", "restval"),
]


def test_karpathy_coco_splits_and_restval(tmp_path):
    path = write_karpathy(tmp_path, COCO_ENTRIES)
    ds = load_dataset("karpathy", tmp_path)  # the folder holding one dataset_*.json
    assert ds.name == "coco"
    assert ds.image_ids[:2] == ["train2014/t0.jpg", "val2014/v0.jpg"]
    assert ds.image_paths[1] == tmp_path / "val2014" / "v0.jpg"
    assert ds.captions[5] == "v0.jpg says 0" and ds.captions_per_image == 5
    assert {k: v.tolist() for k, v in ds.splits.items()} == {
        "train": [0, 4], "dev": [1], "test": [3], "restval": [2, 5]}
    merged = load_dataset("karpathy", path, restval=True)  # the JSON file itself
    assert {k: v.tolist() for k, v in merged.splits.items()} == {
        "train": [0, 2, 4, 5], "dev": [1], "test": [3]}
    assert merged.report.counts == {}


def test_karpathy_image_root_and_missing_images(tmp_path):
    images = tmp_path / "coco"
    path = write_karpathy(tmp_path / "json", COCO_ENTRIES, images=False)
    for e in COCO_ENTRIES[:4]:
        tiny_jpeg(images / e["filepath"] / e["filename"])
    with pytest.raises(VseError, match="none of the 6 listed images exist under"):
        load_dataset("karpathy", path)
    ds = load_dataset("karpathy", path, image_root=images)
    assert ds.num_images == 4
    assert ds.report.counts == {"image_missing": 2}
    assert ds.image_paths[0] == images / "train2014" / "t0.jpg"
    unchecked = load_dataset("karpathy", path, check_images=False)
    assert unchecked.num_images == 6 and unchecked.report.counts == {}


def test_karpathy_flickr_without_filepath_finds_image_subfolder(tmp_path):
    entries = [karpathy_entry(None, f"{i}.jpg", s) for i, s in enumerate(["train", "val"])]
    path = write_karpathy(tmp_path, entries, name="dataset_flickr8k.json", images=False)
    for e in entries:
        tiny_jpeg(tmp_path / "Flicker8k_Dataset" / e["filename"])
    ds = load_dataset("karpathy", path)
    assert ds.name == "flickr8k" and ds.image_ids == ["0.jpg", "1.jpg"]
    assert ds.image_paths[1] == tmp_path / "Flicker8k_Dataset" / "1.jpg"


def test_karpathy_bad_entries_are_counted(tmp_path):
    entries = list(COCO_ENTRIES[:4])
    entries.append(karpathy_entry("../../etc", "passwd", "train"))
    entries.append(karpathy_entry("val2014", "v0.jpg", "test"))  # duplicate id
    six = karpathy_entry("train2014", "six.jpg", "train", n=6)
    six["sentences"][1]["raw"] = " "
    six["sentences"][2] = {"tokens": ["no", "raw"]}
    entries.append(six)  # 6 sentences - 2 unusable = 4: dropped from the 5-caption protocol
    entries.append(karpathy_entry("train2014", "seven.jpg", "train", n=7))
    path = write_karpathy(tmp_path, entries)
    ds = load_dataset("karpathy", path)
    assert ds.report.counts == {"unsafe_path": 1, "image_duplicate_id": 1,
                                "caption_empty": 1, "caption_malformed_line": 1,
                                "image_too_few_captions": 1,
                                "image_extra_captions_dropped": 1}
    assert ds.image_ids == [e["filepath"] + "/" + e["filename"] for e in COCO_ENTRIES[:4]] + [
        "train2014/seven.jpg"]
    assert ds.captions_per_image == 5 and ds.splits["test"].tolist() == [3]
    assert not any(p.is_relative_to("/etc") for p in ds.image_paths)


@pytest.mark.parametrize("content, message", [
    (b'{"images": [', "line 1: invalid JSON"),
    (b'{"imgs": []}', "not a Karpathy split file"),
    (b'{"images": [{"filename": "x.jpg"}]}', r"images\[0\]: needs 'filename' and 'split'"),
    (b'{"images": [{"filename": "x.jpg", "split": "holdout"}]}', "unknown split 'holdout'"),
    (b'{"images": []}\n\n\xff', "line 3: not valid UTF-8"),
])
def test_karpathy_broken_json(tmp_path, content, message):
    path = tmp_path / "dataset_coco.json"
    path.write_bytes(content)
    with pytest.raises(VseError, match=message) as err:
        load_dataset("karpathy", path)
    assert str(err.value).startswith(str(path))


def test_karpathy_json_discovery(tmp_path):
    with pytest.raises(VseError, match="no dataset_\\*.json"):
        load_dataset("karpathy", tmp_path)
    write_karpathy(tmp_path, COCO_ENTRIES)
    write_karpathy(tmp_path, COCO_ENTRIES, name="dataset_flickr30k.json", images=False)
    with pytest.raises(VseError, match="several dataset_\\*.json .*: give the file itself"):
        load_dataset("karpathy", tmp_path)
    chosen = load_dataset("karpathy", tmp_path, file="dataset_flickr30k.json")
    assert chosen.name == "flickr30k"


def karpathy_from_demo(root: Path, splits=(("train", 4), ("val", 1), ("test", 2)),
                       name="dataset_flickr8k.json") -> Path:
    """Karpathy's Flickr8k JSON over the first demo images (real files and captions); images in
    ``root/images/`` as in the real distribution's layout, entries without ``filepath``."""
    rows: dict[str, list[str]] = {}
    for line in (REPO / "data" / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines():
        key, caption = line.split("\t", 1)
        rows.setdefault(key.split("#")[0], []).append(caption)
    names = iter(sorted(rows))
    entries = []
    for split, count in splits:
        for _ in range(count):
            image = next(names)
            (root / "images").mkdir(parents=True, exist_ok=True)
            (root / "images" / image).symlink_to(REPO / "data" / "images" / image)
            entries.append({"filename": image, "split": split,
                            "sentences": [{"raw": c, "tokens": []} for c in rows[image][:5]]})
    path = root / name
    path.write_text(json.dumps({"images": entries, "dataset": "flickr8k"}), encoding="utf-8")
    return path


def test_cli_takes_the_karpathy_json_as_root(tmp_path):
    """README's `vse extract --dataset karpathy --root path/dataset_flickr8k.json`, then the same
    --root in `train --rc` and `evaluate --root`; a folder of several JSONs is refused by name."""
    path = karpathy_from_demo(tmp_path / "f8k")
    out = tmp_path / "k.h5"
    result = vse("extract", "--dataset", "karpathy", "--root", path, "--backbone", "tiny",
                  "--workers", "0", "--quiet", "--out", out)
    assert result.exit_code == 0, result.output
    assert f"wrote {out}: 7 images" in result.output
    from pipeline.data.cache import FeatureCache

    with FeatureCache(out) as cache:
        assert [len(cache.split(s)) for s in ("train", "dev", "test")] == [4, 1, 2]
        assert cache.attrs["dataset_root"] == str(path.parent.resolve())
        assert cache.captions[:5] == load_dataset("karpathy", path).captions[:5]
    run = tmp_path / "run"
    result = vse("train", "--rc", "--dataset", "karpathy", "--root", path, "--backbone", "tiny",
                  "--run-dir", run, "--epochs", "1", "--batch-size", "4", "--embed-dim", "8",
                  "--word-dim", "4", "--min-word-count", "1", "--val-every", "0", "--workers", "0",
                  "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert json.loads((run / "config.json").read_text())["root"] == str(path)
    result = vse("evaluate", "--checkpoint", run / "best.pt", "--dataset", "karpathy", "--root",
                  path, "--split", "test", "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    assert 0 <= json.loads(result.output)["rsum"] <= 600

    karpathy_from_demo(tmp_path / "f8k", splits=(), name="dataset_coco.json")
    folder = tmp_path / "f8k"
    for command in (["extract", "--out", tmp_path / "x.h5"],
                    ["train", "--rc", "--run-dir", tmp_path / "run2", "--backbone", "tiny"],
                    ["evaluate", "--checkpoint", run / "best.pt"]):
        result = vse(*command, "--dataset", "karpathy", "--root", folder)
        assert result.exit_code == 1, result.output
        assert result.output.strip() == (
            f"error: {folder}: several dataset_*.json (dataset_coco.json, dataset_flickr8k.json): "
            f"give the file itself as the root, e.g. {folder / 'dataset_coco.json'}")
    assert not (tmp_path / "x.h5").exists()


def test_cli_root_errors_are_one_line(tmp_path):
    missing = tmp_path / "nowhere"
    result = vse("extract", "--dataset", "flickr8k", "--root", missing, "--out", tmp_path / "x.h5")
    assert (result.exit_code, result.output) == (1, f"error: {missing}: dataset folder not found\n")
    json_file = karpathy_from_demo(tmp_path)
    for kind in ("flickr8k", "vsepp-precomp"):
        result = vse("extract", "--dataset", kind, "--root", json_file, "--out", tmp_path / "x.h5")
        assert (result.exit_code, result.output) == (1, (
            f"error: {json_file}: not a folder; only the karpathy layout takes a file "
            "(its dataset_*.json)\n"))
    result = vse("evaluate", "--checkpoint", tmp_path / "none.pt", "--root", tmp_path)
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1


def test_one_root_option_definition():
    """Every command with a --root shares cli.dataset_root's (one type, one help text)."""
    from cli.dataset_root import DATASET_ROOT, ROOT_HELP
    from cli.main import cli

    with_root = {name: [p for p in cli.commands[name].params if p.name == "root"] for name in cli.commands}
    with_root = {name: params for name, params in with_root.items() if params}
    assert set(with_root) == {"extract", "train", "sweep", "evaluate", "relevance-human"}
    for name, (root,) in with_root.items():
        assert root.type is DATASET_ROOT and root.help.endswith(ROOT_HELP), name


# ---------------------------------------------------------------- vsepp-precomp


def write_precomp(root: Path, split: str, num_images: int, dim=3, per_caption=False):
    root.mkdir(parents=True, exist_ok=True)
    base = {"train": 100, "dev": 200, "test": 300, "testall": 400}[split]
    feats = base + np.arange(num_images, dtype=np.float32)[:, None] + np.zeros(dim, np.float32)
    if per_caption:
        feats = np.repeat(feats, 5, axis=0)
    np.save(root / f"{split}_ims.npy", feats)
    (root / f"{split}_caps.txt").write_text(
        "".join(f"{split} image {k} caption {c}\n" for k in range(num_images)
                for c in range(5)), encoding="utf-8")


def test_vsepp_precomp_concatenates_splits(tmp_path):
    write_precomp(tmp_path, "train", 3, per_caption=True)
    write_precomp(tmp_path, "dev", 2)
    write_precomp(tmp_path, "test", 1)
    ds = load_dataset("vsepp-precomp", tmp_path)
    assert ds.image_paths is None
    assert ds.image_ids == ["train/0", "train/1", "train/2", "dev/0", "dev/1", "test/0"]
    assert {k: v.tolist() for k, v in ds.splits.items()} == {
        "train": [0, 1, 2], "dev": [3, 4], "test": [5]}
    assert ds.captions[5 * 4 + 2] == "dev image 1 caption 2" and ds.captions_per_image == 5
    assert ds.features.shape == (6, 3) and len(ds.features) == 6
    expected = np.array([100, 101, 102, 200, 201, 300], np.float32)[:, None].repeat(3, 1)
    np.testing.assert_array_equal(np.asarray(ds.features), expected)
    np.testing.assert_array_equal(ds.features[[5, 0, 3]], expected[[5, 0, 3]])
    test = ds.subset("test")
    np.testing.assert_array_equal(test.features, expected[5:])
    assert test.captions == [f"test image 0 caption {c}" for c in range(5)]


def test_vsepp_precomp_single_split_is_memory_mapped(tmp_path):
    write_precomp(tmp_path, "testall", 4, per_caption=True)
    ds = load_dataset("vsepp-precomp", tmp_path)
    assert isinstance(ds.features, np.memmap)
    np.testing.assert_array_equal(ds.features[:, 0], [400, 401, 402, 403])
    assert list(ds.splits) == ["testall"]


def test_vsepp_precomp_bad_inputs(tmp_path):
    with pytest.raises(VseError, match="no <split>_caps.txt"):
        load_dataset("vsepp-precomp", tmp_path)
    write_precomp(tmp_path, "dev", 2)
    np.save(tmp_path / "dev_ims.npy", np.zeros((3, 4), np.float32))
    with pytest.raises(VseError, match=r"dev_ims.npy: shape \(3, 4\) does not match 10"):
        load_dataset("vsepp-precomp", tmp_path)
    (tmp_path / "dev_ims.npy").write_bytes(b"not numpy")
    with pytest.raises(VseError, match="dev_ims.npy: not a readable .npy"):
        load_dataset("vsepp-precomp", tmp_path)
    (tmp_path / "dev_caps.txt").write_text("one\ntwo\n")
    with pytest.raises(VseError, match="dev_caps.txt: 2 captions is not a positive multiple"):
        load_dataset("vsepp-precomp", tmp_path)
    with pytest.raises(VseError, match="train_caps.txt: file not found"):
        load_dataset("vsepp-precomp", tmp_path, splits=["train"])
    with pytest.raises(VseError, match="bad split name"):
        load_dataset("vsepp-precomp", tmp_path, splits=["../x"])
    with pytest.raises(VseError, match="5 captions per image by construction"):
        load_dataset("vsepp-precomp", tmp_path, captions_per_image=1)


def test_scan_region_features_are_read_as_sets_and_other_shapes_refused_in_one_line(tmp_path):
    """SCAN's precomp folders use VSE++'s names for (N, 36, 2048) region features: sets, read in
    place (tests/test_sets.py imports and trains on them); other shapes stay refused."""
    write_precomp(tmp_path, "test", 2)
    np.save(tmp_path / "test_ims.npy", np.zeros((2, 36, 8), np.float32))
    assert load_dataset("vsepp-precomp", tmp_path).features.shape == (2, 36, 8)
    np.save(tmp_path / "test_ims.npy", np.zeros(10, np.float32))
    with pytest.raises(VseError, match=r"test_ims.npy: shape \(10,\): not \(rows, D\) vectors nor "
                                       r"\(rows, K, D\) sets of regions"):
        load_dataset("vsepp-precomp", tmp_path)


def test_vsepp_precomp_keeps_empty_caption_for_alignment(tmp_path):
    write_precomp(tmp_path, "test", 2)
    caps = tmp_path / "test_caps.txt"
    lines = caps.read_text().splitlines()
    lines[6] = ""
    caps.write_text("\n".join(lines) + "\n")
    ds = load_dataset("vsepp-precomp", tmp_path)
    assert ds.num_captions == 10 and ds.captions[7] == "test image 1 caption 2"
    assert ds.report.counts == {"caption_empty_kept": 1}


def test_concatenated_rows_indexing_matches_numpy():
    parts = [np.arange(12).reshape(4, 3), np.arange(100, 106).reshape(2, 3),
             np.arange(200, 209).reshape(3, 3)]
    whole, rows = np.concatenate(parts), ConcatenatedRows(parts)
    assert rows.shape == (9, 3) and rows.ndim == 2 and rows.dtype == whole.dtype
    for index in [0, 4, -1, slice(None), slice(3, 7), slice(None, None, -2),
                  [8, 0, 4, 4], np.array([-1, -9]), whole[:, 0] > 100, []]:
        np.testing.assert_array_equal(rows[index], whole[index])
    for bad in [9, -10, [0, 9]]:
        with pytest.raises(IndexError):
            rows[bad]


# ---------------------------------------------------------------- Dataset helpers


def test_subset_regroups_captions_in_split_order_and_summary():
    ds = Dataset(name="toy", root=Path("/toy"), image_ids=["x", "y", "z"],
                 image_paths=[Path("/toy/x"), Path("/toy/y"), Path("/toy/z")],
                 captions=["x0", "y0", "y1", "z0", "x1"],
                 caption_image=np.array([0, 1, 1, 2, 0]),
                 splits={"test": [2, 0], "train": [1]}, report=LoadReport())
    sub = ds.subset("test")
    assert sub.image_ids == ["z", "x"] and sub.image_paths == [Path("/toy/z"), Path("/toy/x")]
    assert sub.captions == ["z0", "x0", "x1"]
    np.testing.assert_array_equal(sub.caption_image, [0, 1, 1])
    assert list(sub.splits) == ["test"] and sub.splits["test"].tolist() == [0, 1]
    with pytest.raises(VseError, match="no split 'dev' \\(splits: test, train\\)"):
        ds.subset("dev")
    ds.report.add("caption_empty", "x#3")
    assert ds.summary().splitlines() == [
        "toy (/toy): 3 images, 5 captions (variable number per image)",
        "splits: test 2, train 1",
        "skipped or changed:",
        "  caption_empty: 1 (e.g. x#3)"]


# ---------------------------------------------------------------- open_image


def test_open_image_converts_modes_to_rgb(tmp_path):
    gray = tmp_path / "gray.png"
    Image.new("L", (3, 2), 77).save(gray)
    cmyk = tmp_path / "cmyk.jpg"
    Image.new("CMYK", (8, 8), (0, 255, 255, 0)).save(cmyk, quality=95)  # pure red
    rgba = tmp_path / "rgba.png"
    pixels = np.zeros((1, 2, 4), np.uint8)
    pixels[0, 0] = (10, 20, 30, 255)  # opaque
    pixels[0, 1] = (0, 0, 0, 0)       # fully transparent → white background
    Image.fromarray(pixels, "RGBA").save(rgba)
    deep = tmp_path / "gray16.png"
    Image.fromarray(np.full((2, 2), 0x8000, np.uint16)).save(deep)

    for path in (gray, cmyk, rgba, deep):
        assert open_image(path).mode == "RGB"
    assert np.asarray(open_image(gray)).tolist() == [[[77] * 3] * 3] * 2
    red = np.asarray(open_image(cmyk), np.int64)
    assert (abs(red - [255, 0, 0]) <= 3).all()
    assert np.asarray(open_image(rgba)).tolist() == [[[10, 20, 30], [255, 255, 255]]]
    assert np.asarray(open_image(deep))[0, 0].tolist() == [128, 128, 128]


def test_open_image_errors_name_the_file(tmp_path, monkeypatch):
    good = tiny_jpeg(tmp_path / "good.jpg")
    truncated = tmp_path / "truncated.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)).save(
        truncated, quality=95)
    truncated.write_bytes(truncated.read_bytes()[:600])
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    text = tmp_path / "notes.jpg"
    text.write_text("not an image")
    cases = [(truncated, "cannot decode image"), (empty, "empty image file"),
             (text, "unknown format"), (tmp_path / "gone.jpg", "image file not found")]
    for path, message in cases:
        with pytest.raises(VseError, match=message) as err:
            open_image(path)
        assert str(err.value).startswith(str(path))
    assert open_image(good).size == (4, 4)

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10)  # 16 px > 10: warning zone
    with pytest.raises(VseError, match="decompression bomb"):
        open_image(good)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 4)  # 16 px > 2×4: PIL's error zone
    with pytest.raises(VseError, match="decompression bomb"):
        open_image(good)


# ---------------------------------------------------------------- real data


def test_bundled_demo_subset():
    ds = load_dataset("flickr8k", REPO / "data")
    assert (ds.num_images, ds.num_captions) == (1000, 5000)
    assert {k: len(v) for k, v in ds.splits.items()} == {"train": 800, "dev": 100, "test": 100}
    assert ds.captions_per_image == 5 and ds.report.counts == {}
    assert sorted(np.concatenate(list(ds.splits.values())).tolist()) == list(range(1000))
    assert open_image(ds.image_paths[0]).size == (224, 224)
    if SHARED_FLICKR8K.is_dir():  # each demo split is drawn from the same official split
        for split, filename in [("train", "Flickr_8k.trainImages.txt"),
                                ("dev", "Flickr_8k.devImages.txt"),
                                ("test", "Flickr_8k.testImages.txt")]:
            official = set((SHARED_FLICKR8K / filename).read_text().split())
            assert {ds.image_ids[i] for i in ds.splits[split]} <= official


@pytest.mark.skipif(not SHARED_FLICKR8K.is_dir(), reason="full Flickr8k not present")
def test_full_flickr8k():
    ds = load_dataset("flickr8k", SHARED_FLICKR8K)
    assert ds.num_images == 8091 and ds.num_captions == 8091 * 5
    assert ds.captions_per_image == 5
    assert ds.report.counts == {"caption_missing_image": 5}
    assert all(e.startswith("2258277193_586949ec62.jpg.1#")
               for e in ds.report.examples["caption_missing_image"])
    assert {k: len(v) for k, v in ds.splits.items()} == {"train": 6000, "dev": 1000,
                                                         "test": 1000}


def test_a_tiny_very_wide_image_is_refused_before_decoding_by_every_stage(tmp_path):
    """A 1 x 8000 PNG is 102 bytes and passes a pixel cap, but resized to a 256 px short side it
    would be 256 x 2,048,000: open_image (extract, RC, embed) and decode_image (search, serve)
    refuse it with the same rule, naming it."""
    from pipeline.search.searcher import QueryError, QueryLimits, decode_image

    path = tmp_path / "wide.png"
    Image.new("RGB", (8000, 1)).save(path)
    assert path.stat().st_size < 200
    with pytest.raises(VseError, match=r"is 8000x1 pixels, 8000 times as long as it is wide; at most 20:1"):
        open_image(path)
    with pytest.raises(QueryError, match="at most 20:1") as info:
        decode_image(path.read_bytes(), QueryLimits())
    assert info.value.status == 413
    Image.new("RGB", (400, 20)).save(tmp_path / "panorama.png")  # 20:1 is still an image
    assert open_image(tmp_path / "panorama.png").size == (400, 20)
