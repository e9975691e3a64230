"""Cached caption features: one frozen vector per caption of a feature cache (`vse encode-text`).

Layout (docs/ARCHITECTURE.md, "Caption-feature file"):

    <out>                       combined file, written last and atomically
      vectors   (M, d) float32  unit rows, in the feature cache's caption order
      attrs: format="vse-caption-features", format_version=1, complete, model (minilm | cbow),
             model_identity (JSON), caption_fingerprint, features_file, num_captions, dim,
             counts (JSON), device_type, created, vse_version
    <out>.parts/part-00000.h5  rows [start, stop), each written atomically with the
                                fingerprint of the run's configuration

A killed run restarted with the same command reuses the parts already written (a part of
another configuration is recomputed); the parts are removed once the combined file exists.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import h5py
import numpy as np

from . import __version__, runtime
from .cache import FeatureCache
from .errors import VseError
from .fsutil import atomic_h5
from .index import caption_fingerprint

FORMAT = "vse-caption-features"
FORMAT_VERSION = 1
DEFAULT_PART_SIZE = 4096  # captions per part: the work a killed run can lose


def parts_dir(out) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".parts")


class CaptionFeatures:
    """A validated caption-feature file; ``vectors()`` reads the whole (M, d) array."""

    def __init__(self, path):
        self.path = Path(path)
        if not self.path.is_file():
            raise VseError("caption-feature file not found (made by `vse encode-text`)", self.path)
        try:
            with h5py.File(self.path, "r") as f:
                self.attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
                shape = f["vectors"].shape if "vectors" in f else None
        except OSError as exc:
            reason = str(exc).splitlines()[0][:120]
            raise VseError(f"cannot read caption features ({reason})", self.path) from exc
        if self.attrs.get("format") != FORMAT:
            raise VseError(f"not a caption-feature file (format attribute {self.attrs.get('format')!r}; "
                           "`vse encode-text` makes them)", self.path)
        if self.attrs.get("format_version") != FORMAT_VERSION:
            raise VseError(f"unsupported format_version {self.attrs.get('format_version')!r} "
                           f"(this vse reads {FORMAT_VERSION})", self.path)
        if not self.attrs.get("complete") or shape is None:
            raise VseError("caption-feature file is not complete", self.path)
        if len(shape) != 2 or shape[0] != self.attrs.get("num_captions"):
            raise VseError(f"inconsistent caption-feature file: vectors of shape {shape} for "
                           f"{self.attrs.get('num_captions')} captions", self.path)
        self.num_captions, self.dim = int(shape[0]), int(shape[1])
        self.model = str(self.attrs["model"])
        self.model_identity = json.loads(self.attrs["model_identity"])
        self.caption_fingerprint = str(self.attrs["caption_fingerprint"])

    def vectors(self) -> np.ndarray:
        with h5py.File(self.path, "r") as f:
            vectors = np.asarray(f["vectors"][()], dtype=np.float32)
        if not np.isfinite(vectors).all():
            raise VseError("caption vectors hold NaN or Inf", self.path)
        return vectors

    def entry(self) -> dict:
        """What a checkpoint records about the caption features it was trained on."""
        return {"path": str(self.path), "caption_fingerprint": self.caption_fingerprint,
                "model": self.model, "model_identity": json.dumps(self.model_identity, sort_keys=True)}


@dataclass
class EncodeTextResult:
    out: Path
    model: str
    num_captions: int
    dim: int
    parts: int
    parts_computed: int
    counts: dict = field(default_factory=dict)
    up_to_date: bool = False


def encode_text(features, model: str, out, *, device="auto", batch_size: int = 256,
                part_size: int = DEFAULT_PART_SIZE, progress: bool = False) -> EncodeTextResult:
    """Vectors of every caption of the feature cache ``features`` by caption encoder ``model``."""
    from tqdm import tqdm

    from .relevance.encoders import encode_captions, encoder_identity

    features, out = Path(features), Path(out)
    if batch_size < 1 or part_size < 1:
        raise VseError(f"--batch-size and --part-size must be at least 1, not {batch_size}, {part_size}")
    if out.resolve() == features.resolve():
        raise VseError("--out would overwrite the feature cache", out)
    with FeatureCache(features) as cache:
        captions = cache.captions
    if not captions:
        raise VseError("feature cache has no captions", features)
    identity = encoder_identity(model)
    device_type = runtime.resolve_device(device).type  # (GPU parts are float16 inside: never mixed)
    fingerprint = caption_fingerprint(captions)
    config = {"model": model, "model_identity": identity, "caption_fingerprint": fingerprint,
              "part_size": part_size, "device_type": device_type}
    config_digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    bounds = [(a, min(a + part_size, len(captions))) for a in range(0, len(captions), part_size)]
    result = EncodeTextResult(out, model, len(captions), 0, len(bounds), 0)
    if _existing_is_current(out, config_digest):
        existing = CaptionFeatures(out)
        result.dim, result.parts, result.up_to_date = existing.dim, 0, True
        result.counts = json.loads(existing.attrs.get("counts", "{}"))
        return result

    folder = parts_dir(out)
    todo = [i for i, b in enumerate(bounds) if not _part_is_complete(folder, i, b, config_digest)]
    counts: dict[str, int] = {}
    done = sum(b - a for i, (a, b) in enumerate(bounds) if i not in set(todo))
    with tqdm(total=len(captions), initial=done, unit="caption", desc=f"encode-text {model}",
              disable=not progress, dynamic_ncols=True) as bar:
        for i in todo:
            start, stop = bounds[i]
            encoded = encode_captions(captions[start:stop], model, device, batch_size)
            with atomic_h5(_part_path(folder, i)) as f:
                f.create_dataset("vectors", data=encoded.vectors)
                f.attrs.update({"start": start, "stop": stop, "config_fingerprint": config_digest,
                                "counts": json.dumps(encoded.counts), "complete": True})
            result.parts_computed += 1
            bar.update(stop - start)

    pieces = []
    for i in range(len(bounds)):
        with h5py.File(_part_path(folder, i), "r") as f:
            pieces.append(np.asarray(f["vectors"][()], dtype=np.float32))
            for key, value in json.loads(f.attrs["counts"]).items():
                counts[key] = counts.get(key, 0) + int(value)
    vectors = np.concatenate(pieces)
    attrs = {"format": FORMAT, "format_version": FORMAT_VERSION, "model": model,
             "model_identity": json.dumps(identity, sort_keys=True), "caption_fingerprint": fingerprint,
             "features_file": str(features), "num_captions": len(captions), "dim": int(vectors.shape[1]),
             "counts": json.dumps(counts), "device_type": device_type, "config_fingerprint": config_digest,
             "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "vse_version": __version__, "complete": True}
    with atomic_h5(out) as f:
        f.create_dataset("vectors", data=vectors)
        f.attrs.update(attrs)
    shutil.rmtree(folder, ignore_errors=True)
    result.dim, result.counts = int(vectors.shape[1]), counts
    return result


def _existing_is_current(out: Path, config_digest: str) -> bool:
    """True when ``out`` already holds this configuration's result. A file at ``out`` that
    `vse encode-text` did not make is refused (never overwritten)."""
    if not out.exists():
        return False
    try:
        with h5py.File(out, "r") as f:
            made_here = f.attrs.get("format") == FORMAT
            current = made_here and f.attrs.get("config_fingerprint") == config_digest and "vectors" in f
    except OSError:
        made_here = current = False
    if not made_here:
        raise VseError("--out exists and is not a caption-feature file; refusing to overwrite it", out)
    return bool(current)


def _part_path(folder: Path, i: int) -> Path:
    return folder / f"part-{i:05d}.h5"


def _part_is_complete(folder: Path, i: int, bounds: tuple[int, int], config_digest: str) -> bool:
    try:
        with h5py.File(_part_path(folder, i), "r") as f:
            return (bool(f.attrs.get("complete")) and f.attrs.get("config_fingerprint") == config_digest
                    and (int(f.attrs["start"]), int(f.attrs["stop"])) == bounds
                    and f["vectors"].shape[0] == bounds[1] - bounds[0])
    except (OSError, KeyError):
        return False
