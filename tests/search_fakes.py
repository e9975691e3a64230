"""Stand-ins for the search tests until `vse embed` (pipeline/search/embed.py) is merged:

- ``write_embeddings``: an embeddings file exactly as `vse embed` is to write it (groups
  images and captions, their attributes; docs/ARCHITECTURE.md "Search index"), with h5py;
- ``StandInEmbedder``: the ``Embedder`` interface with random unit vectors keyed by the text
  (or the image's pixels), the same vector for the same input every time;
- ``demo_embeddings``: real demo images and captions whose image vectors are the stand-in's
  vectors of their first caption, so searching that caption finds the image with score 1.

The bench (bench/search.py) uses the stand-in too, for the service's load test.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEMO_IMAGES = ROOT / "data" / "images"
DEMO_TOKENS = ROOT / "data" / "Flickr8k.token.txt"


def unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


class StandInEmbedder:
    """What `pipeline.search.embed.Embedder` offers, without a model."""

    def __init__(self, checkpoint_sha256: str, dim: int = 32, similarity: str = "cosine"):
        self.checkpoint_sha256, self.dim, self.similarity = checkpoint_sha256, dim, similarity
        self.calls = 0

    @classmethod
    def for_checkpoint(cls, checkpoint, dim: int = 32) -> StandInEmbedder:
        from pipeline.core.fsutil import file_sha256

        return cls(file_sha256(checkpoint), dim)

    def _vector(self, key: bytes) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "little")
        return np.random.default_rng(seed).standard_normal(self.dim)

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        return unit_rows(np.stack([self._vector(b"text:" + t.encode()) for t in texts]))

    def embed_images(self, images: list) -> np.ndarray:
        from PIL import Image

        self.calls += 1
        rows = []
        for image in images:
            if not isinstance(image, Image.Image):
                image = Image.open(image)
            rows.append(self._vector(b"image:" + image.convert("RGB").tobytes()))
        return unit_rows(np.stack(rows))


def write_embeddings(path, *, checkpoint_sha256: str, images=None, captions=None, checkpoint="model.pt",
                     similarity="cosine", failed=(), complete=True, dim=None, **attrs) -> Path:
    """``images`` = (vectors, ids, paths), ``captions`` = (vectors, ids, texts); either may be None."""
    import h5py

    text = h5py.string_dtype("utf-8")
    groups = {"images": (images, "paths"), "captions": (captions, "texts")}
    vectors = next(np.asarray(g[0]) for g, _ in groups.values() if g is not None)
    with h5py.File(path, "w") as f:
        for name, (group, field) in groups.items():
            if group is None:
                continue
            vecs, ids, shown = group
            g = f.create_group(name)
            g.create_dataset("vectors", data=np.asarray(vecs, dtype=np.float32))
            g.create_dataset("ids", data=list(ids), dtype=text)
            g.create_dataset(field, data=list(shown), dtype=text)
            if name == "images":
                g.create_dataset("failed", data=list(failed), dtype=text)
        f.attrs.update({
            "format": "vse-embeddings", "format_version": 1, "checkpoint_sha256": checkpoint_sha256,
            "checkpoint": str(checkpoint), "similarity": similarity,
            "dim": int(vectors.shape[1] if dim is None else dim),
            "image_pipeline": json.dumps({"backbone": "stand-in", "crops": 1, "image_size": 224}),
            "caption_encoder": json.dumps({"kind": "stand-in"}), "created": "2026-01-01T00:00:00+00:00",
            "vse_version": "test", **attrs})
        f.attrs["complete"] = bool(complete)  # last, as `vse embed` does
    return Path(path)


def demo_items(n: int) -> tuple[list[str], list[list[str]]]:
    """The first ``n`` demo images (file names) and their captions."""
    rows: dict[str, list[str]] = {}
    for line in DEMO_TOKENS.read_text(encoding="utf-8").splitlines():
        key, caption = line.split("\t", 1)
        rows.setdefault(key.split("#")[0], []).append(caption)
    names = sorted(name for name in rows if (DEMO_IMAGES / name).is_file())[:n]
    return names, [rows[name] for name in names]


def demo_embeddings(path, checkpoint, n: int = 12, dim: int = 32, **kwargs) -> tuple[Path, StandInEmbedder]:
    """An embeddings file of ``n`` real demo images (paths relative to data/images) and their
    captions, made for ``checkpoint`` (any file: its sha256 is the model's identity)."""
    embedder = StandInEmbedder.for_checkpoint(checkpoint, dim)
    names, captions = demo_items(n)
    image_vectors = embedder.embed_texts([c[0] for c in captions])
    texts = [c for cs in captions for c in cs]
    caption_ids = [f"{name}#{i}" for name, cs in zip(names, captions) for i in range(len(cs))]
    write_embeddings(path, checkpoint_sha256=embedder.checkpoint_sha256, checkpoint=checkpoint,
                     images=(image_vectors, names, names),
                     captions=(embedder.embed_texts(texts), caption_ids, texts), **kwargs)
    return Path(path), embedder


def png_bytes(size=(64, 48), color=(200, 30, 30)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def clustered_unit_vectors(n: int, dim: int, seed: int = 0, clusters: int = 20) -> np.ndarray:
    """Unit vectors with neighbours: a mixture of ``clusters`` Gaussian blobs."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim))
    return unit_rows(centres[rng.integers(clusters, size=n)] + 0.6 * rng.standard_normal((n, dim)))
