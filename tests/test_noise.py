"""Noisy correspondence (pipeline.data.noise): NCR's draw, both modes and both public layouts, the
index kept in the run folder, training on the noisy pairs, exact resume, and one-line refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import vse

from pipeline.core.errors import VseError
from pipeline.data.noise import NoiseIndex, draw


def ncr_t2i_index(length: int, noise_ratio: float, seed: int) -> np.ndarray:
    """NCR's data.py in its own words (global numpy RNG seeded once), for 5 captions per image."""
    np.random.seed(seed)
    t2i_index = np.arange(0, length) // 5
    idx = np.arange(length)
    np.random.shuffle(idx)
    noise_length = int(noise_ratio * length)
    shuffle_index = t2i_index[idx[:noise_length]]
    np.random.shuffle(shuffle_index)
    t2i_index[idx[:noise_length]] = shuffle_index
    return t2i_index


@pytest.mark.parametrize("rate", [0.2, 0.5])
def test_caption_noise_is_ncrs_draw_and_a_seed_gives_the_same_bytes(rate):
    caption_image = np.arange(500) // 5
    ours = NoiseIndex.make("caption", rate, 7, caption_image, 100)
    assert np.array_equal(ours.entries, ncr_t2i_index(500, rate, 7))
    again = NoiseIndex.make("caption", rate, 7, caption_image, 100)
    assert ours.entries.tobytes() == again.entries.tobytes() and ours.sha256() == again.sha256()
    assert ours.sha256() != NoiseIndex.make("caption", rate, 8, caption_image, 100).sha256()
    assert 0.8 * rate < ours.true_rate() <= rate  # a permutation leaves some entries in place
    # the chosen captions' images are permuted among themselves: the same multiset of images
    assert np.array_equal(np.bincount(ours.entries, minlength=100), np.full(100, 5))


def decl_noisy_inx(img_len: int, noise_ratio: float, seed: int) -> np.ndarray:
    """DECL's data.py (QinYang79/DECL 1b0a775, PrecompDataset; RCL's penghu-cs/RCL data.py draws the
    same) in its own words, its global numpy RNG seeded once."""
    np.random.seed(seed)
    noisy_inx = np.arange(img_len)
    inx = np.arange(img_len)
    np.random.shuffle(inx)
    chosen = inx[0: int(noise_ratio * img_len)]
    shuffled = np.array(chosen)
    np.random.shuffle(shuffled)
    noisy_inx[chosen] = shuffled
    return noisy_inx


@pytest.mark.parametrize("rate", [0.2, 0.5])
def test_image_noise_is_decls_and_rcls_draw(rate):
    ours = NoiseIndex.make("image", rate, 7, np.arange(500) // 5, 100)
    assert np.array_equal(ours.entries, decl_noisy_inx(100, rate, 7))


def test_image_noise_moves_whole_images_with_their_captions():
    caption_image = np.arange(500) // 5
    noise = NoiseIndex.make("image", 0.4, 3, caption_image, 100)
    assert noise.entries.shape == (100,) and sorted(noise.entries) == list(range(100))  # a permutation
    per_caption = noise.per_caption()
    assert np.array_equal(per_caption, noise.entries[caption_image])
    moved = noise.entries != np.arange(100)
    assert 30 <= moved.sum() <= 40 and noise.true_rate() == pytest.approx(moved.mean())
    assert np.array_equal(draw(100, 0.4, 3), noise.entries)


def test_public_files_of_both_layouts_are_read_and_bad_ones_refused(tmp_path):
    caption_image = np.arange(50) // 5
    per_caption, per_image = tmp_path / "c.npy", tmp_path / "i.npy"
    np.save(per_caption, ncr_t2i_index(50, 0.4, 0))
    np.save(per_image, np.random.RandomState(0).permutation(10).astype(np.int32))
    assert NoiseIndex.read(per_caption, caption_image, 10).layout == "caption"
    read = NoiseIndex.read(per_image, caption_image, 10)
    assert read.layout == "image" and read.entries.dtype == np.int64
    cases = {"wrong length": (np.arange(7), "7 entries: the training split has 50 captions and 10 images"),
             "out of range": (np.arange(50) % 11, "training images are 0..9"),
             "floats": (np.zeros(50), "1-D integer array"),
             "2-D": (np.zeros((10, 5), dtype=np.int64), "1-D integer array")}
    for name, (array, words) in cases.items():
        path = tmp_path / f"{name}.npy"
        np.save(path, array)
        with pytest.raises(VseError, match=words):
            NoiseIndex.read(path, caption_image, 10)
    pickled = tmp_path / "pickled.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(VseError, match="not a .npy array"):
        NoiseIndex.read(pickled, caption_image, 10)


NOISY_TRAIN = ("--loss", "sh", "--embed-dim", 8, "--word-dim", 8, "--batch-size", 8, "--min-word-count", 1,
               "--val-every", 0, "--workers", 0, "--device", "cpu")


def test_a_noisy_run_trains_on_the_noisy_pairs_keeps_its_index_and_resumes_exactly(tiny_cache, tmp_path):
    from pipeline.core.config import TrainConfig
    from pipeline.training.build import build_run

    noisy = ("--noise-rate", 0.4, "--noise-mode", "image", "--noise-seed", 5, *NOISY_TRAIN)
    straight = vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "a", "--epochs", 2, *noisy)
    assert straight.exit_code == 0, straight.output
    assert "noisy pairs: image-level index (mode=image rate=0.4 seed=5), true rate" in straight.output
    note = json.loads((tmp_path / "a" / "noise.json").read_text())
    kept = np.load(tmp_path / "a" / "noise_index.npy", allow_pickle=False)
    assert note["layout"] == "image" and 0 < note["true_rate"] <= 0.4 and len(kept) == note["entries"]

    parts = build_run(TrainConfig.from_dict({**json.loads((tmp_path / "a" / "config.json").read_text()),
                                             "run_dir": str(tmp_path / "c")}), echo=lambda *a: None)
    index, train = parts.source.index, parts.train_captions
    changed = parts.train_caption_image[train] != index.caption_image[train]
    assert changed.mean() == pytest.approx(note["true_rate"])  # training reads the noisy images
    assert np.array_equal(parts.train_caption_image[~np.isin(np.arange(len(index.caption_image)), train)],
                          index.caption_image[~np.isin(np.arange(len(index.caption_image)), train)])

    first = vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "b", "--epochs", 1, *noisy)
    assert first.exit_code == 0, first.output
    assert vse("train", "--run-dir", tmp_path / "b", "--resume", "--epochs", 2).exit_code == 0
    a, b = (torch.load(tmp_path / r / "last.pt", weights_only=True)["model"] for r in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)
    clean = vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "clean", "--epochs", 2,
                *NOISY_TRAIN)
    assert clean.exit_code == 0
    c = torch.load(tmp_path / "clean" / "last.pt", weights_only=True)["model"]
    assert not all(torch.equal(a[k], c[k]) for k in a)  # the noise changed what was learned


def test_noise_index_command_writes_what_train_reads(tiny_cache, tmp_path):
    out = tmp_path / "idx.npy"
    made = vse("noise-index", "--features", tiny_cache, "--mode", "caption", "--rate", 0.5, "--seed", 2,
               "--out", out)
    assert made.exit_code == 0 and "true rate" in made.output, made.output
    assert vse("noise-index", "--features", tiny_cache, "--rate", 0.5, "--out", out).exit_code == 1  # exists
    by_file = vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "f", "--epochs", 1,
                  "--noise-index", out, *NOISY_TRAIN)
    by_seed = vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "s", "--epochs", 1,
                  "--noise-rate", 0.5, "--noise-seed", 2, *NOISY_TRAIN)
    assert by_file.exit_code == by_seed.exit_code == 0, by_file.output + by_seed.output
    notes = [json.loads((tmp_path / r / "noise.json").read_text()) for r in "fs"]
    assert notes[0]["sha256"] == notes[1]["sha256"]
    both = vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "x", "--noise-index", out,
               "--noise-rate", 0.2, *NOISY_TRAIN)
    assert both.exit_code == 1 and "not both" in both.stderr
    np.save(tmp_path / "short.npy", np.arange(3))
    short = vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "y", "--noise-index",
                tmp_path / "short.npy", *NOISY_TRAIN)
    assert short.exit_code == 1 and "3 entries" in short.stderr
    assert len(short.stderr.strip().splitlines()) == 1


def test_the_shipped_flickr8k_indexes_are_their_seeded_draws():
    """data/noise/flickr8k: each file is its draw with seed 0 over 6,000 images × 5 captions, and
    SHA256SUMS lists its bytes."""
    import hashlib
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "data" / "noise" / "flickr8k"
    sums = dict(reversed(line.split()) for line in (folder / "SHA256SUMS").read_text().splitlines())
    assert len(sums) == 10
    caption_image = np.arange(30000) // 5
    for name, digest in sums.items():
        path = folder / name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, name
        mode, rate = path.stem.split("_")
        read = NoiseIndex.read(path, caption_image, 6000)
        assert read.layout == mode
        drawn = NoiseIndex.make(mode, int(rate) / 100, 0, caption_image, 6000)
        assert np.array_equal(read.entries, drawn.entries)
