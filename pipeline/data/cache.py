"""The HDF5 feature cache: sharded writing (resumable), validated reading.

Layout (docs/ARCHITECTURE.md, "Feature cache"):

    <out>                        combined file, written last and atomically
      features      (N, D) float32 virtual dataset over the shards (relative paths, so the
                    folder can be moved; rows no shard covers read as NaN)
      image_ids, captions (utf-8), caption_image (int64), splits/<name> (int64),
      bad_images    (k,) int64 rows whose image could not be read (stored as zeros)
    <out>.shards/shard-00000.h5  rows [start, stop); attrs complete, start, stop and the
                                 fingerprint of the run's configuration

A shard is reused only when it is complete, has the expected rows and carries the same
configuration fingerprint, so a shard from a different run is never mixed in.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import h5py
import numpy as np

from pipeline import __version__
from pipeline.core.errors import VseError
from pipeline.core.formats import FEATURES
from pipeline.core.fsutil import atomic_h5, guard_output, sampled_sha256
from pipeline.data.caption_index import CaptionIndex, IndexedRows, caption_fingerprint

FORMAT = FEATURES.tag
SHARD_FORMAT = "vse-features-shard"
# The attributes of a cache `vse extract` made that say how an image became its features:
# checkpoints keep them ("image_pipeline"), and `vse embed` rebuilds that pipeline from them.
IMAGE_PIPELINE_ATTRS = ("backbone", "weights_sha256", "weights_file", "crops", "image_size", "resize",
                        "resize_mode", "interpolation", "mean", "std", "engine", "precision", "grid",
                        "input_scale")
SET_DTYPE = np.float16  # members of a set are stored in half precision (a 7×7 Lite0 grid: 125 kB)
DEFAULT_SHARD_SIZE = 1000
_STRING = h5py.string_dtype("utf-8")
_READ_BLOCK_BYTES = 8192 * 1280 * 4  # a dense read's block: 8,192 Lite0 vectors
_SPARE_FILES = 256  # beyond the shards: libraries, DataLoader pipes, outputs


def config_fingerprint(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def check_caption_fingerprint(expected: str, found_attrs, path, what: str, made_for) -> None:
    """Refuse ``path`` (a ``what``, e.g. "relevance file", whose attributes are
    ``found_attrs``) unless its ``caption_fingerprint`` is ``expected``, the fingerprint of
    the captions of ``made_for`` (the file whose captions it must follow). A file without
    the attribute was made by an older vse and is refused too: it cannot be checked, and a
    file built for another caption list of the same length would be used silently."""
    found = found_attrs.get("caption_fingerprint")
    if isinstance(found, bytes):
        found = found.decode("utf-8", "replace")
    if found == expected:
        return
    if not found:
        raise VseError(f"{what} has no caption fingerprint (made by an older vse), so it cannot be "
                       f"checked against the captions of {made_for}; rebuild it from {made_for}", path)
    source = found_attrs.get("features_file")
    raise VseError(f"{what} was made for other captions{f' (from {source})' if source else ''} than "
                   f"those of {made_for}; rebuild it from {made_for}", path)


def shards_dir(out) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".shards")


def guard_cache_outputs(out, overwrite: bool = False) -> None:
    """Refuse an existing ``out`` or shard file that is not part of a vse feature cache
    (resuming reuses those), unless ``overwrite``; see ``fsutil.guard_output``."""
    FEATURES.guard(out, overwrite)
    shards = shards_dir(out)
    if shards.exists() and not shards.is_dir():
        raise VseError("exists and is not a folder (the cache's shards go there): move it away", shards)
    if shards.is_dir():
        for shard in sorted(shards.glob("shard-*.h5")):
            if not _broken_hdf5(shard):  # a broken shard is recomputed like a missing one
                guard_output(shard, SHARD_FORMAT, "a vse feature shard", overwrite)


def _broken_hdf5(path: Path) -> bool:
    """An HDF5 signature that h5py cannot open: what a shard cut short looks like."""
    try:
        with open(path, "rb") as fh:
            if fh.read(8) != b"\x89HDF\r\n\x1a\n":
                return False
        h5py.File(path, "r").close()
    except OSError:
        return True
    return False


def shard_bounds(num_rows: int, shard_size: int) -> list[tuple[int, int]]:
    if shard_size < 1:
        raise VseError(f"--shard-size must be at least 1, not {shard_size}")
    return [(a, min(a + shard_size, num_rows)) for a in range(0, num_rows, shard_size)]


class ShardedWriter:
    """Writes the shards of one cache (in any order, from any rank) and then the combined file."""

    def __init__(self, out, num_rows: int, feature_dim: int, shard_size: int, config: dict,
                 overwrite: bool = False, set_size: int | None = None):
        """``set_size``: K for a cache of sets, (N, K, D) float16, each image's set contiguous;
        None: one float32 vector a row, (N, D)."""
        if num_rows < 1:
            raise VseError("nothing to write: no images selected", out)
        self.out = Path(out)
        guard_cache_outputs(self.out, overwrite)
        self.feature_dim = int(feature_dim)
        self.set_size = None if set_size is None else int(set_size)
        if self.set_size is not None and self.set_size < 1:
            raise VseError(f"a set needs at least one member, not K = {self.set_size}", out)
        self.item_shape = (self.feature_dim,) if self.set_size is None else (self.set_size, self.feature_dim)
        self.dtype = np.dtype(np.float32 if self.set_size is None else SET_DTYPE)
        self.shard_size = int(shard_size)
        self.bounds = shard_bounds(num_rows, shard_size)
        self.config = dict(config)
        self.fingerprint = config_fingerprint(self.config)

    @property
    def num_rows(self) -> int:
        return self.bounds[-1][1]

    def shard_path(self, index: int) -> Path:
        return shards_dir(self.out) / f"shard-{index:05d}.h5"

    def is_complete(self, index: int) -> bool:
        start, stop = self.bounds[index]
        try:
            with h5py.File(self.shard_path(index), "r") as f:
                return (bool(f.attrs.get("complete", False))
                        and f.attrs.get("config_fingerprint") == self.fingerprint
                        and int(f.attrs["start"]) == start and int(f.attrs["stop"]) == stop
                        and f["features"].shape == (stop - start, *self.item_shape)
                        and f["features"].dtype == self.dtype)
        except (OSError, KeyError, ValueError):
            return False

    def complete_shard_configs(self):
        """(index, configuration) of every complete shard file present, whatever its run."""
        for i in range(len(self.bounds)):
            try:
                with h5py.File(self.shard_path(i), "r") as f:
                    if f.attrs.get("complete", False):
                        yield i, json.loads(f.attrs["config"])
            except (OSError, KeyError, ValueError):
                continue

    def write_shard(self, index: int, features: np.ndarray, bad_rows=()) -> None:
        """Write shard ``index`` (rows ``bounds[index]``) atomically; ``bad_rows`` are global rows."""
        start, stop = self.bounds[index]
        features = np.asarray(features, dtype=self.dtype)
        if features.shape != (stop - start, *self.item_shape):
            raise ValueError(f"shard {index} needs shape {(stop - start, *self.item_shape)}, "
                             f"got {features.shape}")
        with atomic_h5(self.shard_path(index)) as f:
            # contiguous: an image's set is one run of bytes, and a random batch of 128 rows of a
            # 7×7 grid reads in 4 ms, where HDF5 chunks of one image took 304 ms (README)
            f.create_dataset("features", data=features)
            f.create_dataset("bad_rows", data=np.asarray(bad_rows, dtype=np.int64))
            f.attrs.update(format=SHARD_FORMAT, start=start, stop=stop,
                           config_fingerprint=self.fingerprint,
                           config=json.dumps(self.config, sort_keys=True))
            f.attrs["complete"] = True  # last, once everything above is in the file

    def discard_stale_combined(self) -> None:
        """Remove a combined file from another configuration: its shards are about to change.
        Only a vse feature cache: anything else (allowed by ``overwrite``) stays until the new
        cache replaces it, complete."""
        try:
            with h5py.File(self.out, "r") as f:
                stale = (f.attrs.get("format") == FORMAT
                         and f.attrs.get("config_fingerprint") != self.fingerprint)
        except OSError:  # absent, unreadable or not HDF5
            stale = False
        if stale:
            self.out.unlink(missing_ok=True)

    def finish(self, index: CaptionIndex, attrs: dict) -> Path:
        """Check every shard, write the combined file atomically, remove leftovers."""
        if len(index.image_ids) != self.num_rows:
            raise ValueError(f"{len(index.image_ids)} image ids for {self.num_rows} rows")
        bad_rows = []
        for i in range(len(self.bounds)):
            if not self.is_complete(i):
                raise VseError("shard is missing or incomplete; run the same command again "
                               "to compute it", self.shard_path(i))
            with h5py.File(self.shard_path(i), "r") as f:
                bad_rows.append(f["bad_rows"][()])
        layout = h5py.VirtualLayout((self.num_rows, *self.item_shape), dtype=self.dtype)
        for i, (start, stop) in enumerate(self.bounds):
            relative = f"{shards_dir(self.out).name}/{self.shard_path(i).name}"
            layout[start:stop] = h5py.VirtualSource(relative, "features",
                                                    shape=(stop - start, *self.item_shape))
        with atomic_h5(self.out) as f:
            f.create_virtual_dataset("features", layout, fillvalue=np.nan)
            if self.set_size is not None:
                f.attrs.update(layout="set", set_size=self.set_size)
            _write_index(f, index)
            f.create_dataset("bad_images", data=np.sort(np.concatenate(bad_rows)).astype(np.int64))
            f.attrs.update({k: v for k, v in attrs.items() if v is not None})
            f.attrs.update(**FEATURES.stamp(),
                           feature_dim=self.feature_dim, num_images=self.num_rows,
                           num_captions=len(index.captions),
                           caption_fingerprint=caption_fingerprint(index.captions),
                           shard_size=self.shard_size,
                           num_shards=len(self.bounds), config_fingerprint=self.fingerprint,
                           config=json.dumps(self.config, sort_keys=True),
                           created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                           vse_version=__version__)
            f.attrs["complete"] = True
        self._remove_leftovers()
        return self.out

    def _remove_leftovers(self) -> None:
        """Shards beyond this cache's count (an earlier, larger run) and temp files of killed runs."""
        for path in shards_dir(self.out).iterdir():
            name = path.name
            if name.startswith(".shard-") and name.endswith(".tmp"):
                path.unlink(missing_ok=True)
            elif name.startswith("shard-") and name.endswith(".h5"):
                number = name[len("shard-"):-len(".h5")]
                if number.isdigit() and int(number) >= len(self.bounds):
                    path.unlink(missing_ok=True)


def write_cache(path, features, image_ids, captions, caption_image, splits, attrs=None,
                shard_size: int = DEFAULT_SHARD_SIZE, bad_images=(), overwrite: bool = False) -> Path:
    """Write a complete cache from features already at hand (an array or anything that
    slices rows, e.g. a memory map): the VSE++ precomputed import, tests, synthetic data."""
    attrs = dict(attrs or {})
    num_rows, *item_shape = features.shape
    set_size = item_shape[0] if len(item_shape) == 2 else None  # (N, K, D): a cache of sets
    feature_dim = item_shape[-1]
    config = {"source": "write_cache", "num_rows": int(num_rows), "feature_dim": int(feature_dim),
              **({"set_size": int(set_size)} if set_size is not None else {}),
              "attrs": {k: _plain(v) for k, v in sorted(attrs.items())}}
    writer = ShardedWriter(path, num_rows, feature_dim, shard_size, config, overwrite, set_size=set_size)
    bad_images = np.asarray(bad_images, dtype=np.int64)
    for i, (start, stop) in enumerate(writer.bounds):
        inside = bad_images[(bad_images >= start) & (bad_images < stop)]
        writer.write_shard(i, np.asarray(features[start:stop]), inside)
    return writer.finish(CaptionIndex(image_ids, captions, caption_image, splits, location=path), attrs)


def _write_index(f: h5py.File, index: CaptionIndex) -> None:
    f.create_dataset("image_ids", data=np.array(index.image_ids, dtype=object), dtype=_STRING)
    f.create_dataset("captions", data=np.array(index.captions, dtype=object), dtype=_STRING)
    f.create_dataset("caption_image", data=index.caption_image)
    group = f.create_group("splits", track_order=True)  # keep the order splits were given in
    for name, rows in index.splits.items():
        group.create_dataset(name, data=rows)


def _plain(value):
    """An attribute value as plain Python (lists, str, int, float, bool)."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass(frozen=True)
class RawSegment:
    """Rows of a raw C-order array in a file (a .npy's data after its header)."""

    path: Path
    offset: int
    rows: int


def write_external_cache(path, segments: list[RawSegment], item_shape: tuple, dtype, index: CaptionIndex,
                         attrs: dict, overwrite: bool = False) -> Path:
    """A cache whose features stay where they are: an HDF5 dataset with external storage over
    the raw rows of ``segments`` (in order), so a 33 GB array of precomputed regions is neither
    copied nor loaded whole; reads are preads of the rows asked for. The files are named
    relative to the cache's folder where they can be (the two can move together)."""
    path = Path(path)
    FEATURES.guard(path, overwrite)
    dtype = np.dtype(dtype)
    row_bytes = int(np.prod(item_shape)) * dtype.itemsize
    num_rows = sum(s.rows for s in segments)
    if num_rows != len(index.image_ids):
        raise ValueError(f"{len(index.image_ids)} image ids for {num_rows} rows")
    folder = path.resolve().parent
    external = []
    for segment in segments:
        source = Path(segment.path).resolve()
        try:
            name = os.path.relpath(source, folder)
        except ValueError:  # another drive
            name = str(source)
        external.append((name, segment.offset, segment.rows * row_bytes))
    spans: dict[str, tuple[Path, int, int]] = {}  # per file: the byte range the cache reads of it
    for (name, offset, size), segment in zip(external, segments):
        _, start, stop = spans.get(name, (None, offset, offset + size))
        spans[name] = (Path(segment.path), min(start, offset), max(stop, offset + size))
    # what each file was at import: a changed file is refused when the cache is opened
    identity = {name: _file_identity(source, start, stop - start) for name, (source, start,
                                                                             stop) in spans.items()}
    with atomic_h5(path) as f:
        f.create_dataset("features", shape=(num_rows, *item_shape), dtype=dtype, external=external)
        f.attrs["external_identity"] = json.dumps(identity, sort_keys=True)
        _write_index(f, index)
        f.create_dataset("bad_images", data=np.zeros(0, dtype=np.int64))
        f.attrs.update({k: v for k, v in attrs.items() if v is not None})
        f.attrs.update(**FEATURES.stamp(), feature_dim=int(item_shape[-1]),
                       num_images=num_rows, num_captions=len(index.captions),
                       caption_fingerprint=caption_fingerprint(index.captions),
                       config_fingerprint=config_fingerprint({"external": external, "shape": list(item_shape),
                                                              "dtype": dtype.str}),
                       created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       vse_version=__version__)
        if len(item_shape) == 2:
            f.attrs.update(layout="set", set_size=int(item_shape[0]))
        f.attrs["complete"] = True
    return path


def _file_identity(source: Path, start: int, length: int) -> dict:
    stat = source.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "start": start, "length": length,
            "sample_sha256": sampled_sha256(source, start, length)}


def _check_external_identity(f: h5py.File, folder: Path, path: Path) -> None:
    """Each file an imported cache reads in place must be the one imported: same size and the
    same sampled blocks (``fsutil.sampled_sha256``). A cache imported before vse recorded this
    has nothing to compare."""
    recorded = f.attrs.get("external_identity")
    if recorded is None:
        return
    for name, was in json.loads(recorded).items():
        source = Path(name) if Path(name).is_absolute() else folder / name
        now = source.stat()
        if now.st_size != was["size"] or sampled_sha256(source, was["start"],
                                                        was["length"]) != was["sample_sha256"]:
            when = datetime.fromtimestamp(now.st_mtime_ns / 1e9, timezone.utc).isoformat(timespec="seconds")
            raise VseError(f"changed since the cache {path} was imported (size or content; modified "
                           f"{when}): its features are not the ones imported; import it again", source)


def _open_features(f: h5py.File, path: Path) -> h5py.Dataset:
    """``features``, opened so that the names of raw files it may be stored in (imported
    precomputed regions) are read relative to the cache's folder (HDF5's ``${ORIGIN}``); each
    such file must be there, whole."""
    access = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    access.set_efile_prefix(b"${ORIGIN}")
    dataset = h5py.Dataset(h5py.h5d.open(f.id, b"features", dapl=access))
    folder = Path(f.filename).parent
    for name, offset, size in dataset.external or ():
        source = Path(name) if Path(name).is_absolute() else folder / name
        if not source.is_file():
            raise VseError(f"the features are read from {source}, which is missing (the cache and the "
                           "files it names move together; import them again, it copies nothing)", path)
        if source.stat().st_size < offset + size:
            raise VseError(f"{source} is shorter ({source.stat().st_size} bytes) than the "
                           f"{offset + size} bytes the cache reads from it", path)
    if dataset.external:
        _check_external_identity(f, folder, path)
    return dataset


# ---------------------------------------------------------------------------- reading


def _allow_open_files(num_shards: int, path) -> None:
    """HDF5 keeps every shard a read has touched open until the cache is closed, and reads
    the rows of a shard it cannot open as NaN, silently: so this process must be allowed
    to open them all, twice (the virtual dataset's handle and ``FeatureCache._select``'s).
    Raises the soft limit (``ulimit -n``) when the hard one allows it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * num_shards + _SPARE_FILES
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise VseError(f"the cache has {num_shards} shards but this process may open only {hard} "
                       "files (ulimit -n): raise the limit, or extract again with a larger "
                       "--shard-size", path)
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


@dataclass
class CacheReport:
    """What ``FeatureCache.check`` found; row indices of each kind of suspicious row."""

    num_rows: int
    nan_rows: np.ndarray
    inf_rows: np.ndarray
    zero_rows: np.ndarray
    missing_rows: np.ndarray
    bad_images: np.ndarray
    problems: list[str] = field(init=False)

    def __post_init__(self):
        unexplained_zero = np.setdiff1d(self.zero_rows, self.bad_images)
        self.problems = [f"{len(rows)} {what} (first rows: {', '.join(map(str, rows[:5]))})"
                         for what, rows in [("rows with NaN", self.nan_rows),
                                            ("rows with Inf", self.inf_rows),
                                            ("rows covered by no shard", self.missing_rows),
                                            ("all-zero rows that are not recorded bad images",
                                             unexplained_zero)] if len(rows)]

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        if self.problems:
            return "; ".join(self.problems)
        bad = f"; {len(self.bad_images)} unreadable images stored as zeros" if len(self.bad_images) else ""
        return f"ok: {self.num_rows} rows, no NaN/Inf, no missing or unexplained all-zero rows{bad}"


class FeatureCache(IndexedRows):
    """A feature cache opened read-only and validated (else ``VseError`` naming the problem).

    ``features`` is the lazy h5py dataset; ``read(rows)`` fetches rows in any order.
    Small arrays (ids, captions, splits) are loaded on open.
    """

    def __init__(self, path):
        self.path = Path(path)
        # found, HDF5, this format and version, complete; opened at a symlink's target, where the shards are
        self._file = FEATURES.open(self.path)
        try:
            self._load()
        except BaseException:
            self._file.close()
            raise

    def _load(self) -> None:
        f = self._file
        self.attrs = {k: _plain(v) for k, v in f.attrs.items()}
        for name in ("features", "image_ids", "captions", "caption_image", "splits"):
            if name not in f:
                raise VseError(f"cache has no {name!r}", self.path)
        self.features = _open_features(f, self.path)
        if self.features.ndim not in (2, 3):
            raise VseError("features must be (N, D) or sets (N, K, D), found shape "
                           f"{self.features.shape}", self.path)
        image_ids = list(f["image_ids"].asstr()[()])
        captions = list(f["captions"].asstr()[()])
        caption_image = np.asarray(f["caption_image"][()], dtype=np.int64)
        splits = {name: np.asarray(ds[()], dtype=np.int64) for name, ds in f["splits"].items()}
        self.bad_images = (np.asarray(f["bad_images"][()], dtype=np.int64) if "bad_images" in f
                           else np.zeros(0, dtype=np.int64))
        n, d = self.features.shape[0], self.features.shape[-1]
        expected = {"image_ids": (len(image_ids), n),
                    "num_images attribute": (self.attrs.get("num_images"), n),
                    "feature_dim attribute": (self.attrs.get("feature_dim"), d),
                    "caption_image": (len(caption_image), len(captions)),
                    "num_captions attribute": (self.attrs.get("num_captions"), len(captions))}
        for what, (found, wanted) in expected.items():
            if found != wanted:
                raise VseError(f"inconsistent cache: {what} is {found}, expected {wanted}", self.path)
        for name, rows in [("caption_image", caption_image), ("bad_images", self.bad_images),
                           *((f"splits/{k}", v) for k, v in splits.items())]:
            if rows.size and (rows.min() < 0 or rows.max() >= n):
                raise VseError(f"inconsistent cache: {name} has image indices outside 0..{n - 1}",
                               self.path)
        self.index = CaptionIndex(image_ids, captions, caption_image, splits, location=self.path)
        if "caption_fingerprint" in self.attrs:  # computed once, when the cache was written
            # (a cache written before vse stored it computes it when asked)
            self.index.fingerprint = self.attrs["caption_fingerprint"]
        if self.features.is_virtual:
            self._check_sources()

    def _check_sources(self) -> None:
        """Every shard the virtual dataset maps must exist, be complete and be of this run."""
        sources = self.features.virtual_sources()
        _allow_open_files(len(sources), self.path)
        self._shards = []
        for source in sources:
            shard = Path(source.file_name)
            shard = shard if shard.is_absolute() else self.path.resolve().parent / shard
            (r0, *_), (r1, *_) = source.vspace.get_select_bounds()
            rows = f"rows {r0}..{r1}"
            if not shard.is_file():
                raise VseError(f"missing shard {source.file_name} ({rows})", self.path)
            try:
                with h5py.File(shard, "r") as f:
                    complete = bool(f.attrs.get("complete", False))
                    fingerprint = f.attrs.get("config_fingerprint")
                    shape = f[source.dset_name].shape
            except (OSError, KeyError):
                raise VseError(f"unreadable shard {source.file_name} ({rows})", self.path) from None
            if not complete:
                raise VseError(f"incomplete shard {source.file_name} ({rows})", self.path)
            if fingerprint != self.attrs.get("config_fingerprint"):
                raise VseError(f"shard {source.file_name} ({rows}) comes from a different run",
                               self.path)
            if shape != (r1 - r0 + 1, *self.features.shape[1:]):
                raise VseError(f"shard {source.file_name} has shape {shape}, expected "
                               f"{(r1 - r0 + 1, *self.features.shape[1:])}", self.path)
            self._shards.append((r0, shard, source.dset_name))
        self._shards.sort()
        self._shard_starts = np.array([r0 for r0, _, _ in self._shards], dtype=np.int64)
        self._shard_data = {}

    def _select(self, unique: np.ndarray) -> np.ndarray:
        """Rows ``unique`` (sorted, distinct) in one point selection per shard, read from the
        shards themselves: through the virtual dataset a random batch of 128 rows of a 7×7 grid
        took 33 ms, from the shards 4 ms."""
        if not self.features.is_virtual:
            return np.asarray(self.features[unique], dtype=self.dtype)
        out = np.empty((len(unique), *self.features.shape[1:]), dtype=self.dtype)
        shard_of = np.searchsorted(self._shard_starts, unique, side="right") - 1
        for i in np.unique(shard_of):
            if i not in self._shard_data:
                r0, path, name = self._shards[i]
                self._shard_data[i] = h5py.File(path, "r")[name]
            mask = shard_of == i
            out[mask] = self._shard_data[i][unique[mask] - self._shards[i][0]]
        return out

    # -- properties and lookups

    @property
    def feature_dim(self) -> int:
        """D: the size of a row's vector, or of each member of a row's set."""
        return int(self.features.shape[-1])

    @property
    def is_set(self) -> bool:
        """Rows are sets of K vectors (CNN grids, precomputed regions), not one vector."""
        return self.features.ndim == 3

    @property
    def set_size(self) -> int | None:
        """K, the members of each set (None for a cache of vectors)."""
        return int(self.features.shape[1]) if self.is_set else None

    @property
    def layout(self) -> str:
        """What a row is, in words: ``1280-d vectors`` or ``sets of 49 × 1280 (grid 7 × 7)``."""
        if not self.is_set:
            return f"{self.feature_dim}-d vectors"
        grid = self.attrs.get("grid")
        return f"sets of {self.set_size} × {self.feature_dim}" + (f" (grid {grid[0]} × {grid[1]})"
                                                                   if grid else "")

    @property
    def num_images(self) -> int:
        return int(self.features.shape[0])

    @property
    def dtype(self) -> np.dtype:
        """What ``read`` returns: float32 vectors; sets as stored (float16 grids; precomputed
        regions in their file's float type), widened on the device that uses them."""
        return np.dtype(np.float32) if not self.is_set else self.features.dtype

    def _block_rows(self) -> int:
        """Rows per dense read: about 40 MB whatever a row holds."""
        row_bytes = int(np.prod(self.features.shape[1:])) * self.features.dtype.itemsize
        return max(1, _READ_BLOCK_BYTES // row_bytes)

    def read(self, rows) -> np.ndarray:
        """Features of ``rows`` (any order, repeats allowed): (B, D) float32, or (B, K, D) sets
        of ``dtype``, gathered in one selection (no per-row Python work)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_images):
            raise IndexError(f"rows outside 0..{self.num_images - 1}")
        unique, inverse = np.unique(rows, return_inverse=True)
        block_rows = self._block_rows()
        block_of = unique // block_rows
        blocks = np.unique(block_of)
        starts = blocks * block_rows
        spanned = int((np.minimum(starts + block_rows, self.num_images) - starts).sum())  # a dense read
        # sparse, up to a third of the rows a dense read would read: one point selection per shard
        # (HDF5's point selections of many rows are slower than reading whole blocks)
        if len(unique) * 3 < spanned:
            return self._select(unique)[inverse]
        out = np.empty((len(unique), *self.features.shape[1:]), dtype=self.dtype)
        for block in blocks:  # dense: contiguous block reads
            start = int(block) * block_rows
            chunk = self.features[start:start + block_rows]
            mask = block_of == block
            out[mask] = chunk[unique[mask] - start]
        return out if np.array_equal(unique, rows) else out[inverse]  # no second copy when in order

    def check(self) -> CacheReport:
        """Scan every row: NaN/Inf, all-zero rows, rows no shard covers."""
        nan, inf, zero = [], [], []
        block_rows = self._block_rows()
        for start in range(0, self.num_images, block_rows):
            block = np.asarray(self.features[start:start + block_rows], dtype=np.float32)
            block = block.reshape(len(block), -1)  # a set's members together
            nan.append(start + np.flatnonzero(np.isnan(block).any(axis=1)))
            inf.append(start + np.flatnonzero(np.isinf(block).any(axis=1)))
            zero.append(start + np.flatnonzero(~block.any(axis=1)))
        covered = np.ones(self.num_images, dtype=bool)
        if self.features.is_virtual:
            covered[:] = False
            for source in self.features.virtual_sources():
                (r0, *_), (r1, *_) = source.vspace.get_select_bounds()
                covered[r0:r1 + 1] = True
        return CacheReport(self.num_images, np.concatenate(nan), np.concatenate(inf),
                           np.concatenate(zero), np.flatnonzero(~covered), self.bad_images)

    def close(self) -> None:
        for dataset in getattr(self, "_shard_data", {}).values():
            dataset.file.close()
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
