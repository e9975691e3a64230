"""The `csv` dataset kind (open_clip's CSV convention) over the real demo images: grouping and
caption keys, split column or seeded split, separators and column names, the rows it counts and
the files it refuses, and `vse extract` / `train --rc` / `evaluate --root` / `relevance-human` on it."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import vse

from pipeline.core.errors import VseError
from pipeline.core.registry import READERS
from pipeline.data.readers import load_dataset
from pipeline.data.readers.csv_file import seeded_split
from pipeline.data.readers.csv_layout import CSV_SPLIT_RATIO, CsvLayout, parse_split_ratio

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data"


def demo_captions() -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in (DEMO / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines():
        key, caption = line.split("\t", 1)
        rows.setdefault(key.split("#")[0], []).append(caption)
    return rows


CAPTIONS = demo_captions()
NAMES = sorted(CAPTIONS)[:12]


def link_images(folder: Path, names=NAMES, sub: str = "images") -> Path:
    """``folder/sub/<name>`` → the demo image, for each name."""
    (folder / sub).mkdir(parents=True, exist_ok=True)
    for name in names:
        target = folder / sub / name
        if not target.exists():
            target.symlink_to(DEMO / "images" / name)
    return folder


def write_csv(path: Path, header, rows, separator: str = ",") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter=separator, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    return path


def demo_csv(folder: Path, names=NAMES, per_image: int = 3, name: str = "pairs.csv") -> Path:
    """One row per (image, caption), an image's rows together, default column names."""
    link_images(folder, names)
    rows = [[f"images/{n}", c] for n in names for c in CAPTIONS[n][:per_image]]
    return write_csv(folder / name, ["filepath", "title"], rows)


# ---------------------------------------------------------------- reading


def test_rows_of_an_image_are_grouped_in_file_order_with_flickr8k_style_keys(tmp_path):
    a, b, c = NAMES[:3]
    link_images(tmp_path, [a, b, c])
    ca, cb, cc = CAPTIONS[a], CAPTIONS[b], CAPTIONS[c]
    rows = [[f"images/{a}", ca[0]], [f"images/{b}", cb[0]], [f"images/{a}", ca[1]],
            [f"images/{c}", cc[0]], [f"images/{b}", cb[1]], [f"images/{a}", ca[2]]]
    ds = load_dataset("csv", write_csv(tmp_path / "x.csv", ["filepath", "title"], rows))
    ids = [f"images/{a}", f"images/{b}", f"images/{c}"]
    assert ds.image_ids == ids  # order of first appearance
    assert ds.captions == [ca[0], ca[1], ca[2], cb[0], cb[1], cc[0]]  # contiguous, file order
    assert ds.caption_image.tolist() == [0, 0, 0, 1, 1, 2]
    assert ds.caption_keys == [f"{ids[0]}#0", f"{ids[0]}#1", f"{ids[0]}#2", f"{ids[1]}#0", f"{ids[1]}#1",
                               f"{ids[2]}#0"]
    assert ds.image_paths == [tmp_path / "images" / n for n in (a, b, c)]
    assert ds.root == tmp_path and ds.name == "x" and ds.report.counts == {}
    assert ds.captions_per_image is None  # 3, 2 and 1 captions: all kept


def test_a_split_column_is_read_by_image_with_val_as_dev(tmp_path):
    link_images(tmp_path)
    splits = ["train", "TRAIN", "val", "dev", "test ", "train"] * 2
    rows = [[f"images/{n}", CAPTIONS[n][k], s] for k in range(2) for n, s in zip(NAMES, splits)]
    ds = load_dataset("csv", write_csv(tmp_path / "x.csv", ["filepath", "title", "split"], rows))
    by_id = {i: n for n, i in enumerate(ds.image_ids)}
    expected = {"train": [0, 1, 5, 6, 7, 11], "dev": [2, 3, 8, 9], "test": [4, 10]}
    assert {s: ds.splits[s].tolist() for s in ds.splits} == {
        s: [by_id[f"images/{NAMES[i]}"] for i in rows_] for s, rows_ in expected.items()}
    assert ds.reader_attrs["csv_split_key"] == "split" and "split_ratio" not in ds.reader_attrs
    assert ds.captions_per_image == 2


def test_split_values_other_than_train_dev_test_and_split_conflicts_are_refused_naming_the_line(tmp_path):
    link_images(tmp_path)
    a, b = (f"images/{n}" for n in NAMES[:2])
    bad = write_csv(tmp_path / "bad.csv", ["filepath", "title", "split"],
                    [[a, "one", "train"], [b, "two", "training"]])
    with pytest.raises(VseError, match=r"bad\.csv: line 3: split 'training' is not one of train, dev, "
                                       r"test \(or val\)$"):
        load_dataset("csv", bad)
    conflict = write_csv(tmp_path / "conflict.csv", ["filepath", "title", "split"],
                         [[a, "one", "train"], [b, "two", "test"], [a, "three", "test"]])
    with pytest.raises(VseError, match=f"line 4: image {a} is in the test split here but in train on "
                                       "line 2"):
        load_dataset("csv", conflict)
    with pytest.raises(VseError, match="the file's split column 'split' is read"):
        load_dataset("csv", conflict, layout=CsvLayout(split_seed=1))
    # --csv-split-key '' ignores the column: a seeded split, whatever the column says
    ignored = load_dataset("csv", conflict, layout=CsvLayout(csv_split_key="", split_seed=1))
    assert ignored.reader_attrs["split_seed"] == 1 and ignored.num_images == 2


def test_the_seeded_split_is_by_image_reproducible_and_recorded(tmp_path):
    link_images(tmp_path)
    # very unequal caption counts: a split by rows would not give 10/1/1 images
    rows = [[f"images/{n}", c] for i, n in enumerate(NAMES) for c in CAPTIONS[n][:1 + i % 5]]
    path = write_csv(tmp_path / "x.csv", ["filepath", "title"], rows)
    ds = load_dataset("csv", path)
    assert list(ds.splits) == ["train", "dev", "test"]
    assert [len(ds.splits[s]) for s in ds.splits] == [10, 1, 1]
    assert sorted(np.concatenate(list(ds.splits.values())).tolist()) == list(range(12))
    assert ds.reader_attrs == {
        "dataset_file": str(path.resolve()), "csv_img_key": "filepath", "csv_caption_key": "title",
        "csv_separator": ",", "csv_split_key": "", "csv_id_key": "", "split_ratio": [0.8, 0.1, 0.1],
        "split_seed": 0}

    def named(dataset):
        return {s: sorted(dataset.image_ids[i] for i in rows_) for s, rows_ in dataset.splits.items()}

    assert named(load_dataset("csv", path)) == named(ds)  # same seed, same split
    random.Random(0).shuffle(rows)  # row order plays no part
    shuffled = load_dataset("csv", write_csv(tmp_path / "shuffled.csv", ["filepath", "title"], rows))
    assert named(shuffled) == named(ds)
    assert named(load_dataset("csv", path, layout=CsvLayout(split_seed=1))) != named(ds)
    half = load_dataset("csv", path, layout=CsvLayout(split_ratio="0.5,0.25,0.25", split_seed=3))
    assert [len(half.splits[s]) for s in half.splits] == [6, 3, 3]
    assert half.reader_attrs["split_ratio"] == [0.5, 0.25, 0.25] and half.reader_attrs["split_seed"] == 3
    assert list(load_dataset("csv", path, layout=CsvLayout(split_ratio=(1, 0, 0))).splits) == ["train"]


def test_seeded_split_counts_and_stability():
    ids = [f"img{i:03d}.jpg" for i in range(100)]
    split = seeded_split(ids, CSV_SPLIT_RATIO, 0)
    assert [len(split[s]) for s in ("train", "dev", "test")] == [80, 10, 10]
    assert sorted(sum(split.values(), [])) == ids and split["dev"] == sorted(split["dev"])  # ids' order
    grown = seeded_split(ids + ["img100.jpg"], CSV_SPLIT_RATIO, 0)
    moved = [i for i in ids for s in split if i in split[s] and i not in grown[s]]
    assert len(moved) <= 2  # one more image moves at most one image per boundary
    forward = seeded_split(ids, (0.7, 0.2, 0.1), 5)
    backward = seeded_split(list(reversed(ids)), (0.7, 0.2, 0.1), 5)
    assert {s: sorted(v) for s, v in backward.items()} == forward  # the set of ids decides, not the order
    assert [len(forward[s]) for s in forward] == [70, 20, 10]
    assert parse_split_ratio("0.7, 0.2, 0.1") == (0.7, 0.2, 0.1)


def test_tsv_custom_columns_quoting_and_an_id_column(tmp_path):
    link_images(tmp_path, NAMES[:2], sub="pics")
    a, b = NAMES[:2]
    rows = [["x1", f"pics/{a}", 'a dog, "quoted"\tand tabbed'], ["x2", f"pics/{b}", "second"],
            ["x1", f"./pics//{a}", "again"]]
    path = write_csv(tmp_path / "x.tsv", ["key", "image", "text"], rows, separator="\t")
    layout = CsvLayout(csv_img_key="image", csv_caption_key="text", csv_separator="\\t", csv_id_key="key")
    ds = load_dataset("csv", path, layout=layout)
    assert ds.image_ids == ["x1", "x2"] and ds.caption_keys == ["x1#0", "x1#1", "x2#0"]
    assert ds.captions == ['a dog, "quoted"\tand tabbed', "again", "second"]
    assert ds.image_paths == [tmp_path / "pics" / a, tmp_path / "pics" / b]
    assert ds.reader_attrs["csv_separator"] == "\t" and ds.reader_attrs["csv_id_key"] == "key"
    assert CsvLayout(csv_separator="tab") == CsvLayout(csv_separator="\t") == CsvLayout(csv_separator="\\t")
    # the same file read with the default comma: one column, the error says what to check
    with pytest.raises(VseError, match=r"no column 'image' \(--csv-img-key\); the header has "
                                       r"'key\\timage\\ttext'; a single column: is the separator ',' right"):
        load_dataset("csv", path, layout=CsvLayout(csv_img_key="image", csv_caption_key="text"))


def test_unusable_rows_are_counted_never_dropped_silently(tmp_path):
    a, b, c = NAMES[:3]
    link_images(tmp_path / "d", [a, b])
    folder = tmp_path / "d"
    rows = [
        [f"images/{a}", "good a"],
        [f"{folder}/images/{a}", "absolute inside"],        # accepted: the same image
        [f"images/{b}", ""],                                 # caption_empty
        [f"images/{c}", "no such file"],                     # caption_missing_image
        [f"../d/images/{a}", "leaves"],                      # unsafe_path (..)
        [str(REPO / "data" / "images" / a), "outside"],      # unsafe_path (absolute elsewhere)
        ["", "no path"],                                     # image_path_empty
        [f"images/{a}", "good a"],                           # caption_duplicate
        [f"images/{b}", "good b"],
    ]
    path = write_csv(folder / "x.csv", ["filepath", "title"], rows)
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"images/{b},too,many\n\n")  # row_malformed; the blank line is nothing
    ds = load_dataset("csv", path)
    assert ds.image_ids == [f"images/{a}", f"images/{b}"]
    assert ds.captions == ["good a", "absolute inside", "good b"]
    assert ds.report.counts == {"caption_empty": 1, "caption_missing_image": 1, "unsafe_path": 2,
                                "image_path_empty": 1, "caption_duplicate": 1, "row_malformed": 1}
    assert ds.report.examples["caption_missing_image"] == [f"images/{c} (x.csv:5)"]
    assert ds.report.examples["row_malformed"] == ["x.csv:11 (3 fields, the header has 2)"]
    # an id column: one id names one file, one file has one id
    rows = [["p", f"images/{a}", "one"], ["p", f"images/{b}", "two"], ["q", f"images/{a}", "three"],
            ["", f"images/{b}", "four"], ["r", f"images/{b}", "five"]]
    ids = load_dataset("csv", write_csv(folder / "ids.csv", ["id", "filepath", "title"], rows),
                       layout=CsvLayout(csv_id_key="id"))
    assert ids.image_ids == ["p", "r"] and ids.captions == ["one", "five"]
    assert ids.report.counts == {"image_id_conflict": 2, "image_id_empty": 1}


@pytest.mark.parametrize("content, problem", [
    (b"", "empty file (no header row)"),
    (b"\n , \n", "empty file (no header row)"),
    (b"filepath,title\n", "no rows under the header"),
    (b"path,caption\nimages/a.jpg,x\n",
     "no column 'filepath' (--csv-img-key); the header has 'path', 'caption'"),
    (b"filepath,text\nimages/a.jpg,x\n",
     "no column 'title' (--csv-caption-key); the header has 'filepath', 'text'"),
    (b"filepath,title,title\na,b,c\n", "column 'title' (--csv-caption-key) appears 2 times in the header"),
    (b"filepath,title\nimages/a.jpg,caf\xe9\n",
     "line 2: not valid UTF-8 (byte 0xe9); re-save the file as UTF-8"),
    (b'filepath,title\nimages/a.jpg,"open\nimages/b.jpg,x\n',
     "line 2: not readable as CSV (unexpected end of data; a quote opened on this row is never closed)"),
    (b"filepath,title\n/etc/hosts,x\n../a.jpg,y\n",
     "no usable rows (unsafe_path: 2; image paths are read relative to {folder})"),
])
def test_bad_files_are_one_line_errors(tmp_path, content, problem):
    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    with pytest.raises(VseError) as caught:
        load_dataset("csv", path)
    assert str(caught.value) == f"{path}: {problem.format(folder=tmp_path)}"


def test_bad_options_and_roots_are_one_line_errors(tmp_path):
    path = demo_csv(tmp_path, NAMES[:2])
    for ratio, problem in [("0.8,0.2", "give three numbers train,dev,test"),
                           ("0.8,0.1,0.2", "shares must sum to 1, these sum to 1.1"),
                           ("0.9,-0.1,0.2", "shares must be finite and at least 0"),
                           ("0,0.5,0.5", "the train share must be above 0"),
                           ("a,b,c", "give three numbers train,dev,test")]:
        with pytest.raises(VseError) as caught:
            READERS.reader_options("csv", split_ratio=ratio)
        assert str(caught.value) == f"--split-ratio {ratio!r}: {problem} (e.g. 0.8,0.1,0.1)"
    for separator in ("::", "", '"', "a"):
        with pytest.raises(VseError, match="--csv-separator must be one character"):
            CsvLayout(csv_separator=separator)
    with pytest.raises(VseError, match="--csv-img-key and --csv-caption-key name the same column 'x'"):
        CsvLayout(csv_img_key="x", csv_caption_key="x")
    with pytest.raises(VseError, match=r"^--csv-img-key, --split-seed: only for --dataset csv \(the "):
        READERS.reader_options("flickr8k", csv_img_key="x", csv_caption_key=None, split_seed=0)
    assert READERS.reader_options("karpathy", csv_img_key=None) == {}
    assert READERS.reader_options("csv", split_seed=4) == {"layout": CsvLayout(split_seed=4)}
    with pytest.raises(VseError, match=r"no column 'fold' \(--csv-split-key\)"):
        load_dataset("csv", path, layout=CsvLayout(csv_split_key="fold"))
    with pytest.raises(VseError, match=r"no column 'id' \(--csv-id-key\)"):
        load_dataset("csv", path, layout=CsvLayout(csv_id_key="id"))
    with pytest.raises(VseError, match=f"^{tmp_path / 'none.csv'}: file not found$"):
        load_dataset("csv", tmp_path / "none.csv")
    with pytest.raises(VseError, match=r"a folder: --dataset csv takes the CSV file itself \(here: "
                                       r"pairs\.csv\)$"):
        load_dataset("csv", tmp_path)


# ---------------------------------------------------------------- commands


def test_extract_writes_the_index_and_the_split_of_the_csv(tmp_path):
    path = demo_csv(tmp_path / "data")
    out = tmp_path / "c.h5"
    result = vse("extract", "--dataset", "csv", "--root", path, "--backbone", "tiny", "--workers", "0",
                  "--quiet", "--out", out)
    assert result.exit_code == 0, result.output
    assert f"wrote {out}: 12 images" in result.output
    from pipeline.data.cache import FeatureCache

    index = load_dataset("csv", path).select()[1]
    with FeatureCache(out) as cache:
        assert cache.image_ids == index.image_ids == [f"images/{n}" for n in NAMES]
        assert cache.captions == index.captions and cache.caption_fingerprint == index.fingerprint
        assert np.array_equal(cache.caption_image, np.repeat(np.arange(12), 3))
        assert {s: cache.split(s).tolist() for s in cache.split_names} == {
            s: rows.tolist() for s, rows in index.splits.items()}
        assert [len(cache.split(s)) for s in ("train", "dev", "test")] == [10, 1, 1]
        attrs = dict(cache.attrs)
    assert attrs["dataset"] == "csv" and attrs["dataset_root"] == str((tmp_path / "data").resolve())
    assert attrs["dataset_file"] == str(path.resolve())
    assert list(attrs["split_ratio"]) == [0.8, 0.1, 0.1] and attrs["split_seed"] == 0
    assert attrs["csv_img_key"] == "filepath" and attrs["csv_split_key"] == ""

    # TSV with other column names, another ratio and seed; the cache's attributes repeat the reading
    tsv = write_csv(tmp_path / "data" / "pairs.tsv", ["image", "text"],
                    [[f"images/{n}", c] for n in NAMES for c in CAPTIONS[n][:2]], separator="\t")
    other = tmp_path / "t.h5"
    result = vse("extract", "--dataset", "csv", "--root", tsv, "--csv-separator", "\\t",
                  "--csv-img-key", "image", "--csv-caption-key", "text", "--split-ratio", "0.5,0.25,0.25",
                  "--split-seed", "7",
                  "--backbone", "tiny", "--workers", "0", "--quiet", "--out", other)
    assert result.exit_code == 0, result.output
    with FeatureCache(other) as cache:
        attrs = dict(cache.attrs)
        again = load_dataset("csv", attrs["dataset_file"], layout=CsvLayout(**{
            name: attrs[name] for name in ("csv_img_key", "csv_caption_key", "csv_separator", "split_seed")},
            split_ratio=tuple(attrs["split_ratio"]))).select()[1]
        assert {s: cache.split(s).tolist() for s in cache.split_names} == {
            s: rows.tolist() for s, rows in again.splits.items()}
        assert [len(cache.split(s)) for s in ("train", "dev", "test")] == [6, 3, 3]
        assert cache.image_ids == again.image_ids and cache.captions == again.captions

        # the gallery finds the images of a csv cache under its dataset_root
        from pipeline.reports.gallery import ImageSources

        sources = ImageSources(cache.attrs["dataset_root"], tmp_path / "g.html")
        assert sources.path(cache.image_ids[0]) == tmp_path / "data" / "images" / NAMES[0]


@pytest.mark.parametrize("args, problem", [
    (["--split-ratio", "0.8,0.1"], "error: --split-ratio '0.8,0.1': give three numbers train,dev,test"),
    (["--csv-img-key", "path"], "error: {csv}: no column 'path' (--csv-img-key); the header has 'filepath', "
                                "'title'"),
    (["--csv-split-key", "fold"], "error: {csv}: no column 'fold' (--csv-split-key)"),
])
def test_extract_refusals_are_one_line_and_write_nothing(tmp_path, args, problem):
    path = demo_csv(tmp_path, NAMES[:2])
    out = tmp_path / "x.h5"
    result = vse("extract", "--dataset", "csv", "--root", path, *args, "--backbone", "tiny", "--out", out)
    assert result.exit_code == 1 and len(result.output.splitlines()) == 1
    assert result.output.startswith(problem.format(csv=path))
    assert not out.exists() and not (tmp_path / "x.h5.shards").exists()


def test_csv_options_go_only_with_dataset_csv(tmp_path):
    result = vse("extract", "--dataset", "flickr8k", "--root", DEMO, "--split-seed", "1",
                  "--backbone", "tiny", "--out", tmp_path / "x.h5")
    assert (result.exit_code, result.output) == (
        1, "error: --split-seed: only for --dataset csv (the flickr8k layout has no such option)\n")
    assert not (tmp_path / "x.h5").exists()
    from cli.main import cli

    for name in ("extract", "evaluate", "relevance-human"):
        params = {p.name for p in cli.commands[name].params}
        assert {"csv_img_key", "csv_caption_key", "csv_separator", "csv_split_key", "csv_id_key",
                "split_ratio", "split_seed"} <= params, name


def test_train_rc_and_evaluate_root_and_relevance_human_on_a_csv(tmp_path):
    """`train --rc --dataset csv` (default columns), then `evaluate --root` on the same rows under other
    column names and a tab separator: the csv options reach the reader, and the same split comes back."""
    path = demo_csv(tmp_path / "data", per_image=2)
    run = tmp_path / "run"
    result = vse("train", "--rc", "--dataset", "csv", "--root", path, "--backbone", "tiny", "--run-dir", run,
                  "--epochs", "1", "--batch-size", "4", "--embed-dim", "8", "--word-dim", "4",
                  "--min-word-count", "1", "--val-every", "0", "--workers", "0", "--device", "cpu")
    assert result.exit_code == 0, result.output
    tsv = write_csv(tmp_path / "data" / "pairs.tsv", ["image", "text"],
                    [[f"images/{n}", c] for n in NAMES for c in CAPTIONS[n][:2]], separator="\t")
    scores = []
    for root, options in [(path, []), (tsv, ["--csv-separator", "\\t", "--csv-img-key", "image",
                                            "--csv-caption-key", "text"])]:
        result = vse("evaluate", "--checkpoint", run / "best.pt", "--dataset", "csv", "--root", root,
                      *options, "--split", "train", "--device", "cpu", "--json")
        assert result.exit_code == 0, result.output
        scores.append(json.loads(result.output))
    assert scores[0] == scores[1] and 0 <= scores[0]["rsum"] <= 600

    from pipeline.data.image_source import ImageSource

    source = ImageSource("csv", tsv, "tiny", dataset_options=READERS.reader_options(
        "csv", csv_separator="\\t", csv_img_key="image", csv_caption_key="text"))
    assert source.index.image_ids == load_dataset("csv", path).select()[1].image_ids

    # relevance-human takes the CSV file as --root (no cache needed)
    test_ids = [source.index.image_ids[i] for i in source.index.split("train")[:3]]
    judgments = tmp_path / "j.csv"
    judgments.write_text("image,caption_key,grade\n" + "".join(
        f"{image},{key}#{n},{grade}\n" for image in test_ids for key, grade in zip(test_ids, (1, 0, 0.5))
        for n in range(2)), encoding="utf-8")
    result = vse("relevance-human", "--root", tsv, "--dataset", "csv", "--csv-separator", "\\t",
                  "--csv-img-key", "image", "--csv-caption-key", "text", "--split", "train",
                  "--method", "cbow", "--judgments", judgments, "--judgments-format", "csv", "--json",
                  "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["methods"]["cbow"]["pairs"] == 18
