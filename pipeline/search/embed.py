"""`vse embed`: a trained checkpoint applied to new images and captions, written as an
embeddings file that `vse index` reads (docs/ARCHITECTURE.md, "Embeddings file").

``Embedder.from_checkpoint`` rebuilds both sides of a checkpoint with their own inputs:

- images of a model trained on a feature cache go through the pipeline that cache was made
  with: backbone, weights (checked by digest), crops, input size, grid and engine (the
  checkpoint's ``image_pipeline``, or the attributes of the cache its configuration names),
  then the model's image head.  Set caches hold float16 members, so the features are rounded
  the same way.  An RC checkpoint carries its CNN: centre crops through it, its evaluation
  transform.  A model trained on imported precomputed features embeds captions only.
- captions go through its vocabulary and GRU, or the frozen encoder its caption features were
  made by (all-MiniLM-L6-v2 or GloVe CBOW, one vector or the token set of each caption),
  refused when the installed encoder is not the one recorded, then its text head.

Every vector is an L2-normalised row.  ``embed_files`` writes parts first (``<out>.parts/``,
each complete or absent, keyed by the checkpoint and the inputs), so a killed run started
again with the same command goes on where it stopped; the combined file appears last,
atomically, and only it carries ``complete``.  An image that cannot be read is skipped,
counted and listed in ``/images/failed`` ("path<TAB>reason"), never a crash.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import h5py
import numpy as np
import torch

from pipeline import __version__
from pipeline.core import runtime
from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.errors import VseError
from pipeline.core.formats import EMBEDDINGS
from pipeline.core.fsutil import atomic_h5, atomic_path, file_sha256
from pipeline.core.similarity import gaussian_halves, is_probabilistic
from pipeline.data.cache import SET_DTYPE, FeatureCache
from pipeline.data.readers import open_image
from pipeline.data.readers.csv_file import read_csv_items
from pipeline.data.readers.csv_layout import CsvLayout
from pipeline.data.readers.toolkit import relative_path_inside
from pipeline.networks.layers import l2_normalize
from pipeline.search.embeddings_file import GROUP_FIELD, LOG_VARIANCE

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
TABLE_SUFFIXES = (".csv", ".tsv")
PART_SIZE = 1024  # items per part file: the most a killed run loses


# ---------------------------------------------------------------------------- inputs

@dataclass
class Items:
    """One group to embed: unique ids, what a result shows (an image's path as given, a
    caption's text) and, for images, the files read."""

    ids: list[str]
    shown: list[str]
    files: list[Path] | None = None
    rejected: list[str] = field(default_factory=list)  # "name<TAB>reason": files whose name cannot be an id
    root: Path | None = None  # the folder relative paths are under (recorded: `vse index` and serve use it)
    image_ids: list[str] | None = None  # captions from a CSV: each caption's image id (the page shows it)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps([self.ids, self.shown]).encode()).hexdigest()


def image_items(source, layout: CsvLayout | None = None) -> Items:
    """The images of ``source``: a folder (every image file under it, sorted; id: the path
    relative to it), one image file, a CSV/TSV (``layout``'s image column, and its id column when named;
    an image of several rows counts once), or a list file (one path per line, relative to
    the list's folder, never climbing out of it, or absolute; id: the line)."""
    source = Path(source)
    if source.is_dir():
        files = sorted(p for p in source.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not files:
            raise VseError(f"no image files ({', '.join(IMAGE_SUFFIXES)}) in this folder", source)
        names = [p.relative_to(source).as_posix() for p in files]
        problems = [_name_problem(name) for name in names]
        keep = [k for k, problem in enumerate(problems) if problem is None]
        rejected = [f"{_printable(names[k])}\t{problems[k]}" for k, problem in enumerate(problems) if problem]
        if not keep:
            raise VseError(f"none of the {len(names)} image files has a name that can be stored "
                           f"(first: {rejected[0].replace(chr(9), ': ')})", source)
        return Items([names[k] for k in keep], [names[k] for k in keep], [files[k] for k in keep], rejected,
                     source.resolve())
    if not source.is_file():
        raise VseError("not found (images: a folder, a CSV or a list file of paths)", source)
    if source.suffix.lower() in IMAGE_SUFFIXES:  # one image file
        return Items([source.name], [str(source)], [source])
    if source.suffix.lower() in TABLE_SUFFIXES:
        path_of: dict[str, str] = {}
        for item in read_csv_items(source, layout, captions=False):
            if path_of.setdefault(item.image_id, item.image) != item.image:
                raise VseError(f"{item.where}: id {item.image_id!r} names {item.image} here and "
                               f"{path_of[item.image_id]} before", source)
        ids = list(path_of)
        return Items(ids, [path_of[i] for i in ids], [source.parent / path_of[i] for i in ids],
                     root=source.parent.resolve())
    lines = _text_lines(source)
    folder = source.parent
    bases = list(dict.fromkeys([folder, folder.resolve()]))
    for n, line in lines:  # a relative path stays inside the list's folder (as in a CSV); absolute: as given
        if not Path(line).is_absolute() and relative_path_inside(line, bases) is None:
            raise VseError(f"line {n}: image path {line!r} leaves the list's folder {folder}", source)
    names = list(dict.fromkeys(line for _, line in lines))
    if not names:
        raise VseError("empty list file (no image paths)", source)
    return Items(names, names, [source.parent / name for name in names], root=source.parent.resolve())


def _name_problem(name: str) -> str | None:
    """Why a file's name cannot be an id (stored as UTF-8, shown in a page, put in a URL)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not UTF-8 (rename the file)"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "its name holds a control character such as a line break (rename the file)"
    return None


def _printable(name: str) -> str:
    """A name as storable text: undecodable bytes and control characters as \\xNN."""
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "".join(c if 32 <= ord(c) != 127 else f"\\x{ord(c):02x}" for c in text)


def caption_items(source, layout: CsvLayout | None = None) -> Items:
    """The captions of ``source``: a text file (one per non-empty line; id ``<file>:<line>``)
    or a CSV/TSV (``layout``'s caption column; id ``<file>:<line>``)."""
    source = Path(source)
    if not source.is_file():
        raise VseError("not found (captions: a text file, one per line, or a CSV)", source)
    owners = None
    if source.suffix.lower() in TABLE_SUFFIXES:
        table = [item for item in read_csv_items(source, layout) if item.caption]
        rows, owners = [(item.where, item.caption) for item in table], [item.image_id for item in table]
    else:
        rows = [(f"{source.name}:{n}", line) for n, line in _text_lines(source)]
    if not rows:
        raise VseError("empty caption file (no captions)", source)
    return Items([where for where, _ in rows], [text for _, text in rows], image_ids=owners)


def _text_lines(path: Path) -> list[tuple[int, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise VseError(f"not UTF-8 text (byte {exc.start})", path) from None
    except OSError as exc:
        raise VseError(f"cannot read ({exc.strerror or exc})", path) from None
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


# ---------------------------------------------------------------------------- the model

class _CacheImages:
    """Image file → the features of the cache a model was trained on (``image_pipeline``)."""

    def __init__(self, pipeline: dict, device: torch.device):
        from pipeline.backbones.cnns import load_backbone
        from pipeline.backbones.crops import CropPlan
        from pipeline.backbones.engines import build_engine, onnxruntime_installed

        weights = pipeline.get("weights_file") or None
        if weights and not Path(weights).is_file():
            weights = None  # the package's own copy (the digest below says if it is the same)
        grid = bool(pipeline.get("grid"))
        backbone = load_backbone(pipeline["backbone"], weights, grid=grid,
                                 input_scale=float(pipeline.get("input_scale", 1.0)))
        if backbone.weights_sha256 != pipeline.get("weights_sha256"):
            raise VseError(f"the {backbone.name} weights found here (sha256 {backbone.weights_sha256[:12]}…) "
                           f"are not those the model's features were made with "
                           f"({str(pipeline.get('weights_sha256'))[:12]}…)", weights or backbone.name)
        self.plan = CropPlan(int(pipeline.get("crops", 1)), backbone.preprocessing)
        engine = pipeline.get("engine", "torch")
        if engine == "onnxruntime" and (device.type != "cpu" or not onnxruntime_installed()):
            engine = "torch"  # agrees with ONNX Runtime within engines.EXPORT_TOLERANCE
        self.forward = build_engine(engine, backbone, device, onnx_cache_dir())
        self.dtype = SET_DTYPE if grid else np.float32  # as the cache stores them
        self.describe = {**pipeline, "engine_used": engine}

    def features(self, encoded: torch.Tensor) -> torch.Tensor:
        return encoded.to(torch.float16 if self.dtype == SET_DTYPE else torch.float32).float()


class _OwnCnnImages:
    """Image file → centre crop, uint8: an RC model's CNN is inside the model."""

    forward = None

    def __init__(self, preprocessing, entry: dict):
        from pipeline.backbones.crops import CropPlan

        self.plan = CropPlan(1, preprocessing)
        self.describe = {"backbone": entry["name"], "weights": "fine-tuned, in the checkpoint"
                         if entry.get("finetune") else f"sha256 {entry.get('weights_sha256')}",
                         "crops": 1, "image_size": preprocessing.image_size, "grid": bool(entry.get("grid"))}

    def features(self, encoded: torch.Tensor) -> torch.Tensor:
        return encoded


def onnx_cache_dir() -> Path:
    """Where exported ONNX graphs of `vse embed` live ($VSE_ONNX_DIR, else the user's cache)."""
    if os.environ.get("VSE_ONNX_DIR"):
        return Path(os.environ["VSE_ONNX_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vse" / "onnx"


def network_kind_of(network: str) -> str | None:
    """The kind a checkpoint's network declares (``registry.NETWORKS.spec``); None when its file
    cannot be read now."""
    from pipeline.core.registry import NETWORKS

    try:
        return NETWORKS.spec(network).kind
    except VseError:
        return None


def refuse_pairwise(state: dict, checkpoint) -> None:
    """A pairwise network (networks.network) has no embeddings: embed, index, search and serve
    refuse its checkpoint in one line, naming what to use instead."""
    config = state.get("model_config") if isinstance(state.get("model_config"), dict) else {}
    if config.get("co_trained"):
        raise VseError(f"this checkpoint holds {config['co_trained']} networks trained together (ncr), "
                       "scored as the mean of their scores: it has no single embedding to index or search. "
                       "Embed with a checkpoint of one network for the shortlist", checkpoint)
    network = config.get("network")
    if network is not None and network_kind_of(network) == "dual":
        raise VseError(f"network {network} is a dual network of your own: vse embed, index, search and serve "
                       "read VSE's built-in models (vse++, vse-infty, vsrn) for now; evaluate it with `vse "
                       "evaluate --checkpoint`", checkpoint)
    if network is not None:
        raise VseError(f"network {network} scores each image–caption pair jointly: it has no embeddings "
                       "to index or search. Embed with a dual checkpoint (--network vse++ or vse-infty) for "
                       "the shortlist", checkpoint)


@dataclass
class Embedder:
    """A checkpoint's model with its own image and caption inputs, loaded once and reused for
    every call (`vse embed`, `vse search`, `vse serve`)."""

    model: torch.nn.Module
    state: dict
    checkpoint: Path
    checkpoint_sha256: str
    device: torch.device
    images: object | None  # _CacheImages, _OwnCnnImages, or None: no image pipeline known
    why_no_images: str = ""
    _text: dict = field(default_factory=dict)

    @property
    def dim(self) -> int:
        return int(self.model.config.embed_dim)

    @property
    def width(self) -> int:
        """The model's output per item: ``dim``, or ``[mean, log-variance]`` (2 × dim) where the
        similarity is probabilistic (PCME, PCME++: the file keeps the halves apart)."""
        return 2 * self.dim if is_probabilistic(self.similarity) else self.dim

    def unit(self, emb: torch.Tensor) -> np.ndarray:
        """The model's output as the file keeps it: unit rows; probabilistic embeddings as unit means
        followed by their log-variances, as they are."""
        emb = emb.float()
        if is_probabilistic(self.similarity):
            mean, log_variance = gaussian_halves(emb)
            return torch.cat([l2_normalize(mean), log_variance], dim=-1).cpu().numpy()
        return l2_normalize(emb).cpu().numpy()

    @property
    def similarity(self) -> str:
        return self.model.config.similarity

    @classmethod
    def from_checkpoint(cls, checkpoint, device="auto", features=None, digest: str | None = None) -> Embedder:
        """``features``: the feature cache whose pipeline embeds images, instead of the one the
        checkpoint records or names (a checkpoint made before checkpoints recorded it).
        ``digest``: the file's sha256 when the caller has it already. The file is read once."""
        from pipeline.evaluation.inference import model_from_state

        checkpoint = Path(checkpoint)
        device = runtime.resolve_device(device) if isinstance(device, str) else device
        state = load_checkpoint(checkpoint)
        refuse_pairwise(state, checkpoint)
        digest = digest or file_sha256(checkpoint)
        why = ""
        if "backbone" in state:
            from pipeline.data.image_source import rc_model

            model, preprocessing = rc_model(state, checkpoint)
            model = model.to(device).eval()
            images = _OwnCnnImages(preprocessing, state["backbone"])
        else:
            model = model_from_state(state, checkpoint, device).model  # the state read above: once
            pipeline, why = image_pipeline(state, features)
            images = _CacheImages(pipeline, device) if pipeline else None
        if images is not None and model.config.image_pool is None and images.describe.get("grid"):
            raise VseError("the image pipeline gives grids, the model takes one vector per image", checkpoint)
        return cls(model, state, checkpoint, digest, device, images, why)

    # -- captions

    def embed_texts(self, texts: list[str], batch_size: int = 256) -> np.ndarray:
        """(n, D) float32 unit rows of ``texts`` by the checkpoint's caption side (``unit``)."""
        out = [self._texts(list(texts[a:a + batch_size])) for a in range(0, len(texts), batch_size)]
        return np.concatenate(out) if out else np.zeros((0, self.width), np.float32)

    @torch.no_grad()
    def _texts(self, texts: list[str]) -> np.ndarray:
        encoder = self.model.text_encoder
        entry = self.state.get("text_features")
        if not entry:
            from pipeline.data.captions import GRUCaptions, max_caption_tokens
            from pipeline.text.vocabulary import Vocabulary

            if "vocab" not in self._text:
                self._text["vocab"] = Vocabulary(self.state["vocab"])
            captions = GRUCaptions(self._text["vocab"], texts, max_caption_tokens(self.state))
            emb = captions.embed(encoder, np.arange(len(texts)), self.device)
        else:
            from pipeline.text import encoders

            model = entry["model"]
            if "checked" not in self._text:
                saved, now = json.loads(entry["model_identity"]), encoders.encoder_identity(model)
                differ = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
                if differ:
                    raise VseError(f"the caption encoder {model!r} installed here is not the one the "
                                   f"model was trained on ({', '.join(differ)} differ)", self.checkpoint)
                self._text["checked"] = True
            if entry.get("layout", "vectors") == "tokens":
                from pipeline.data.caption_features import TOKEN_DTYPE, padded_token_sets

                encoded = encoders.encode_caption_tokens(texts, model, self.device)
                offsets = np.concatenate([[0], np.cumsum(encoded.lengths)]).astype(np.int64)
                tokens = encoded.tokens.astype(TOKEN_DTYPE)  # as the token file stores them
                x, lengths = padded_token_sets(tokens, offsets, np.arange(len(texts)))
                emb = encoder(x.to(self.device), lengths)
            else:
                vectors = encoders.encode_captions(texts, model, self.device).vectors
                emb = encoder(torch.from_numpy(vectors).to(self.device))
        return self.unit(emb)

    # -- images

    def check_images(self) -> None:
        if self.images is None:
            raise VseError(f"cannot embed images: {self.why_no_images}", self.checkpoint)

    @torch.no_grad()
    def head(self, encoded: torch.Tensor) -> np.ndarray:
        """Backbone output (or uint8 crops for an RC model) → (B, D) unit rows (``unit``)."""
        x = self.images.features(encoded).to(self.device)
        return self.unit(self.model.image_encoder(x))

    def embed_images(self, images: list) -> np.ndarray:
        """(n, D) float32 unit rows of PIL images or image paths (one batch; a query)."""
        self.check_images()
        plan = self.images.plan
        prepared = torch.stack([plan.prepare(im if not isinstance(im, (str, Path)) else open_image(im))
                                for im in images])
        forward = self.images.forward
        with torch.inference_mode():
            if forward is None:
                encoded = prepared
            else:
                x = plan.network_input(prepared.to(self.device), channels_last=forward.channels_last)
                encoded = plan.average(forward(x)).cpu()
        return self.head(encoded)

    def describe(self) -> dict:
        entry = self.state.get("text_features")
        captions = ({"encoder": entry["model"], "layout": entry.get("layout", "vectors"),
                     "model_identity": entry["model_identity"]} if entry else
                    {"encoder": "gru", "vocabulary_sha1": hashlib.sha1(
                        "\n".join(self.state["vocab"]).encode()).hexdigest()})
        return {"image_pipeline": None if self.images is None else self.images.describe,
                "caption_encoder": {**captions, "text_pool": self.model.config.text_pool}}


def image_pipeline(state: dict, features=None) -> tuple[dict | None, str]:
    """(how the model's image features were made, or None and why not)."""
    if features is None and state.get("image_pipeline"):
        return state["image_pipeline"], ""
    path = features or state["train_config"].get("features")
    if not path or not Path(path).is_file():
        return None, (f"the checkpoint does not record how its image features were made, and its cache "
                      f"{path} is not here (give --features CACHE)")
    with FeatureCache(path) as cache:
        attrs = dict(cache.attrs)
    if not attrs.get("weights_sha256"):
        return None, (f"the model was trained on imported precomputed features ({path}); vse cannot "
                      "compute those for new images (embed --captions only)")
    from pipeline.data.cache import IMAGE_PIPELINE_ATTRS

    return {k: attrs[k] for k in IMAGE_PIPELINE_ATTRS if k in attrs}, ""


# ---------------------------------------------------------------------------- the file

@dataclass
class EmbedResult:
    path: Path
    dim: int
    images: int = 0
    captions: int = 0
    failed: list[str] = field(default_factory=list)  # "path\treason"
    parts_reused: int = 0
    images_computed: int = 0  # read and embedded by this run (not reused from parts)
    image_seconds: float = 0.0

    @property
    def images_per_second(self) -> float:
        return self.images_computed / self.image_seconds if self.image_seconds else 0.0


def embed_files(checkpoint, out, images=None, captions=None, *, layout: CsvLayout | None = None,
                device="auto", batch_size: int | None = None, workers: int | None = None,
                features=None, strict: bool = False, overwrite: bool = False,
                progress: bool = False, part_size: int = PART_SIZE) -> EmbedResult:
    """Embed ``images`` and/or ``captions`` (see ``image_items``, ``caption_items``) with
    ``checkpoint`` into the embeddings file ``out``."""
    import time

    from pipeline.core.progress import progress_bar
    from pipeline.data.extract import ExtractOptions, encode_images, loader_workers

    if images is None and captions is None:
        raise VseError("nothing to embed: give --images and/or --captions")
    batch_size = ExtractOptions.batch_size if batch_size is None else batch_size  # extract's batches
    if batch_size < 1 or part_size < 1:
        raise VseError(f"--batch-size must be at least 1, not {batch_size}")
    out = Path(out)
    EMBEDDINGS.guard(out, overwrite)
    groups = {}
    if images is not None:
        groups["images"] = image_items(images, layout)
    if captions is not None:
        groups["captions"] = caption_items(captions, layout)
    for items in groups.values():
        for item_path in (items.files or []):
            if item_path.resolve() == out.resolve():
                raise VseError("--out would overwrite one of the images", out)
    embedder = Embedder.from_checkpoint(checkpoint, device, features)
    if "images" in groups:
        embedder.check_images()
    description = embedder.describe()
    config = {"checkpoint_sha256": embedder.checkpoint_sha256, "part_size": part_size,
              "inputs": {g: items.digest() for g, items in groups.items()}, **description}
    fingerprint = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()
    folder = out.with_name(out.name + ".parts")
    result = EmbedResult(out, embedder.dim)

    for group, items in groups.items():
        bounds = [(a, min(a + part_size, len(items.ids))) for a in range(0, len(items.ids), part_size)]
        todo = [i for i, b in enumerate(bounds) if not _part_done(folder, group, i, b, fingerprint)]
        result.parts_reused += len(bounds) - len(todo)
        done = sum(b - a for i, (a, b) in enumerate(bounds) if i not in todo)
        bar = progress_bar(total=len(items.ids), initial=done, unit=group[:-1], desc=f"embed {group}",
                           disable=not progress)
        with bar:
            if group == "captions":
                for i in todo:
                    a, b = bounds[i]
                    vectors = embedder.embed_texts(items.shown[a:b])
                    _write_part(folder, group, i, bounds[i], fingerprint, vectors, np.ones(b - a, bool),
                                [""] * (b - a))
                    bar.update(b - a)
                continue
            started = time.perf_counter()
            batches = [list(range(a, min(a + batch_size, stop))) for i in todo
                       for start, stop in [bounds[i]] for a in range(start, stop, batch_size)]
            part_of = {row: i for i in todo for row in range(*bounds[i])}
            plan, forward = embedder.images.plan, embedder.images.forward
            workers_n = loader_workers(ExtractOptions(workers=workers), forward) if forward else (
                runtime.default_workers() if workers is None else workers)
            part, vectors, ok, errors = None, None, None, None
            for rows, encoded, messages in encode_images(forward, plan, items.files, batches, workers_n,
                                                         embedder.device):
                if part_of[rows[0]] != part:
                    part = part_of[rows[0]]
                    start, stop = bounds[part]
                    vectors = np.zeros((stop - start, embedder.width), np.float32)
                    ok, errors = np.ones(stop - start, bool), [""] * (stop - start)
                vectors[rows[0] - start:rows[-1] + 1 - start] = embedder.head(encoded)
                for k, message in enumerate(messages):
                    if message:
                        ok[rows[k] - start], errors[rows[k] - start] = False, message
                        vectors[rows[k] - start] = 0.0
                bar.update(len(rows))
                result.images_computed += len(rows)
                if rows[-1] + 1 == stop:
                    _write_part(folder, group, part, bounds[part], fingerprint, vectors, ok, errors)
            result.image_seconds = time.perf_counter() - started

    _combine(out, folder, groups, fingerprint, part_size, embedder, result, strict)
    shutil.rmtree(folder, ignore_errors=True)
    return result


def _part_path(folder: Path, group: str, i: int) -> Path:
    return folder / f"{group}-{i:05d}.h5"


def _part_done(folder: Path, group: str, i: int, bounds, fingerprint: str) -> bool:
    path = _part_path(folder, group, i)
    if not path.is_file():
        return False
    try:
        with h5py.File(path, "r") as f:
            return (bool(f.attrs.get("complete")) and f.attrs.get("fingerprint") == fingerprint
                    and (int(f.attrs["start"]), int(f.attrs["stop"])) == tuple(bounds))
    except (OSError, KeyError):
        return False


def _read_part(folder: Path, group: str, i: int, name: str) -> np.ndarray:
    with h5py.File(_part_path(folder, group, i), "r") as f:
        return f[name].asstr()[()] if name == "errors" else f[name][()]


def _write_part(folder: Path, group: str, i: int, bounds, fingerprint: str, vectors, ok, errors) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_h5(_part_path(folder, group, i)) as f:
        f.create_dataset("vectors", data=vectors)
        f.create_dataset("ok", data=ok)
        f.create_dataset("errors", data=np.array(errors, dtype=h5py.string_dtype()))
        f.attrs.update({"start": bounds[0], "stop": bounds[1], "fingerprint": fingerprint, "complete": True})


def _combine(out: Path, folder: Path, groups: dict, fingerprint: str, part_size: int, embedder: Embedder,
             result: EmbedResult, strict: bool) -> None:
    """The parts → ``out``, written beside it and renamed once complete: only embedded items,
    failures listed; refused when nothing (or, ``strict``, not everything) could be read."""
    strings = h5py.string_dtype()
    kept = {}
    for group, items in groups.items():
        parts = range(-(-len(items.ids) // part_size))
        ok = np.concatenate([_read_part(folder, group, i, "ok") for i in parts])
        kept[group] = ok
        if group == "images":
            errors = np.concatenate([_read_part(folder, group, i, "errors") for i in parts])
            result.failed = items.rejected + [f"{items.shown[k]}\t{errors[k]}" for k in np.flatnonzero(~ok)]
            if not ok.any():
                raise VseError(f"none of the {len(ok)} images could be read (first: {result.failed[0]})",
                               items.files[0].parent if items.files else None)
            if strict and result.failed:
                raise VseError(f"{len(result.failed)} of {len(ok)} images could not be read (first: "
                               f"{result.failed[0].replace(chr(9), ': ')}); without --strict they are "
                               "skipped and listed", out)
    with atomic_path(out) as tmp, h5py.File(tmp, "w") as f:
        for group, items in groups.items():
            ok = kept[group]
            g = f.create_group(group)
            vectors = g.create_dataset("vectors", (int(ok.sum()), embedder.dim), np.float32)
            spread = (g.create_dataset(LOG_VARIANCE, (int(ok.sum()), embedder.dim), np.float32)
                      if embedder.width > embedder.dim else None)  # probabilistic: the means' log-variances
            at = 0
            for i in range(-(-len(items.ids) // part_size)):
                chunk = _read_part(folder, group, i, "vectors")[_read_part(folder, group, i, "ok")]
                vectors[at:at + len(chunk)] = chunk[:, :embedder.dim]
                if spread is not None:
                    spread[at:at + len(chunk)] = chunk[:, embedder.dim:]
                at += len(chunk)
            keep = np.flatnonzero(ok)
            g.create_dataset("ids", data=np.array([items.ids[k] for k in keep], dtype=strings))
            g.create_dataset(GROUP_FIELD[group], data=np.array([items.shown[k] for k in keep], dtype=strings))
            if group == "images":
                g.create_dataset("failed", data=np.array(result.failed, dtype=strings))
                result.images = len(keep)
                if items.root is not None:
                    f.attrs["image_root"] = str(items.root)
            else:
                result.captions = len(keep)
                if items.image_ids is not None:  # which image each caption describes (a CSV's rows)
                    g.create_dataset("image_ids", data=np.array([items.image_ids[k] for k in keep],
                                                                dtype=strings))
        description = embedder.describe()
        f.attrs.update({
            **EMBEDDINGS.stamp(),
            "checkpoint_sha256": embedder.checkpoint_sha256, "checkpoint": str(embedder.checkpoint),
            "similarity": embedder.similarity, "dim": embedder.dim,
            "image_pipeline": json.dumps(description["image_pipeline"], default=str),
            "caption_encoder": json.dumps(description["caption_encoder"], default=str),
            "config_fingerprint": fingerprint,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "vse_version": __version__})
        f.attrs["complete"] = True  # last
