"""Shared fixtures: real demo captions, small feature caches in the documented format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO_DATA = ROOT / "data"
SHARED_FLICKR8K = ROOT.parent / "shared" / "data" / "flickr8k"


def demo_captions(num_images: int) -> tuple[list[str], list[str]]:
    """Image ids and their 5 real captions each (captions 5k..5k+4 of image k)."""
    rows: dict[str, list[str]] = {}
    for line in (DEMO_DATA / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines():
        key, caption = line.split("\t", 1)
        rows.setdefault(key.split("#")[0], []).append(caption)
    ids = sorted(rows)[:num_images]
    return ids, [c for i in ids for c in rows[i][:5]]


def write_feature_cache(path, features, captions, caption_image, splits, image_ids=None, **attrs) -> Path:
    """A feature cache as `vse extract` writes it (features stored inline, no shards)."""
    from pipeline.data.cache import write_cache

    n = len(features)
    image_ids = image_ids or [f"img{i}" for i in range(n)]
    return write_cache(path, np.asarray(features, dtype=np.float32), image_ids, captions,
                       np.asarray(caption_image), splits, attrs={"backbone": "synthetic", **attrs})


def learnable_features(captions, caption_image, num_images, dim=32, seed=0, noise=0.1):
    """Image features = a fixed random projection of the words of the image's captions + noise,
    so a tiny model can learn the pairing in a few epochs."""
    from pipeline.text.vocabulary import tokenize

    rng = np.random.default_rng(seed)
    vocab = sorted({w for c in captions for w in tokenize(c)})
    word_vec = {w: rng.standard_normal(dim) for w in vocab}
    feats = np.zeros((num_images, dim))
    for c, img in zip(captions, caption_image):
        for w in tokenize(c):
            feats[img] += word_vec[w]
    feats /= np.linalg.norm(feats, axis=1, keepdims=True)
    return (feats + noise * rng.standard_normal(feats.shape)).astype(np.float32)


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> Path:
    """40 real demo images' captions, learnable synthetic features: 24 train / 8 dev / 8 test."""
    n = 40
    ids, captions = demo_captions(n)
    caption_image = np.repeat(np.arange(n), 5)
    feats = learnable_features(captions, caption_image, n)
    splits = {"train": np.arange(24), "dev": np.arange(24, 32), "test": np.arange(32, 40)}
    return write_feature_cache(tmp_path_factory.mktemp("cache") / "tiny.h5", feats, captions,
                               caption_image, splits, image_ids=ids)


# ---------------------------------------------------------------------------- training, once
# The tiny model every training test uses (options a test needs differently it overrides).
TINY_TRAIN = dict(embed_dim=16, word_dim=8, batch_size=16, lr=5e-3, min_word_count=1, workers=0,
                  log_every=1, val_every=0)
QUIET = {"echo": lambda *a, **k: None}


def vse(*args):
    """`vse ARGS` in this process (click's runner); arguments may be paths or numbers."""
    from click.testing import CliRunner

    from cli.main import cli

    return CliRunner().invoke(cli, [str(a) for a in args])


def extract_tiny(root, out, *extra):
    """`vse extract` of a Flickr8k-layout folder with the tiny backbone (torch engine, one process)."""
    result = vse("extract", "--dataset", "flickr8k", "--root", root, "--backbone", "tiny", "--out", out,
                 "--workers", 0, "--device", "cpu", "--engine", "torch", "--quiet", *extra)
    assert result.exit_code == 0, result.output
    return out


def train_tiny(cache, run, *extra, loss: str = "sh", epochs: int = 1):
    """`vse train` of a tiny run (16-d) on ``cache``; its best.pt."""
    result = vse("train", "--features", cache, "--run-dir", run, "--loss", loss, "--epochs", epochs,
                 "--embed-dim", 16, "--word-dim", 8, "--batch-size", 8, "--min-word-count", 1,
                 "--val-every", 0, "--workers", 0, "--device", "cpu", *extra)
    assert result.exit_code == 0, result.output
    return Path(run) / "best.pt"


def train(features, run_dir, *extra):
    """`vse train` of a tiny VSE0 run, one epoch."""
    return vse("train", "--features", features, "--run-dir", run_dir, "--loss", "sh", "--epochs", 1,
               "--embed-dim", 8, "--word-dim", 8, "--batch-size", 8, "--min-word-count", 1,
               "--val-every", 0, "--workers", 0, "--device", "cpu", *extra)


def train_run(cache, run_dir, **options):
    """A finished tiny run (``TINY_TRAIN`` and ``options``) in ``run_dir``."""
    from pipeline.core.config import TrainConfig
    from pipeline.training.build import build_trainer

    config = TrainConfig(features=str(cache), run_dir=str(run_dir), **{**TINY_TRAIN, **options})
    build_trainer(config, **QUIET).fit()
    return run_dir


@pytest.fixture(scope="session")
def sh_run(tiny_cache, tmp_path_factory) -> Path:
    """One finished run shared by every test that only reads one: `vse train` of VSE0 on the tiny
    cache, one epoch, --deterministic (a no-op on a CPU; recorded in its config)."""
    run = tmp_path_factory.mktemp("sh_run") / "run"
    result = train(tiny_cache, run, "--deterministic")
    assert result.exit_code == 0, result.output
    return run


@pytest.fixture(scope="session")
def sh_and_mh_runs(tiny_cache, tmp_path_factory) -> Path:
    """RUNS/sh and RUNS/mh (2 epochs, validated every 3 iterations, mh with 4 negatives): two
    runs to compare, report and plot."""
    root = tmp_path_factory.mktemp("two_runs") / "runs"
    train_run(tiny_cache, root / "sh", loss="sh", epochs=2, val_every=3)
    train_run(tiny_cache, root / "mh", loss="mh", epochs=2, val_every=3,
              loss_options={"negative_set_size": 4})
    return root
