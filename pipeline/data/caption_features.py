"""Cached caption features (`vse encode-text`): one frozen vector per caption of a feature
cache (layout ``vectors``), or the set of its token vectors (layout ``tokens``, ``--tokens``).

Layout (docs/ARCHITECTURE.md, "Caption-feature file"):

    <out>                       combined file, written last and atomically
      vectors   (M, d) float32  unit rows, in the feature cache's caption order   (layout vectors)
      tokens    (T, d) float16  every caption's token vectors, caption after      (layout tokens)
      offsets   (M+1,) int64    caption j's tokens are rows offsets[j]:offsets[j+1] (layout tokens)
      attrs: format="vse-caption-features", format_version=1, layout, complete, model
             (minilm | cbow), model_identity (JSON), caption_fingerprint, features_file,
             num_captions, dim, counts (JSON), device_type, created, vse_version; layout tokens
             also tokens (what a token vector is), num_tokens, max_tokens, mean_tokens
    <out>.parts/part-00000.h5  captions [start, stop), each written atomically with the
                                fingerprint of the run's configuration

A killed run restarted with the same command reuses the parts already written (a part of
another configuration is recomputed); the parts are removed once the combined file exists.
A file without ``layout`` (made before token files existed) is a ``vectors`` file.
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
import torch

from pipeline import __version__
from pipeline.core import runtime
from pipeline.core.errors import VseError
from pipeline.core.formats import CAPTION_FEATURES
from pipeline.core.fsutil import atomic_h5
from pipeline.data.cache import FeatureCache, check_caption_fingerprint
from pipeline.data.caption_index import caption_fingerprint

FORMAT = CAPTION_FEATURES.tag
DEFAULT_PART_SIZE = 4096  # captions per part: the work a killed run can lose
LAYOUTS = ("vectors", "tokens")
TOKEN_DTYPE = np.float16  # token vectors on disk and in memory (half the bytes; float32 batches)
_HOLDS = {"vectors": "one vector per caption (layout 'vectors', `vse encode-text` without --tokens)",
          "tokens": "token vectors per caption (layout 'tokens', `vse encode-text --tokens`)"}
_FINITE_BLOCK = 1 << 20  # token rows checked for NaN / Inf at a time (bounds the temporary mask)


def parts_dir(out) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".parts")


def caption_features_layout(path) -> str:
    """The layout of caption-feature file ``path``: "vectors" (one vector per caption, read by
    ``CaptionFeatures``) or "tokens" (a set of token vectors per caption, read by
    ``CaptionTokenFeatures``); a file that is neither is refused in one line."""
    return _CaptionFeatureFile(path).layout


class _CaptionFeatureFile:
    """The checks every caption-feature file passes on open (attributes only, no arrays);
    a subclass takes only its ``expected`` layout."""

    expected: str | None = None  # None: either layout

    def __init__(self, path):
        self.path = Path(path)
        with CAPTION_FEATURES.open(self.path) as f:  # found, HDF5, this format and version, complete
            try:
                self.attrs = {k: _plain(v) for k, v in f.attrs.items()}
                self._shapes = {k: f[k].shape for k in ("vectors", "tokens", "offsets")
                                if isinstance(f.get(k), h5py.Dataset)}
            except OSError as exc:
                reason = str(exc).splitlines()[0][:120]
                raise VseError(f"cannot read caption features ({reason})", self.path) from exc
        self.layout = str(self.attrs.get("layout", "vectors"))
        if self.layout not in LAYOUTS:
            raise VseError(f"unknown caption-feature layout {self.layout!r} (this vse reads "
                           f"{', '.join(LAYOUTS)})", self.path)
        if self.expected and self.layout != self.expected:
            raise VseError(f"holds {_HOLDS[self.layout]}, but {_HOLDS[self.expected]} are needed here",
                           self.path)
        needed = ("vectors",) if self.layout == "vectors" else ("tokens", "offsets")
        if any(k not in self._shapes for k in needed):
            raise VseError(f"caption-feature file is not complete (no {', '.join(needed)})", self.path)
        self.model = str(self.attrs["model"])
        self.model_identity = json.loads(self.attrs["model_identity"])
        self.caption_fingerprint = str(self.attrs["caption_fingerprint"])

    def entry(self) -> dict:
        """What a checkpoint records about the caption features it was trained on."""
        return {"path": str(self.path), "caption_fingerprint": self.caption_fingerprint,
                "model": self.model, "model_identity": json.dumps(self.model_identity, sort_keys=True)}


class CaptionFeatures(_CaptionFeatureFile):
    """A validated caption-feature file of one vector per caption; ``vectors()`` reads the
    whole (M, d) array. A token file is refused (``CaptionTokenFeatures`` reads those)."""

    expected = "vectors"

    def __init__(self, path):
        super().__init__(path)
        shape = self._shapes["vectors"]
        if len(shape) != 2 or shape[0] != self.attrs.get("num_captions"):
            raise VseError(f"inconsistent caption-feature file: vectors of shape {shape} for "
                           f"{self.attrs.get('num_captions')} captions", self.path)
        self.num_captions, self.dim = int(shape[0]), int(shape[1])

    def vectors(self) -> np.ndarray:
        with h5py.File(self.path, "r") as f:
            vectors = np.asarray(f["vectors"][()], dtype=np.float32)
        if not np.isfinite(vectors).all():
            raise VseError("caption vectors hold NaN or Inf", self.path)
        return vectors


class CaptionTokenFeatures(_CaptionFeatureFile):
    """A validated token file (`vse encode-text --tokens`), read whole into memory on open:
    caption j's token vectors are rows ``offsets[j]:offsets[j+1]`` of ``tokens`` (float16).

    ``batch(caption_ids)`` gathers a padded float32 batch and its lengths with index
    arithmetic (no loop over the captions). With ``captions`` (the feature cache's, in
    order), a file made for other captions is refused on open. A file of one vector per
    caption is refused (``CaptionFeatures`` reads those)."""

    expected = "tokens"

    def __init__(self, path, captions=None, cache_path=None):
        super().__init__(path)
        (num_tokens, *rest), offsets_shape = self._shapes["tokens"], self._shapes["offsets"]
        num_captions = self.attrs.get("num_captions")
        if (not isinstance(num_captions, int) or len(rest) != 1
                or offsets_shape != (num_captions + 1,) or self.attrs.get("num_tokens") != num_tokens):
            raise VseError(f"inconsistent caption-feature file: tokens of shape {(num_tokens, *rest)} and "
                           f"offsets of shape {offsets_shape} for {num_captions} captions", self.path)
        if captions is not None:
            check_caption_fingerprint(caption_fingerprint(captions), self.attrs, self.path,
                                      "caption-feature file", cache_path or "the feature cache")
        self.num_captions, self.num_tokens, self.dim = int(num_captions), int(num_tokens), int(rest[0])
        with h5py.File(self.path, "r") as f:
            if f["tokens"].dtype != TOKEN_DTYPE or f["offsets"].dtype.kind not in "iu":
                raise VseError(f"inconsistent caption-feature file: tokens of type {f['tokens'].dtype}, "
                               f"offsets of type {f['offsets'].dtype} (expected float16, integers)",
                               self.path)
            tokens = f["tokens"][()]
            offsets = np.asarray(f["offsets"][()], dtype=np.int64)
        lengths = np.diff(offsets)
        if offsets[0] != 0 or offsets[-1] != self.num_tokens or (lengths < 1).any():
            raise VseError("inconsistent caption-feature file: offsets must rise from 0 to "
                           f"{self.num_tokens} by at least 1 per caption", self.path)
        for start in range(0, self.num_tokens, _FINITE_BLOCK):
            if not np.isfinite(tokens[start:start + _FINITE_BLOCK]).all():
                raise VseError("token vectors hold NaN or Inf", self.path)
        self.tokens, self.offsets, self.lengths = tokens, offsets, lengths

    def batch(self, caption_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """Token vectors of these captions: (B, T, d) float32, T the longest of them, zero past
        each caption's end; and lengths (B,) int64. CPU tensors."""
        ids = np.asarray(caption_ids, dtype=np.int64).reshape(-1)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.num_captions):
            raise IndexError(f"caption ids outside 0..{self.num_captions - 1}")
        return padded_token_sets(self.tokens, self.offsets, ids)

    def entry(self) -> dict:
        return {**super().entry(), "layout": self.layout}


def padded_token_sets(tokens: np.ndarray, offsets: np.ndarray, ids: np.ndarray) -> tuple[torch.Tensor, ...]:
    """Captions ``ids`` of a flat token array (caption j: rows ``offsets[j]:offsets[j+1]``) as
    a (B, T, d) float32 batch, zero past each end, and their lengths (B,) int64, by index
    arithmetic (no loop over the captions)."""
    starts = offsets[ids]
    lengths = offsets[ids + 1] - starts
    positions = np.arange(int(lengths.max(initial=0)))
    valid = positions < lengths[:, None]
    out = np.zeros((*valid.shape, tokens.shape[1]), dtype=np.float32)
    # only the valid rows are gathered and widened (numpy's float16 → float32 is several
    # times torch's on a CPU): 1.6 ms for 128 captions of Flickr8k (README)
    out[valid] = tokens[(starts[:, None] + positions)[valid]]
    return torch.from_numpy(out), torch.from_numpy(lengths)


def _plain(value):
    """An HDF5 attribute as a Python value (str, int, float, bool), so messages read plainly."""
    if isinstance(value, bytes):
        return value.decode()
    return value.item() if isinstance(value, np.generic) else value


def describe(path) -> list[str]:
    """What a caption-feature file holds, in a few lines (attributes only; `vse info`-like)."""
    file = _CaptionFeatureFile(path)
    a = file.attrs
    lines = [f"{file.path}: {a['num_captions']} captions, layout {file.layout}, model {file.model} "
             f"({file.model_identity.get('model') or file.model_identity.get('word_vectors')})",
             f"  caption_fingerprint: {file.caption_fingerprint} (features_file {a.get('features_file')})"]
    if file.layout == "tokens":
        lines += [f"  tokens: {a['num_tokens']} x {a['dim']} float16; per caption mean "
                  f"{a['mean_tokens']:.2f}, max {a['max_tokens']}",
                  f"  a token vector: {a['tokens']}"]
    else:
        lines.append(f"  vectors: {a['num_captions']} x {a['dim']} float32 unit rows")
    lines.append(f"  size: {file.path.stat().st_size / 1e6:.1f} MB, made {a.get('created')} "
                 f"on {a.get('device_type')} by vse {a.get('vse_version')}")
    return lines


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
    layout: str = "vectors"


def encode_text(features, model: str, out, *, tokens: bool = False, device="auto", batch_size: int = 256,
                part_size: int = DEFAULT_PART_SIZE, progress: bool = False) -> EncodeTextResult:
    """Vectors of every caption of the feature cache ``features`` by caption encoder ``model``:
    one unit vector per caption, or with ``tokens`` every caption's token vectors
    (``relevance.encoders.TOKEN_DEFINITIONS``)."""
    from pipeline.core.progress import progress_bar
    from pipeline.text import encoders

    features, out = Path(features), Path(out)
    layout = "tokens" if tokens else "vectors"
    if batch_size < 1 or part_size < 1:
        raise VseError(f"--batch-size and --part-size must be at least 1, not {batch_size}, {part_size}")
    if out.resolve() == features.resolve():
        raise VseError("--out would overwrite the feature cache", out)
    with FeatureCache(features) as cache:
        captions = cache.captions
    if not captions:
        raise VseError("feature cache has no captions", features)
    identity = encoders.encoder_identity(model)
    device_type = runtime.resolve_device(device).type  # (GPU parts are float16 inside: never mixed)
    fingerprint = caption_fingerprint(captions)
    config = {"model": model, "model_identity": identity, "caption_fingerprint": fingerprint,
              "part_size": part_size, "device_type": device_type}
    if tokens:  # (a vectors file keeps the digest it had before token files existed)
        config.update(layout=layout, tokens=encoders.TOKEN_DEFINITIONS[model],
                      token_dtype=np.dtype(TOKEN_DTYPE).name)
    config_digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    bounds = [(a, min(a + part_size, len(captions))) for a in range(0, len(captions), part_size)]
    result = EncodeTextResult(out, model, len(captions), 0, len(bounds), 0, layout=layout)
    if _existing_is_current(out, config_digest, layout):
        existing = _CaptionFeatureFile(out)
        result.dim, result.parts, result.up_to_date = int(existing.attrs["dim"]), 0, True
        result.counts = json.loads(existing.attrs.get("counts", "{}"))
        return result

    folder = parts_dir(out)
    todo = [i for i, b in enumerate(bounds) if not _part_is_complete(folder, i, b, config_digest, layout)]
    done = sum(b - a for i, (a, b) in enumerate(bounds) if i not in set(todo))
    with progress_bar(total=len(captions), initial=done, unit="caption", desc=f"encode-text {model}",
                      disable=not progress) as bar:
        for i in todo:
            start, stop = bounds[i]
            if tokens:
                encoded = encoders.encode_caption_tokens(captions[start:stop], model, device, batch_size)
                data = {"tokens": encoded.tokens.astype(TOKEN_DTYPE), "lengths": encoded.lengths}
            else:
                encoded = encoders.encode_captions(captions[start:stop], model, device, batch_size)
                data = {"vectors": encoded.vectors}
            with atomic_h5(_part_path(folder, i)) as f:
                for name, array in data.items():
                    f.create_dataset(name, data=array)
                f.attrs.update({"start": start, "stop": stop, "config_fingerprint": config_digest,
                                "counts": json.dumps(encoded.counts), "complete": True})
            result.parts_computed += 1
            bar.update(stop - start)

    counts: dict[str, int] = {}
    for i in range(len(bounds)):
        with h5py.File(_part_path(folder, i), "r") as f:
            for key, value in json.loads(f.attrs["counts"]).items():
                counts[key] = counts.get(key, 0) + int(value)
    attrs = {**CAPTION_FEATURES.stamp(), "layout": layout, "model": model,
             "model_identity": json.dumps(identity, sort_keys=True), "caption_fingerprint": fingerprint,
             "features_file": str(features), "num_captions": len(captions),
             "counts": json.dumps(counts), "device_type": device_type, "config_fingerprint": config_digest,
             "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "vse_version": __version__, "complete": True}
    write = _write_tokens if tokens else _write_vectors
    with atomic_h5(out) as f:
        attrs.update(write(f, [_part_path(folder, i) for i in range(len(bounds))]))
        if tokens:
            attrs["tokens"] = encoders.TOKEN_DEFINITIONS[model]
        f.attrs.update(attrs)
    shutil.rmtree(folder, ignore_errors=True)
    result.dim, result.counts = attrs["dim"], counts
    return result


def _write_vectors(f: h5py.File, parts: list[Path]) -> dict:
    pieces = []
    for path in parts:
        with h5py.File(path, "r") as part:
            pieces.append(np.asarray(part["vectors"][()], dtype=np.float32))
    vectors = np.concatenate(pieces)
    f.create_dataset("vectors", data=vectors)
    return {"dim": int(vectors.shape[1])}


def _write_tokens(f: h5py.File, parts: list[Path]) -> dict:
    """``tokens`` filled part by part (one part in memory beside the file being built) and
    ``offsets``; the attributes that describe them."""
    lengths, dim = [], None
    for path in parts:
        with h5py.File(path, "r") as part:
            lengths.append(np.asarray(part["lengths"][()], dtype=np.int64))
            dim = part["tokens"].shape[1]
    lengths = np.concatenate(lengths)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = f.create_dataset("tokens", shape=(int(offsets[-1]), dim), dtype=TOKEN_DTYPE)
    at = 0
    for path in parts:
        with h5py.File(path, "r") as part:
            block = part["tokens"][()]
        tokens[at:at + len(block)] = block
        at += len(block)
    f.create_dataset("offsets", data=offsets)
    return {"dim": int(dim), "num_tokens": int(offsets[-1]), "max_tokens": int(lengths.max()),
            "mean_tokens": float(lengths.mean())}


def _existing_is_current(out: Path, config_digest: str, layout: str) -> bool:
    """True when ``out`` already holds this configuration's result. A file at ``out`` that
    `vse encode-text` did not make is refused (never overwritten), and so is one of the other
    layout (a run's --text-features may name it)."""
    if not out.exists():
        return False
    try:
        with h5py.File(out, "r") as f:
            made_here = f.attrs.get("format") == FORMAT
            found = f.attrs.get("layout", "vectors")
            found = found.decode() if isinstance(found, bytes) else found
            needed = "vectors" if layout == "vectors" else "offsets"
            current = made_here and f.attrs.get("config_fingerprint") == config_digest and needed in f
    except OSError:
        made_here = current = False
    if not made_here:
        raise VseError("--out exists and is not a caption-feature file; refusing to overwrite it", out)
    if found != layout:
        raise VseError(f"--out holds {_HOLDS[found]}; refusing to replace it with {_HOLDS[layout]}: "
                       "choose another --out", out)
    return bool(current)


def _part_path(folder: Path, i: int) -> Path:
    return folder / f"part-{i:05d}.h5"


def _part_is_complete(folder: Path, i: int, bounds: tuple[int, int], config_digest: str,
                      layout: str) -> bool:
    try:
        with h5py.File(_part_path(folder, i), "r") as f:
            if not (bool(f.attrs.get("complete")) and f.attrs.get("config_fingerprint") == config_digest
                    and (int(f.attrs["start"]), int(f.attrs["stop"])) == bounds):
                return False
            if layout == "vectors":
                return f["vectors"].shape[0] == bounds[1] - bounds[0]
            return (f["lengths"].shape == (bounds[1] - bounds[0],)
                    and f["tokens"].shape[0] == int(np.sum(f["lengths"][()])))
    except (OSError, KeyError):
        return False
