"""Images → crops → backbone → sharded feature cache; resumable and torchrun-aware.

Rows of the cache are the images of the requested splits, in dataset order.  They are cut
into fixed shards (``shard_size`` rows) and every shard into fixed batches starting at the
shard's first row, so a shard's features do not depend on which run, rank or restart
computed it: a killed run restarted with the same command reuses the complete shards and
ends with the same bytes as an uninterrupted run.  Under torchrun shard ``i`` belongs to
rank ``i % world_size``; rank 0 writes the combined file after a barrier.

Unreadable images stop the run with one line naming the image, unless
``skip_bad_images`` is set: then their rows are zeros and listed in ``bad_images``.

The forward pass runs in an engine (``pipeline.backbones.engines``: torch, or ONNX Runtime on a CPU);
the cache records which.  Their features agree within 1e-4 but not bit for bit, so shards
computed by one engine are never completed by another: resuming with another engine is
refused (the error names the engine that continues the run), which keeps a resumed cache
byte-identical to an uninterrupted one.  Images are decoded and resized in DataLoader
worker processes (one decode per image, whatever the number of crops).  With the torch
engine the main process computes one batch while the workers decode the next ones; ONNX
Runtime (``in_loader_workers``) runs inside the workers instead, a session per worker and a
worker per core (``loader_workers``), so every core decodes and computes its own batches
and the main process only writes shards (bench/extract.py measures both).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pipeline.backbones.cnns import load_backbone
from pipeline.backbones.crops import CropPlan
from pipeline.backbones.engines import build_engine, engine_precision, engine_version, resolve_engine
from pipeline.core import distributed, runtime
from pipeline.core.errors import VseError
from pipeline.core.progress import progress_bar
from pipeline.data.cache import (
    DEFAULT_SHARD_SIZE,
    RawSegment,
    ShardedWriter,
    guard_cache_outputs,
    shards_dir,
    write_external_cache,
)
from pipeline.data.readers import Dataset, open_image

ONNX_SUBDIR = "onnx"  # exported graphs live in <folder of the cache>/onnx/ unless told otherwise
PREFETCH_BATCHES = 4  # batches each loader worker keeps decoded ahead of the engine


@dataclass(frozen=True)
class ExtractOptions:
    backbone: str = "efficientnet-lite0"
    crops: int = 1
    batch_size: int = 32  # images per forward pass (× crops network inputs)
    workers: int | None = None  # DataLoader workers; None → loader_workers() chooses per engine
    device: str = "auto"
    shard_size: int = DEFAULT_SHARD_SIZE
    weights: str | None = None
    skip_bad_images: bool = False
    progress: bool = False
    overwrite: bool = False  # replace an --out (or shard) that is not a vse feature cache
    engine: str = "auto"  # pipeline.backbones.engines.ENGINES
    onnx_dir: str | None = None  # exported ONNX graphs; None → <folder of out>/onnx
    grid: bool = False  # keep the last feature map's cells as a set (N, h·w, D), not their mean
    input_scale: float = 1.0  # the network's input (and resize) × this: a larger map (VSE∞)


@dataclass
class ExtractResult:
    """What one process did (under torchrun: this rank's share)."""

    path: Path
    num_images: int
    feature_dim: int
    num_shards: int
    set_size: int | None = None  # K of a cache of sets
    shards_computed: int = 0
    images_computed: int = 0
    seconds: float = 0.0  # wall time of the compute loop
    bad_images: list[str] = field(default_factory=list)  # "<image id>: <problem>"

    @property
    def shards_reused(self) -> int:
        return self.num_shards - self.shards_computed

    @property
    def images_per_second(self) -> float:
        return self.images_computed / self.seconds if self.seconds else 0.0


def extract_features(dataset: Dataset, out, splits=None, options: ExtractOptions = ExtractOptions(),
                     dataset_kind: str | None = None) -> ExtractResult:
    """Run ``options.backbone`` over the images of ``splits`` and write the cache ``out``."""
    if dataset.image_paths is None:
        raise VseError("this dataset has no images, only precomputed features "
                       "(use the vsepp-precomp import)", dataset.root)
    if options.batch_size < 1:
        raise VseError(f"--batch-size must be at least 1, not {options.batch_size}")
    if options.grid and options.crops != 1:
        raise VseError("--grid keeps one image's feature map as a set; the maps of 10 crops (corners, "
                       "flips) do not line up cell by cell, so --grid takes --crops 1")
    guard_cache_outputs(out, options.overwrite)  # before the backbone loads: fail fast
    device = runtime.resolve_device(options.device)
    distributed.init_from_env(device)
    backbone = load_backbone(options.backbone, options.weights, grid=options.grid,
                             input_scale=options.input_scale)
    plan = CropPlan(options.crops, backbone.preprocessing)
    rows, index = dataset.select(splits)
    engine = resolve_engine(options.engine, device)
    p = backbone.preprocessing
    attrs = {"engine": engine, "engine_version": engine_version(engine),
             "backbone": backbone.name, "weights_sha256": backbone.weights_sha256,
             "weights_file": str(backbone.weights_file or ""), "crops": options.crops,
             "image_size": p.image_size, "resize": p.resize, "resize_mode": plan.resize_mode,
             "interpolation": p.interpolation, "mean": list(p.mean), "std": list(p.std),
             "dataset": dataset_kind or dataset.name, "dataset_root": str(Path(dataset.root).resolve()),
             "precision": engine_precision(engine, device), "skip_bad_images": options.skip_bad_images,
             **({"grid": list(backbone.grid), "input_scale": options.input_scale} if options.grid else
                {"input_scale": options.input_scale} if options.input_scale != 1.0 else {})}
    config = {**{k: v for k, v in attrs.items() if k not in ("weights_file", "engine_version")},
              "rows_sha256": _digest(index.image_ids), "batch_size": options.batch_size,
              "shard_size": options.shard_size, "device_type": device.type}
    # How the dataset was read (csv: columns, the seeded split's ratio and seed) is recorded, but
    # outside the shards' configuration: features depend on the rows (rows_sha256), not on splits.
    attrs.update(dataset.reader_attrs)
    writer = ShardedWriter(out, len(rows), backbone.feature_dim, options.shard_size, config,
                           options.overwrite, set_size=backbone.set_size)
    _refuse_other_engine(writer)
    if distributed.is_main():
        writer.discard_stale_combined()
    todo = [i for i in _my_shards(writer) if not writer.is_complete(i)]
    result = ExtractResult(writer.out, writer.num_rows, backbone.feature_dim, len(writer.bounds),
                           set_size=backbone.set_size)
    paths = [dataset.image_paths[r] for r in rows]
    if todo:
        onnx_dir = Path(options.onnx_dir) if options.onnx_dir else writer.out.parent / ONNX_SUBDIR
        forward = build_engine(engine, backbone, device, onnx_dir)
        _compute_shards(forward, plan, paths, index.image_ids, writer, todo, options, device, result)
    distributed.barrier()
    if distributed.is_main():
        writer.finish(index, attrs)
    distributed.barrier()
    return result


def import_precomputed(dataset: Dataset, out, splits=None, shard_size: int = DEFAULT_SHARD_SIZE,
                       dataset_kind: str | None = None, overwrite: bool = False) -> ExtractResult:
    """Copy precomputed features (VSE++ ``*_ims.npy``) into the cache format, no CNN."""
    if dataset.features is None:
        raise VseError("this dataset has no precomputed features", dataset.root)
    rows, index = dataset.select(splits)
    feature_dim = int(dataset.features.shape[-1])
    attrs = {"backbone": "precomputed", "weights_sha256": "", "crops": 0, "image_size": 0,
             "resize": 0, "mean": [], "std": [], "dataset": dataset_kind or dataset.name,
             "dataset_root": str(Path(dataset.root).resolve())}
    if dataset.features.ndim == 3:  # sets of regions: read where they are, never copied
        return _import_regions(dataset, rows, index, out, attrs, overwrite)
    config = {**attrs, "rows_sha256": _digest(index.image_ids), "shard_size": shard_size}
    writer = ShardedWriter(out, len(rows), feature_dim, shard_size, config, overwrite)
    if distributed.is_main():
        writer.discard_stale_combined()
    result = ExtractResult(writer.out, writer.num_rows, feature_dim, len(writer.bounds))
    start_time = time.perf_counter()
    for i in _my_shards(writer):
        if not writer.is_complete(i):
            start, stop = writer.bounds[i]
            writer.write_shard(i, np.asarray(dataset.features[rows[start:stop]], dtype=np.float32))
            result.shards_computed += 1
            result.images_computed += stop - start
    result.seconds = time.perf_counter() - start_time
    distributed.barrier()
    if distributed.is_main():
        writer.finish(index, attrs)
    distributed.barrier()
    return result


def _import_regions(dataset: Dataset, rows, index, out, attrs: dict, overwrite: bool) -> ExtractResult:
    """A cache over (N, K, D) region arrays (SCAN / VSE∞ ``{split}_ims.npy``) by external storage:
    the .npy files' rows are mapped, none is read now (``cache.write_external_cache``)."""
    parts = dataset.features.parts if hasattr(dataset.features, "parts") else [dataset.features]
    starts = np.cumsum([0] + [len(p) for p in parts])
    segments = []
    for part, start in zip(parts, starts):
        inside = rows[(rows >= start) & (rows < start + len(part))]
        if len(inside) == 0:
            continue
        if len(inside) != len(part):
            raise VseError("the splits asked for cover part of a region file: import whole split files",
                           getattr(part, "filename", dataset.root))
        segments.append(RawSegment(Path(part.filename), int(part.offset), len(part)))
    started = time.perf_counter()
    if distributed.is_main():
        write_external_cache(out, segments, tuple(parts[0].shape[1:]), parts[0].dtype, index,
                             {**attrs, "set_source": "precomputed regions"}, overwrite)
    distributed.barrier()
    result = ExtractResult(Path(out), len(rows), int(parts[0].shape[-1]), 0, set_size=int(parts[0].shape[1]))
    result.seconds = time.perf_counter() - started
    return result


# ---------------------------------------------------------------------------- the compute loop


MAX_ENGINE_WORKERS = 8  # each holds a session and its batches (Lite2 10C: about 1 GB of its own)


def loader_workers(options: ExtractOptions, engine) -> int:
    """``--workers``, else: for an engine that runs in the workers one per thread torch would
    use (``torch.get_num_threads()``: the cores, or OMP_NUM_THREADS), at most
    MAX_ENGINE_WORKERS; for the others ``runtime.default_workers()`` (a core left to the engine)."""
    if options.workers is not None:
        return options.workers
    if engine.in_loader_workers:
        return min(torch.get_num_threads(), MAX_ENGINE_WORKERS)
    return runtime.default_workers()


def engine_threads_per_worker(workers: int) -> int:
    """Intra-op threads of each worker's session: the threads torch would use, shared out
    (1 up to MAX_ENGINE_WORKERS cores; more on larger machines, so no core idles)."""
    return max(1, torch.get_num_threads() // max(1, workers))


class _PreparedImages(torch.utils.data.Dataset):
    """Item ``row`` → (row, uint8 image prepared for the crops, error message or "")."""

    def __init__(self, paths: list[Path], plan: CropPlan):
        self.paths = paths
        self.plan = plan

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, row: int):
        try:
            return row, self.plan.prepare(open_image(self.paths[row])), ""
        except VseError as exc:
            return row, self.plan.blank(), str(exc)


class _EncodedBatches(torch.utils.data.Dataset):
    """Item ``k`` → (rows of batch ``k``, their features, error messages): decode, crops and
    the engine all in the loader worker, whose ``_own_engine`` gave it its own session."""

    def __init__(self, images: _PreparedImages, batches: list[list[int]], engine, threads: int):
        self.images, self.batches, self.engine, self.threads = images, batches, engine, threads

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, k: int):
        rows, prepared, errors = zip(*(self.images[row] for row in self.batches[k]))
        plan = self.images.plan
        with torch.inference_mode():
            features = plan.average(self.engine(plan.network_input(torch.stack(prepared))))
        return torch.tensor(rows), features, list(errors)


def _own_engine(worker_id: int) -> None:
    dataset = torch.utils.data.get_worker_info().dataset
    dataset.engine = dataset.engine.with_threads(dataset.threads)


def _compute_shards(forward, plan: CropPlan, paths, image_ids, writer: ShardedWriter,
                    todo: list[int], options: ExtractOptions, device: torch.device,
                    result: ExtractResult) -> None:
    """Fill the shards ``todo``: the loader's worker processes decode (and, for an engine
    ``in_loader_workers``, encode) the next batches while the main process writes."""
    batches = [list(range(a, min(a + options.batch_size, stop)))
               for i in todo for start, stop in [writer.bounds[i]]
               for a in range(start, stop, options.batch_size)]
    if not batches:
        return
    batches_out = encode_images(forward, plan, paths, batches, loader_workers(options, forward), device)
    shard_of = {row: i for i in todo for row in range(*writer.bounds[i])}
    progress = progress_bar(total=sum(len(b) for b in batches), unit="img",
                            desc=f"{options.backbone} {plan.crops}C {forward.name}",
                    disable=not (options.progress and distributed.is_main()))
    shard, features, bad_rows = None, None, []
    started = time.perf_counter()
    with progress:
        for batch_rows, batch, errors in batches_out:
            if shard_of[batch_rows[0]] != shard:
                shard = shard_of[batch_rows[0]]
                start, stop = writer.bounds[shard]
                features, bad_rows = np.empty((stop - start, *writer.item_shape), writer.dtype), []
            batch = batch.numpy()
            for k, message in enumerate(errors):
                if message:
                    if not options.skip_bad_images:
                        raise VseError(f"{message} (--skip-bad-images stores zeros for "
                                       "unreadable images and goes on)")
                    batch[k] = 0.0
                    bad_rows.append(batch_rows[k])
                    result.bad_images.append(f"{image_ids[batch_rows[k]]}: {message}")
            features[batch_rows[0] - start:batch_rows[-1] + 1 - start] = batch
            progress.update(len(batch_rows))
            if batch_rows[-1] + 1 == stop:
                writer.write_shard(shard, features, bad_rows)
                result.shards_computed += 1
                result.images_computed += stop - start
    result.seconds = time.perf_counter() - started


def encode_images(forward, plan: CropPlan, paths, batches: list[list[int]], workers: int,
                  device: torch.device):
    """(rows, features on the CPU, error messages) of each of ``batches`` (lists of indices
    into ``paths``), in order: images decoded and cropped by ``plan`` in ``workers`` loader
    processes, encoded by ``forward`` (an engine; ``None``: the uint8 prepared images
    themselves, for a model with its own CNN).  An unreadable image gives a blank input and
    its message, never an exception: the caller decides.  `vse extract` and `vse embed`."""
    images = _PreparedImages(paths, plan)
    if forward is not None and forward.in_loader_workers and workers:
        loader = torch.utils.data.DataLoader(
            _EncodedBatches(images, batches, forward, engine_threads_per_worker(workers)),
            batch_size=None, num_workers=workers,
            worker_init_fn=_own_engine, prefetch_factor=PREFETCH_BATCHES)

        def encode(features):
            return features
    else:
        loader = torch.utils.data.DataLoader(
            images, batch_sampler=batches, num_workers=workers, pin_memory=runtime.pin_memory(device),
            prefetch_factor=PREFETCH_BATCHES if workers else None)

        def encode(prepared):
            if forward is None:
                return prepared
            x = plan.network_input(prepared.to(device, non_blocking=True),
                                   channels_last=forward.channels_last)
            return plan.average(forward(x))
    for batch_rows, loaded, errors in loader:
        # inference mode per batch, never held across the yield: a generator left suspended
        # (its consumer raised) would leave it on for the whole thread
        with torch.inference_mode():
            features = encode(loaded).cpu()
        yield batch_rows.tolist(), features, list(errors)


def _my_shards(writer: ShardedWriter) -> list[int]:
    rank, world = distributed.rank(), distributed.world_size()
    return [i for i in range(len(writer.bounds)) if i % world == rank]


def _refuse_other_engine(writer: ShardedWriter) -> None:
    """Stop before touching anything when complete shards of this very configuration were
    computed by another engine: continuing would mix engines in one cache."""
    ours = {k: v for k, v in writer.config.items() if k != "engine"}
    for _, theirs in writer.complete_shard_configs():
        other = theirs.pop("engine", None)
        if other is not None and other != writer.config["engine"] and theirs == ours:
            raise VseError(f"the shards in {shards_dir(writer.out).name}/ were computed by the {other} "
                           f"engine; resume with --engine {other}, or delete that folder to start "
                           f"over with {writer.config['engine']}", writer.out)


def _digest(strings: list[str]) -> str:
    return hashlib.sha256("\n".join(strings).encode()).hexdigest()
