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
    from pipeline.cache import write_cache

    n = len(features)
    image_ids = image_ids or [f"img{i}" for i in range(n)]
    return write_cache(path, np.asarray(features, dtype=np.float32), image_ids, captions,
                       np.asarray(caption_image), splits, attrs={"backbone": "synthetic", **attrs})


def learnable_features(captions, caption_image, num_images, dim=32, seed=0, noise=0.1):
    """Image features = a fixed random projection of the words of the image's captions + noise,
    so a tiny model can learn the pairing in a few epochs."""
    from pipeline.text import tokenize

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
