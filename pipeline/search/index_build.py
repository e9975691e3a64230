"""`vse index`: a nearest-neighbour index over an embeddings file, its options and its tuning.

FAISS inner product on unit vectors, which is cosine similarity. Three kinds:

- ``flat``: exact search (``IndexFlatIP``); every query reads every vector.
- ``hnsw``: a graph (``IndexHNSWFlat``: M links per node, built with ``efConstruction``,
  searched with ``efSearch``); keeps the full vectors, scores are exact cosines of the
  candidates it visits. ``auto`` picks it from ``exact_below`` items on.
- ``ivfpq``: ``nlist`` inverted lists of product-quantised codes (``m`` sub-vectors of
  ``nbits``), ``nprobe`` lists searched: small on disk and in memory, scores approximate.

The index is a folder (docs/ARCHITECTURE.md, "Search index")::

    INDEX/index.faiss   the FAISS index, rows in the order of the embeddings file's group
    INDEX/items.h5      ids (N,) and paths (images) or texts (captions) of those rows
    INDEX/meta.json     format="vse-index", kind and parameters, dim, count, the model's
                        checkpoint_sha256, the source embeddings file and its sha256, the
                        sha256 and size of the two files above, recall@10 measured at build

written through ``fsutil.atomic_dir`` (a half-written index never sits at INDEX); reading it
back is ``index_reader.SearchIndex``'s, the embeddings file ``embeddings_file.EmbeddingsFile``'s.

An approximate index's recall@10 (the fraction of the exact 10 nearest items that it returns)
is measured while it is built, on held-out queries: the other group's vectors when the file
has them (captions for an image index: the searches it is for), else a sample of the indexed
vectors each searching for its 10 nearest *other* items. Without an explicit ``ef_search`` /
``nprobe``, the smallest value of ``EF_SEARCH_STEPS`` / ``NPROBE_STEPS`` that reaches
``recall_target`` is chosen and recorded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from pipeline import __version__
from pipeline.core.errors import VseError
from pipeline.core.formats import SEARCH_INDEX
from pipeline.core.fsutil import FOLDER_META, atomic_dir, file_sha256
from pipeline.search.embeddings_file import GROUP_FIELD, GROUPS, EmbeddingsFile
from pipeline.search.index_reader import (
    FAISS_FILE,
    ITEMS_FILE,
    ITEMS_FORMAT,
    KINDS,
    RESCORE_FILE,
    SEARCH_PARAM,
    import_faiss,
    set_search_params,
)

RECALL_AT = 10
EF_SEARCH_STEPS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
NPROBE_STEPS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
TRAIN_SAMPLE_MAX = 200_000  # vectors an ivfpq index is trained on, at most


@dataclass(frozen=True)
class IndexOptions:
    """Every option of `vse index`, with its default (the one place of these defaults).

    ``None`` means: derived from the data (``resolved_params`` says how)."""

    kind: str = "auto"             # auto | flat | hnsw | ivfpq
    of: str = "images"             # the group of the embeddings file to index
    exact_below: int = 100_000     # auto: flat below this many items, hnsw from it on
    hnsw_m: int = 32               # links per node
    ef_construction: int = 80      # candidate list while building
    ef_search: int | None = None   # candidate list while searching; None: tuned to recall_target
    nlist: int | None = None       # ivfpq lists; None: 4·sqrt(N) to a power of two, ≤ N/39
    pq_m: int | None = None        # ivfpq sub-vectors; None: the largest divisor of dim ≤ dim/16
    nbits: int = 8                 # ivfpq bits per sub-vector code
    nprobe: int | None = None      # ivfpq lists searched; None: tuned to recall_target
    recall_target: float = 0.95    # recall@10 the tuning aims for
    recall_queries: int = 1000     # held-out queries of the recall measurement
    seed: int = 0                  # which queries and training vectors are sampled
    # a per-item correction against hubness stored with the index (issue 61; docs/PROTOCOL.md,
    # "Re-scoring at test time"): an inductive method's name, its options, and the embeddings file
    # whose other group (the queries' modality) is its bank (None: the indexed file's own)
    rescore: str | None = None
    rescore_options: dict = field(default_factory=dict)
    rescore_bank: str | None = None

    def check(self) -> None:
        if self.kind not in ("auto", *KINDS):
            raise VseError(f"--kind must be auto or one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.of not in GROUPS:
            raise VseError(f"--of must be images or captions, not {self.of!r}")
        for name in ("exact_below", "hnsw_m", "ef_construction", "ef_search", "nlist", "pq_m", "nbits",
                     "nprobe", "recall_queries"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise VseError(f"--{name.replace('_', '-')} must be a positive integer, not {value!r}")
        if self.nbits > 16:
            raise VseError(f"--nbits must be at most 16, not {self.nbits}")
        if not 0 < self.recall_target <= 1:
            raise VseError(f"--recall-target must be in (0, 1], not {self.recall_target}")
        if self.rescore is None and (self.rescore_options or self.rescore_bank):
            raise VseError("--rescore-option and --rescore-bank go with --rescore NAME")
        if self.rescore is not None:
            self.rescorer()  # an unknown or transductive method, or a bad option: before any reading
            if self.kind == "ivfpq":
                raise VseError(f"--rescore {self.rescore} goes with --kind flat or hnsw: ivfpq would "
                               "quantise the stored correction with the vectors")

    def rescorer(self):
        """The method of ``--rescore`` with its options (``rescore.build_rescorer``), inductive only."""
        from pipeline.evaluation.rescore import build_rescorer

        method = build_rescorer(self.rescore, **self.rescore_options)
        if method.transductive:
            raise VseError(f"--rescore {method.name} is transductive (it normalises over the queries "
                           "themselves): it has no per-item correction to store with an index")
        return method


def option_default(name: str):
    """The default of an ``IndexOptions`` field (for the CLI's help)."""
    return IndexOptions.__dataclass_fields__[name].default


def choose_kind(options: IndexOptions, count: int) -> str:
    if options.kind != "auto":
        return options.kind
    return "flat" if count < options.exact_below else "hnsw"


def resolved_params(kind: str, options: IndexOptions, count: int, dim: int) -> dict:
    """The construction parameters of ``kind`` (search parameters are added by tuning)."""
    if kind == "flat":
        return {}
    if kind == "hnsw":
        return {"M": options.hnsw_m, "ef_construction": options.ef_construction}
    nlist = options.nlist
    if nlist is None:
        nlist = 2 ** round(math.log2(max(1.0, 4 * math.sqrt(count))))
        nlist = max(1, min(nlist, count // 39))
    if nlist > count:
        raise VseError(f"--nlist {nlist} is more than the {count} items to index")
    m = options.pq_m
    if m is None:
        m = max(d for d in range(1, max(1, dim // 16) + 1) if dim % d == 0)
    if dim % m:
        raise VseError(f"--pq-m {m} does not divide the dimension {dim}")
    if count < 2 ** options.nbits:
        raise VseError(f"ivfpq with --nbits {options.nbits} needs at least {2 ** options.nbits} items "
                       f"to train its codebooks, not {count} (use --kind flat or hnsw, or fewer --nbits)")
    train = min(count, max(64 * nlist, 40 * 2 ** options.nbits), TRAIN_SAMPLE_MAX)
    return {"nlist": nlist, "m": m, "nbits": options.nbits, "train_size": train}


# ---------------------------------------------------------------------------- FAISS objects


def new_index(kind: str, dim: int, params: dict):
    """An empty FAISS index of ``kind`` for inner product (untrained for ivfpq)."""
    faiss = import_faiss()
    ip = faiss.METRIC_INNER_PRODUCT
    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, params["M"], ip)
        index.hnsw.efConstruction = params["ef_construction"]
        return index
    if kind == "ivfpq":
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFPQ(quantizer, dim, params["nlist"], params["m"], params["nbits"], ip)
        index.own_fields = True
        quantizer.this.disown()
        return index
    raise VseError(f"unknown index kind {kind!r}")


def write_faiss(index, path) -> tuple[str, int]:
    """Write ``index`` to ``path``, hashing the bytes on their way: (sha256, size)."""
    faiss = import_faiss()
    digest, size = hashlib.sha256(), 0
    with open(path, "wb") as fh:
        def write(data):
            nonlocal size
            digest.update(data)
            fh.write(data)
            size += len(data)
            return len(data)

        writer = faiss.PyCallbackIOWriter(write)
        try:
            faiss.write_index(index, writer)
        finally:
            del writer
    return digest.hexdigest(), size



# ---------------------------------------------------------------------------- recall


class ExactTopK:
    """The exact ``k`` best rows (inner product) of a set of queries, fed chunk by chunk."""

    def __init__(self, queries: np.ndarray, k: int):
        self.queries, self.k = queries, k
        self.scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        self.rows = np.full((len(queries), k), -1, dtype=np.int64)

    def update(self, start: int, chunk: np.ndarray) -> None:
        scores = self.queries @ chunk.T
        keep = min(self.k, scores.shape[1])
        best = np.argpartition(-scores, keep - 1, axis=1)[:, :keep]
        all_scores = np.concatenate([self.scores, np.take_along_axis(scores, best, axis=1)], axis=1)
        all_rows = np.concatenate([self.rows, best + start], axis=1)
        top = np.argpartition(-all_scores, self.k - 1, axis=1)[:, :self.k]
        self.scores = np.take_along_axis(all_scores, top, axis=1)
        self.rows = np.take_along_axis(all_rows, top, axis=1)

    def result(self) -> np.ndarray:
        order = np.argsort(-self.scores, axis=1, kind="stable")
        return np.take_along_axis(self.rows, order, axis=1)


def drop_self(rows: np.ndarray, self_rows: np.ndarray | None, k: int) -> np.ndarray:
    """The first ``k`` results of each query other than the query's own row (when queries
    are indexed vectors), else the first ``k``."""
    if self_rows is None:
        return rows[:, :k]
    out = np.empty((len(rows), k), dtype=np.int64)
    for i, (row, own) in enumerate(zip(rows, self_rows)):
        kept = row[row != own]
        out[i] = kept[:k] if len(kept) >= k else np.pad(kept, (0, k - len(kept)), constant_values=-1)
    return out


def recall_at(approx: np.ndarray, exact: np.ndarray) -> float:
    """Mean fraction of each query's exact results found among its approximate ones."""
    k = exact.shape[1]
    hits = [len(set(a[a >= 0].tolist()) & set(e[e >= 0].tolist())) / k for a, e in zip(approx, exact)]
    return float(np.mean(hits)) if hits else float("nan")


def tune(index, kind: str, params: dict, queries: np.ndarray, exact: np.ndarray,
         self_rows: np.ndarray | None, target: float, fixed: int | None) -> tuple[dict, dict]:
    """Recall@k of ``index`` at its search parameter: the given ``fixed`` value, or the
    smallest step reaching ``target`` (if none does: the smallest within 0.005 of the best).
    Returns (params with the search parameter, recall record)."""
    k = exact.shape[1]
    name = SEARCH_PARAM[kind]
    steps = [fixed] if fixed is not None else list(EF_SEARCH_STEPS if kind == "hnsw" else NPROBE_STEPS)
    if kind == "ivfpq" and fixed is None:
        steps = [s for s in steps if s < params["nlist"]] + [params["nlist"]]
    measured: dict[int, float] = {}
    for value in steps:
        set_search_params(index, kind, {name: value})
        _, rows = index.search(queries, k + (self_rows is not None))
        measured[value] = recall_at(drop_self(rows, self_rows, k), exact)
        if measured[value] >= target:
            break
    best = max(measured.values())
    reached = [v for v, r in measured.items() if r >= target]
    chosen = fixed if fixed is not None else (reached[0] if reached else
                                              min(v for v, r in measured.items() if r >= best - 0.005))
    set_search_params(index, kind, {name: chosen})
    record = {"value": measured[chosen], "target": target, "target_met": measured[chosen] >= target,
              "tuned": fixed is None, "by_" + name: {str(v): round(r, 4) for v, r in measured.items()}}
    return {**params, name: chosen}, record


# ---------------------------------------------------------------------------- building


@dataclass
class BuildResult:
    out: Path
    meta: dict
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def build_index(embeddings, out, options: IndexOptions = IndexOptions(), *, image_root=None,
                overwrite: bool = False, log: Callable[[str], None] = lambda _: None) -> BuildResult:
    """Index one group of an embeddings file into the folder ``out``."""
    started = time.perf_counter()
    options.check()
    out = Path(out)
    SEARCH_INDEX.guard(out, overwrite)
    source = EmbeddingsFile(embeddings)
    if source.similarity == "csd":  # PCME, PCME++
        raise VseError("the model's similarity is 'csd' (probabilistic embeddings): vse index does not "
                       "index them yet (csd is an inner product of augmented vectors, "
                       "core.similarity.csd_augmented, but the index of them is not built); rank them with "
                       "vse evaluate, or read the means and log-variances of this file", source.path)
    if source.similarity != "cosine":
        raise VseError(f"the model's similarity is {source.similarity!r}: only a cosine model can be "
                       "searched by inner product (an order-embedding model cannot be indexed)", source.path)
    if options.of not in source.groups:
        raise VseError(f"has no {options.of} group to index (it has: {', '.join(source.groups)})",
                       source.path)
    if out.resolve() == source.path.resolve() or source.path.resolve().is_relative_to(out.resolve()):
        raise VseError("--out would replace the embeddings file", out)
    group, count, dim = options.of, source.count(options.of), source.dim
    if count == 0:
        raise VseError(f"/{group} holds no vectors", source.path)
    ids, shown = source.items(group)
    if group == "images" and image_root is None:
        image_root = source.attrs.get("image_root")  # where `vse embed` found the images
        if image_root is None and any(not Path(p).is_absolute() for p in shown[:1000]):
            log("note: the image paths are relative and no folder is known (the embeddings file records "
                "none): give --image-root here or to `vse serve`, or the page cannot show the images")
    kind = choose_kind(options, count)
    if kind != "flat" and count < 2:
        raise VseError(f"an approximate index of {count} item makes no sense: use --kind flat", source.path)
    params = resolved_params(kind, options, count, dim)
    log(f"{count} {group} x {dim}: {kind} index {json.dumps(params) if params else ''}".rstrip())
    correction, rescore_meta = (None, None)
    if options.rescore:
        correction, rescore_meta = fit_correction(source, group, options, log)
    column = None if correction is None else (-correction.bias / correction.scale).numpy().astype(np.float32)

    def stored(chunk: np.ndarray, start: int = 0, query: bool = False) -> np.ndarray:
        """Vectors as the index holds them: with the correction's column (``column``; a query's: 1)."""
        if column is None:
            return chunk
        extra = np.ones(len(chunk), np.float32) if query else column[start:start + len(chunk)]
        return np.hstack([chunk, extra[:, None]]).astype(np.float32)

    rng = np.random.default_rng(options.seed)
    queries = self_rows = exact = None
    queries_from = None
    if kind != "flat":
        other = next((g for g in source.groups if g != group), None)
        if other is not None and source.count(other) > 0:
            picked = rng.choice(source.count(other), min(options.recall_queries, source.count(other)),
                                replace=False)
            queries, queries_from = source.rows(other, picked), other
        else:
            self_rows = rng.choice(count, min(options.recall_queries, count), replace=False)
            queries, queries_from = source.rows(group, self_rows), f"{group} (each query's own row excluded)"
        queries = stored(queries, query=True)  # with a correction: its recall is the corrected search's
        exact = ExactTopK(queries, min(RECALL_AT + (self_rows is not None), count))

    index = new_index(kind, dim + (column is not None), params)
    if kind == "ivfpq":
        sample = np.sort(rng.choice(count, params["train_size"], replace=False))
        log(f"training ivfpq on {len(sample)} vectors")
        index.train(source.rows(group, sample))
    reported = 0
    for start, chunk in source.chunks(group):
        chunk = stored(chunk, start)
        index.add(chunk)
        if exact is not None:
            exact.update(start, chunk)
        if start + len(chunk) - reported >= count / 10 or start + len(chunk) == count:
            reported = start + len(chunk)
            log(f"added {reported} / {count}")
    if index.ntotal != count:  # pragma: no cover - FAISS contract
        raise VseError(f"FAISS holds {index.ntotal} vectors after adding {count}", source.path)
    build_seconds = time.perf_counter() - started  # reading, training, adding (and the exact top-k)

    notes, tuning_started = [], time.perf_counter()
    if kind == "flat":
        recall = {"at": RECALL_AT, "value": 1.0, "exact": True}
    else:
        k = min(RECALL_AT, count - (self_rows is not None))
        truth = drop_self(exact.result(), self_rows, k)
        fixed = options.ef_search if kind == "hnsw" else options.nprobe
        params, record = tune(index, kind, params, queries, truth, self_rows, options.recall_target, fixed)
        recall = {"at": k, **record, "exact": False, "queries": len(queries), "queries_from": queries_from}
        name = SEARCH_PARAM[kind]
        log(f"recall@{k} {record['value']:.4f} at {name}={params[name]} ({len(queries)} queries from "
            f"{queries_from})")
        if not record["target_met"]:
            tried = record["by_" + name]
            how = (f"--{name.replace('_', '-')} {params[name]} as given" if fixed else
                   f"{name} {params[name]}, the best of {len(tried)} tried up to {max(map(int, tried))}")
            helps = ("ivfpq loses it to quantisation: more --pq-m or --kind hnsw" if kind == "ivfpq"
                     else "a larger --hnsw-m or --ef-construction helps")
            notes.append(f"recall@{k} {record['value']:.3f} is below the target {options.recall_target} "
                         f"({how}); {helps}")
    tuning_seconds = time.perf_counter() - tuning_started

    meta = {
        **SEARCH_INDEX.stamp(), "of": group, "kind": kind,
        "kind_requested": options.kind, "params": params, "metric": "inner_product", "dim": dim,
        "count": count, "checkpoint_sha256": source.checkpoint_sha256,
        "checkpoint": _located(source.attrs.get("checkpoint"), source.path), "similarity": source.similarity,
        "image_root": None if image_root is None else str(Path(image_root).resolve()),
        "embeddings": {"path": str(source.path.resolve()), "sha256": file_sha256(source.path),
                       "created": source.attrs.get("created"),
                       "image_pipeline": _json_or_none(source.attrs.get("image_pipeline")),
                       "caption_encoder": _json_or_none(source.attrs.get("caption_encoder"))},
        "recall": recall, "rescore": rescore_meta,
        "options": dataclasses.asdict(options),
        "build": {"seconds": round(build_seconds, 3), "tuning_seconds": round(tuning_seconds, 3),
                  "faiss_version": import_faiss().__version__, "vse_version": __version__,
                  "created": datetime.now(timezone.utc).isoformat(timespec="seconds")},
    }
    with atomic_dir(out) as tmp:
        try:
            faiss_sha, faiss_size = write_faiss(index, tmp / FAISS_FILE)
        except RuntimeError as exc:
            raise VseError(f"cannot write the FAISS index ({str(exc).strip().splitlines()[-1][:160]})",
                           out) from exc
        write_items(tmp / ITEMS_FILE, group, ids, shown,
                    source.captions_of(ids) if group == "images" else None)
        written = [ITEMS_FILE]
        if correction is not None:
            arrays = {"bias": correction.bias.numpy()}
            if correction.active is not None:
                arrays["active"] = correction.active.numpy()
            np.savez(tmp / RESCORE_FILE, **arrays)
            written.append(RESCORE_FILE)
        meta["files"] = {FAISS_FILE: {"sha256": faiss_sha, "bytes": faiss_size},
                         **{name: {"sha256": file_sha256(tmp / name), "bytes": (tmp / name).stat().st_size}
                            for name in written}}
        meta["complete"] = True
        (tmp / FOLDER_META).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return BuildResult(out, meta, time.perf_counter() - started, notes)


def fit_correction(source: EmbeddingsFile, group: str, options: IndexOptions, log) -> tuple:
    """The per-item correction of ``options.rescore`` (``rescore.ItemCorrection``) of the indexed
    vectors, fitted on its bank: the other group (the queries' modality) of ``options.rescore_bank``
    or of the indexed file, embedded by the same model, scored against every indexed vector a block of
    reference queries at a time; and what meta.json records of it."""
    import torch

    method = options.rescorer()
    bank = EmbeddingsFile(options.rescore_bank) if options.rescore_bank else source
    queries = next(g for g in GROUPS if g != group)
    if queries not in bank.groups or bank.count(queries) == 0:
        raise VseError(f"--rescore {method.name}: the bank is the queries' modality, {queries}, and this "
                       "file has none (give --rescore-bank FILE.h5 of `vse embed` with them)", bank.path)
    if bank.checkpoint_sha256 != source.checkpoint_sha256 or bank.dim != source.dim:
        raise VseError(f"--rescore-bank: embedded by another model than the indexed file "
                       f"({bank.checkpoint_sha256[:12]}…, not {source.checkpoint_sha256[:12]}…)", bank.path)
    gallery = torch.from_numpy(np.concatenate([chunk for _, chunk in source.chunks(group)])).T
    log(f"--rescore {method.name}: fitting on {bank.count(queries)} {queries} of {bank.path.name}")
    correction = method.fit((torch.from_numpy(chunk) @ gallery for _, chunk in bank.chunks(queries, 1024)),
                            gallery.shape[1])
    record = {**method.record(), "scale": float(correction.scale),
              "query_k": getattr(method.options, "k", None) if method.name == "csls" else None,
              "bank": {"path": str(bank.path.resolve()), "sha256": file_sha256(bank.path), "group": queries,
                       "count": correction.bank_size}}
    return correction, record


def write_items(path, group, ids, shown, captions=None) -> None:
    """The index's items file: each vector's id and what it shows (and an image's first caption)."""
    import h5py

    text = h5py.string_dtype("utf-8")
    with h5py.File(path, "w") as f:
        f.create_dataset("ids", data=ids.astype(object), dtype=text)
        f.create_dataset(GROUP_FIELD[group], data=shown.astype(object), dtype=text)
        if captions is not None:  # an image's first caption, "" for none: what the page labels it with
            f.create_dataset("captions", data=np.asarray(captions, dtype=object), dtype=text)
        f.attrs.update({"format": ITEMS_FORMAT, "of": group, "count": len(ids)})


_write_items = write_items  # the old private name (tests/test_search_index.py reads it)


def _located(checkpoint, embeddings: Path) -> str | None:
    """The checkpoint's path as recorded: made absolute when it is found (as given, from the
    current folder, or next to the embeddings file), else as given."""
    if not checkpoint:
        return None
    for candidate in (Path(checkpoint), embeddings.parent / checkpoint):
        if candidate.is_file():
            return str(candidate.resolve())
    return str(checkpoint)


def _json_or_none(value):
    try:
        return json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return value
