"""A corpus of bad inputs, generated in tmp_path and driven through the `vse` command line:
each gives exit status 1 and one line ``error: <file>: <problem>``, or a documented,
counted skip — never a traceback from inside a library.

Reader-level behaviour is tested in test_datasets.py (open_image modes and errors, UTF-8,
duplicate keys, split entries naming unknown images …), test_cache.py (broken caches) and
test_train.py (checkpoint unpickling); here the same inputs go through the whole CLI.
"""

from __future__ import annotations

import pickle
import re
import shutil
import struct
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import demo_captions, train, vse, write_feature_cache

from pipeline.data.cache import FeatureCache

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


# ---------------------------------------------------------------------------- the corpus


def png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG that declares ``width`` × ``height`` pixels and holds none: a decompression
    bomb as far as the header goes (PIL checks the size before decoding anything)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b""))
    return path


def odd_but_valid_images(images: Path, names: list[str]) -> dict[str, str]:
    """Overwrite images with valid files of other modes (same names, so the dataset still
    lists them; PIL reads the format from the content)."""
    from PIL import Image

    photos = [Image.open(images / name).convert("RGB") for name in names[:4]]
    alpha = photos[0].convert("RGBA")
    alpha.putalpha(Image.linear_gradient("L").resize(alpha.size))
    alpha.save(images / names[0], format="PNG")
    photos[1].convert("L").save(images / names[1], format="JPEG")
    photos[2].convert("CMYK").save(images / names[2], format="JPEG")
    photos[3].convert("P", palette=Image.Palette.ADAPTIVE).save(images / names[3], format="PNG")
    return dict(zip(names, ["PNG with alpha", "grayscale JPEG", "CMYK JPEG", "palette PNG"]))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


# kind → (how to break an image file in place, what the error must say)
BROKEN_IMAGES = {
    "truncated JPEG": (_truncate, "cannot decode image"),
    "zero bytes": (lambda p: p.write_bytes(b""), "empty image file (0 bytes)"),
    "not an image": (lambda p: p.write_text("<html>404</html>"),
                     "not an image file PIL can read (unknown format)"),
    "900 Mpx bomb": (lambda p: png_header_only(p, 30_000, 30_000), "possible decompression bomb"),
    "100 Mpx bomb": (lambda p: png_header_only(p, 10_000, 10_000), "possible decompression bomb"),
}


# ---------------------------------------------------------------------------- running the CLI


def assert_one_error_line(result, path, problem: str) -> None:
    """Exit 1 and exactly ``error: <path>: …<problem>…`` on stderr (no traceback)."""
    assert isinstance(result.exception, SystemExit), result.exc_info  # not a library exception
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {path}: ") and problem in lines[0], lines[0]


def extract(root: Path, out: Path, *extra):
    return vse("extract", "--dataset", "flickr8k", "--root", root, "--backbone", "tiny", "--out", out,
               "--workers", 0, "--device", "cpu", "--quiet", *extra)


# ---------------------------------------------------------------------------- images


def test_odd_image_modes_are_converted_not_skipped(tmp_path):
    root = flickr8k_layout(tmp_path / "f8k", 6)
    names = sorted(p.name for p in (root / "images").iterdir())
    odd_but_valid_images(root / "images", names)
    result = extract(root, tmp_path / "f.h5")
    assert result.exit_code == 0, result.output
    assert "unreadable" not in result.stderr
    with FeatureCache(tmp_path / "f.h5") as cache:
        features = cache.features[...]
        assert len(cache.bad_images) == 0 and cache.check().ok
    assert np.isfinite(features).all() and features.any(axis=1).all()
    assert len({row.tobytes() for row in features}) == 6  # six different pictures


@pytest.mark.parametrize("kind", BROKEN_IMAGES)
def test_a_broken_image_stops_extract_with_one_line(tmp_path, kind):
    root = flickr8k_layout(tmp_path / "f8k", 6)
    victim = sorted((root / "images").iterdir())[4]
    breaks, problem = BROKEN_IMAGES[kind]
    breaks(victim)
    result = extract(root, tmp_path / "f.h5")
    assert_one_error_line(result, victim, problem)
    assert "--skip-bad-images" in result.stderr
    assert not (tmp_path / "f.h5").exists()


def test_skip_bad_images_stores_zeros_and_counts_each(tmp_path):
    root = flickr8k_layout(tmp_path / "f8k", 9)
    paths = sorted((root / "images").iterdir())
    broken = paths[2:2 + len(BROKEN_IMAGES)]
    for path, (breaks, _) in zip(broken, BROKEN_IMAGES.values()):
        breaks(path)
    result = extract(root, tmp_path / "f.h5", "--skip-bad-images")
    assert result.exit_code == 0, result.output
    skipped = [line for line in result.stderr.splitlines() if line.startswith("unreadable image")]
    assert len(skipped) == len(BROKEN_IMAGES)
    for line, path, (_, problem) in zip(skipped, broken, BROKEN_IMAGES.values()):
        assert line.startswith(f"unreadable image stored as zeros: {path.name}: {path}: ") and problem in line
    with FeatureCache(tmp_path / "f.h5") as cache:
        bad = [cache.image_ids.index(p.name) for p in broken]
        assert sorted(cache.bad_images.tolist()) == sorted(bad)
        assert not cache.read(bad).any() and cache.read([cache.image_ids.index(paths[0].name)]).any()
    info = vse("info", tmp_path / "f.h5")
    assert info.exit_code == 0 and "5 unreadable images stored as zeros" in info.output


# ---------------------------------------------------------------------------- caption and split files


def test_caption_and_split_files_that_are_not_utf8(tmp_path):
    root = flickr8k_layout(tmp_path / "f8k", 3)
    token = root / "Flickr8k.token.txt"
    lines = token.read_text(encoding="utf-8").splitlines()
    lines[6] = lines[6] + " at the café"
    token.write_bytes("\n".join(lines).encode("latin-1"))
    assert_one_error_line(extract(root, tmp_path / "f.h5"), token,
                          "line 7: not valid UTF-8 (byte 0xe9); re-save the file as UTF-8")

    root = flickr8k_layout(tmp_path / "again", 3)
    split = root / "Flickr_8k.devImages.txt"
    split.write_bytes(b"\xff\xfe" + split.read_text().encode("utf-16-le"))
    assert_one_error_line(extract(root, tmp_path / "f.h5"), split, "line 1: not valid UTF-8 (byte 0xff)")


def test_unusable_rows_are_skipped_and_counted(tmp_path):
    rows = demo_rows(6)
    names = list(rows)
    token_lines = [row for name in names for row in rows[name]]
    token_lines[1] = f"{names[0]}#1\t   "              # empty caption: image 0 keeps only 4
    token_lines.append(token_lines[5])                  # duplicate key (image 1, #0)
    token_lines.append("missing.jpg#0\ta caption of an image that is not there")
    token_lines.append("no tab on this line")
    root = flickr8k_layout(tmp_path / "f8k", 6, token_lines=token_lines)
    train_split = root / "Flickr_8k.trainImages.txt"
    train_split.write_text(train_split.read_text() + f"{names[1]}\nnot-in-the-folder.jpg\n")

    result = extract(root, tmp_path / "f.h5")
    assert result.exit_code == 0, result.output
    counted = {line.split(": ")[1]: line for line in result.stderr.splitlines()
               if line.startswith("dataset: skipped or changed ")}
    expected = {"caption_empty": 1, "caption_duplicate_key": 1, "caption_missing_image": 1,
                "caption_malformed_line": 1, "image_too_few_captions": 1,
                "split_duplicate_image": 1, "split_unknown_image": 1}
    assert {k.removeprefix("skipped or changed "): int(v.split(": ")[2].split()[0])
            for k, v in counted.items()} == expected, result.stderr
    with FeatureCache(tmp_path / "f.h5") as cache:
        assert cache.image_ids == names[1:] and len(cache.captions) == 25


def test_an_image_in_two_splits_is_an_error(tmp_path):
    root = flickr8k_layout(tmp_path / "f8k", 6)
    first = (root / "Flickr_8k.trainImages.txt").read_text().split()[0]
    with open(root / "Flickr_8k.testImages.txt", "a") as fh:
        fh.write(f"{first}\n")
    assert_one_error_line(extract(root, tmp_path / "f.h5"), root,
                          f"image {first} is in both the train and the test split")


def test_long_unknown_and_empty_word_captions_go_through_every_stage(tmp_path):
    """A 5,000-word caption is kept whole in the cache and cut to max_caption_tokens (100)
    for training; a caption of punctuation only is an empty sequence, one of words never
    seen in training is <unk>s; both get relevance 0, counted in `vse relevance`'s notes."""
    rows = demo_rows(9)
    names = list(rows)
    words = " ".join(["dog"] * 5000)
    token_lines = [row for name in names for row in rows[name]]
    token_lines[0] = f"{names[0]}#0\t{words}"
    token_lines[10] = f"{names[2]}#0\t... !!! ?"
    token_lines[35] = f"{names[7]}#0\tqzxv wvkj plmq"  # a test image: words never seen in training
    root = flickr8k_layout(tmp_path / "f8k", 9, token_lines=token_lines)
    cache = tmp_path / "f.h5"
    assert extract(root, cache).exit_code == 0
    with FeatureCache(cache) as opened:
        assert opened.captions[0] == words

    result = train(cache, tmp_path / "run")
    assert result.exit_code == 0, result.output
    svd = vse("relevance", "--features", cache, "--method", "svd", "--k", 8, "--out", tmp_path / "s.h5")
    assert svd.exit_code == 0, svd.output
    assert _note(svd.output, "captions without terms") == 2
    cbow = vse("relevance", "--features", cache, "--method", "cbow", "--out", tmp_path / "c.h5")
    assert cbow.exit_code == 0, cbow.output
    assert _note(cbow.output, "captions without known words") == 2


def _note(output: str, what: str) -> int:
    """The count in `vse relevance`'s note line about ``what``."""
    line = next(line for line in output.splitlines() if line.startswith("note:") and what in line)
    return int(re.search(r"\b(\d+)\b", line).group(1))


# ---------------------------------------------------------------------------- feature caches


@pytest.fixture
def trained(sh_run) -> Path:
    """best.pt of a one-epoch run on the tiny cache (32-d features of backbone 'synthetic')."""
    return sh_run / "best.pt"


def _tiny_contents(num_images=40):
    from conftest import learnable_features

    ids, captions = demo_captions(num_images)
    caption_image = np.repeat(np.arange(num_images), 5)
    splits = {"train": np.arange(24), "dev": np.arange(24, 32), "test": np.arange(32, 40)}
    return learnable_features(captions, caption_image, num_images), captions, caption_image, splits, ids


def _cache_like_tiny(path, transform=lambda f: f, **attrs):
    features, captions, caption_image, splits, ids = _tiny_contents()
    return write_feature_cache(path, transform(features), captions, caption_image, splits,
                               image_ids=ids, **attrs)


def _with_nan_in_test(features):
    features = features.copy()
    features[33, 5] = np.nan
    return features


def _broken_caches(folder: Path, tiny_cache: Path) -> dict[str, tuple[Path, str]]:
    truncated = folder / "truncated.h5"
    truncated.write_bytes(tiny_cache.read_bytes()[:4096])
    text = folder / "notes.h5"
    text.write_text("features: see the other file")
    foreign = folder / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["features"] = np.zeros((2, 2))
    shardless = _cache_like_tiny(folder / "shardless.h5")
    shutil.rmtree(f"{shardless}.shards")
    return {
        "missing": (folder / "absent.h5", "feature cache not found"),
        "truncated": (truncated, "not a readable HDF5 file (truncated or another format)"),
        "text": (text, "not a readable HDF5 file (truncated or another format)"),
        "foreign HDF5": (foreign, "not a vse feature cache (format attribute None; `vse extract` makes"),
        "shard deleted": (shardless, "missing shard shardless.h5.shards/shard-00000.h5 (rows 0..39)"),
    }


def test_broken_caches_are_refused_by_train_evaluate_and_relevance(tmp_path, tiny_cache, trained):
    for kind, (path, problem) in _broken_caches(tmp_path, tiny_cache).items():
        assert_one_error_line(train(path, tmp_path / "run"), path, problem)
        assert_one_error_line(vse("evaluate", "--checkpoint", trained, "--features", path), path, problem)
        assert_one_error_line(vse("relevance", "--features", path, "--method", "svd",
                                  "--out", tmp_path / "rel.h5"), path, problem)
        assert_one_error_line(vse("info", path), path, problem)
    assert not (tmp_path / "run" / "last.pt").exists() and not (tmp_path / "rel.h5").exists()


def test_nan_features_are_named_by_every_command(tmp_path, trained):
    cache = _cache_like_tiny(tmp_path / "nan.h5", _with_nan_in_test)
    assert_one_error_line(vse("info", cache), cache, "broken cache: 1 rows with NaN (first rows: 33)")
    assert_one_error_line(vse("evaluate", "--checkpoint", trained, "--features", cache), cache,
                          "the features of row 33 (split 'test') hold NaN or Inf")
    assert_one_error_line(train(cache, tmp_path / "run", "--val-split", "test"), cache,
                          "the features of row 33 (split 'test') hold NaN or Inf")
    with_nan_in_train = _cache_like_tiny(tmp_path / "nan-train.h5",
                                         lambda f: np.where(np.arange(40)[:, None] == 3, np.nan, f))
    assert_one_error_line(train(with_nan_in_train, tmp_path / "run2"), with_nan_in_train, "loss became nan")


def test_a_missing_split_is_named(tmp_path, tiny_cache, trained):
    problem = "no split 'val' (splits: train, dev, test)"
    assert_one_error_line(train(tiny_cache, tmp_path / "run", "--val-split", "val"), tiny_cache, problem)
    assert_one_error_line(vse("evaluate", "--checkpoint", trained, "--features", tiny_cache,
                              "--split", "val"), tiny_cache, problem)
    assert_one_error_line(vse("relevance", "--features", tiny_cache, "--method", "svd", "--fit-split",
                              "val", "--out", tmp_path / "r.h5"), tiny_cache, problem)
    root = flickr8k_layout(tmp_path / "f8k", 3)
    assert_one_error_line(extract(root, tmp_path / "f.h5", "--splits", "train,val"), root,
                          "no split 'val' in the dataset (splits: train, dev, test)")


def test_features_from_another_backbone_than_the_checkpoint(tmp_path, trained):
    narrow = _cache_like_tiny(tmp_path / "narrow.h5", lambda f: f[:, :7])
    assert_one_error_line(vse("evaluate", "--checkpoint", trained, "--features", narrow), narrow,
                          f"features are 7-d but the checkpoint {trained} expects 32-d (different backbone?)")
    resnet = _cache_like_tiny(tmp_path / "resnet.h5", backbone="resnet152")
    assert_one_error_line(vse("evaluate", "--checkpoint", trained, "--features", resnet), resnet,
                          f"features come from backbone 'resnet152' but the checkpoint {trained} "
                          "was trained on 'synthetic'")


def test_a_relevance_file_of_another_cache_is_refused(tmp_path, tiny_cache):
    features, captions, caption_image, _, ids = _tiny_contents()
    other = write_feature_cache(tmp_path / "other.h5", features[:10], captions[:50], caption_image[:50],
                                {"train": np.arange(10)}, image_ids=ids[:10])
    relevance = tmp_path / "other-rel.h5"
    made = vse("relevance", "--features", other, "--method", "svd", "--k", 4, "--out", relevance)
    assert made.exit_code == 0
    assert_one_error_line(train(tiny_cache, tmp_path / "run", "--loss", "lseh", "--relevance", relevance),
                          relevance, "relevance file has 50 captions but the feature cache has 200")


# ---------------------------------------------------------------------------- untrusted checkpoints


class _RunsCode:
    """Unpickling this runs code: it creates the file ``marker``."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def _untrusted_checkpoints(folder: Path, trained: Path) -> dict[str, tuple[Path, str]]:
    marker = folder / "pwned"
    state = torch.load(trained, weights_only=True)
    evil_zip = folder / "evil-zip.pt"  # a real torch zip checkpoint whose pickle runs code
    torch.save({**state, "model_config": _RunsCode(marker)}, evil_zip)
    evil_pickle = folder / "evil-pickle.pt"  # the legacy plain-pickle format
    evil_pickle.write_bytes(pickle.dumps({**state, "vocab": _RunsCode(marker)}))
    truncated = folder / "truncated.pt"
    truncated.write_bytes(trained.read_bytes()[:2000])
    foreign = folder / "foreign.pt"
    torch.save({"state_dict": state["model"]}, foreign)
    mismatched = folder / "mismatched.pt"
    torch.save({**state, "model_config": {**state["model_config"], "embed_dim": 4}}, mismatched)
    refusing = "refusing to load checkpoint: it holds objects other than tensors and plain values"
    return {
        "code in a zip checkpoint": (evil_zip, refusing),
        "code in a pickle": (evil_pickle, refusing),
        "truncated": (truncated, "corrupt or truncated checkpoint"),
        "not a vse checkpoint": (foreign, "not a vse checkpoint"),
        "weights of another shape": (mismatched, "checkpoint does not match the model it describes"),
    }


def test_untrusted_checkpoints_never_run_code(tmp_path, tiny_cache, trained):
    cases = _untrusted_checkpoints(tmp_path, trained)
    for kind, (checkpoint, problem) in cases.items():
        result = vse("evaluate", "--checkpoint", checkpoint, "--features", tiny_cache)
        assert_one_error_line(result, checkpoint, problem)
    for kind in ("code in a zip checkpoint", "code in a pickle"):
        checkpoint, problem = cases[kind]
        assert_one_error_line(train(tiny_cache, tmp_path / "run", "--init-from", checkpoint),
                              checkpoint, problem)
        run_dir = tmp_path / f"resumed-{checkpoint.stem}"
        run_dir.mkdir()
        shutil.copy(checkpoint, run_dir / "last.pt")
        assert_one_error_line(train(tiny_cache, run_dir, "--resume"), run_dir / "last.pt", problem)
    assert not (tmp_path / "pwned").exists()


# ---------------------------------------------------------------------------- options out of range


def assert_one_option_error(result, problem: str) -> None:
    """Exit 1 and exactly ``error: <problem>`` (an option has no file to name)."""
    assert isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [f"error: {problem}"], result.stderr


@pytest.mark.parametrize("flags,problem", [
    (["--epochs", -1], "epochs must be at least 1, got -1"),
    (["--epochs", 0], "epochs must be at least 1, got 0"),
    (["--batch-size", -4], "batch_size must be at least 1, got -4"),
    (["--batch-size", 0], "batch_size must be at least 1, got 0"),
    (["--embed-dim", 0], "embed_dim must be at least 1, got 0"),
    (["--val-images", 0], "val_images must be at least 1, got 0"),
    (["--lr", -1], "lr must be more than 0, got -1.0"),
    (["--lr", "nan"], "lr must be a finite number, got nan"),
    (["--val-every", -1], "val_every must be at least 0, got -1"),
    (["--margin", -0.1], "margin must be at least 0, got -0.1"),
])
def test_train_options_out_of_range_are_one_line_before_anything_is_written(tiny_cache, tmp_path, flags,
                                                                            problem):
    run = tmp_path / "run"
    assert_one_option_error(train(tiny_cache, run, *flags), problem)
    assert not run.exists()  # no run folder, no "done → best.pt"


def test_extract_options_out_of_range(tmp_path):
    for flags, problem in ((["--workers", -1], "--workers must be at least 0, got -1"),
                           (["--batch-size", 0], "--batch-size must be at least 1, got 0"),
                           (["--shard-size", 0], "--shard-size must be at least 1, got 0")):
        assert_one_option_error(extract(DEMO, tmp_path / "f.h5", *flags), problem)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("text,problem", [
    (b'epochs: "ten"\n', "epochs must be an integer, got 'ten'"),
    (b"epochs: 2.5\n", "epochs must be an integer, got 2.5"),
    (b"lr: fast\n", "lr must be a number, got 'fast'"),
    (b"amp: 1\n", "amp must be true or false (or null), got 1"),
    (b"batch_size: -4\n", "batch_size must be at least 1, got -4"),
    (b"loss_options: [1, 2]\n", "loss_options must be a mapping of option names to values, got [1, 2]"),
    (b"val_split: 7\n", "val_split must be text, got 7"),
    (b"epohcs: 3\n", "unknown training option(s): epohcs"),
    (b"1: 3\n", "config must be a mapping of option names to values"),
    (b"loss: mh\n# caf\xe9\n", "not UTF-8 text (byte 0xe9 at offset 14)"),
])
def test_config_files_with_wrong_types_or_bytes_name_the_file(tiny_cache, tmp_path, text, problem):
    config = tmp_path / "exp.yaml"
    config.write_bytes(text)
    run = tmp_path / "run"
    assert_one_error_line(train(tiny_cache, run, "--config", config), config, problem)
    assert not run.exists()


def test_a_config_file_lr_written_1e_3_is_a_number(tiny_cache, tmp_path):
    """YAML 1.1 (PyYAML) reads 1e-3 as text; a float option takes it as the number it spells."""
    config = tmp_path / "exp.yaml"
    config.write_text("lr: 1e-3\nbatch_size: 16\n")
    result = train(tiny_cache, tmp_path / "run", "--config", config)
    assert result.exit_code == 0, result.output
    saved = (tmp_path / "run" / "config.json").read_text()
    assert '"lr": 0.001' in saved and '"batch_size": 8' in saved  # the flag beats the file
