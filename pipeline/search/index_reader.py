"""A search index folder of `vse index` read back (docs/ARCHITECTURE.md, "Search index"), and the
FAISS objects both its build (``index_build``) and its reader use.

``SearchIndex(path)`` checks the folder whole before FAISS parses a byte: ``meta.json`` (its
format, version and the type of every field read), the sha256 of ``items.h5`` and
``index.faiss`` against the ones recorded, the counts, the dimension and the FAISS class against
``kind``; then it applies the recorded search parameter (``SEARCH_PARAM``). Missing or altered
files are refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.core.errors import VseError
from pipeline.core.formats import SEARCH_INDEX
from pipeline.core.fsutil import FOLDER_META, file_sha256
from pipeline.core.registry import INDEX_KINDS
from pipeline.core.values import is_int
from pipeline.search.embeddings_file import GROUP_FIELD, GROUPS

FORMAT = SEARCH_INDEX.tag
ITEMS_FORMAT = "vse-index-items"
FAISS_FILE, ITEMS_FILE = "index.faiss", "items.h5"
RESCORE_FILE = "rescore.npz"  # `vse index --rescore`: the per-item correction (bias, qbnorm's active set)
KINDS = INDEX_KINDS


# ---------------------------------------------------------------------------- FAISS objects


def import_faiss():
    """The faiss module; a VseError saying how to install it when it is missing."""
    try:
        import faiss
    except ImportError as exc:  # pragma: no cover - the serve extra is missing
        raise VseError("vse index/search/serve need faiss: pip install -e '.[serve]'") from exc
    return faiss


SEARCH_PARAM = {"hnsw": "ef_search", "ivfpq": "nprobe"}  # the search-time knob of each kind


def set_search_params(index, kind: str, params: dict) -> None:
    if kind == "hnsw":
        index.hnsw.efSearch = int(params["ef_search"])
    elif kind == "ivfpq":
        index.nprobe = int(params["nprobe"])


def _faiss_kind(index) -> str | None:
    faiss = import_faiss()
    classes = (("hnsw", faiss.IndexHNSWFlat), ("ivfpq", faiss.IndexIVFPQ), ("flat", faiss.IndexFlatIP))
    for kind, cls in classes:
        if isinstance(index, cls):
            return kind
    return None


def read_faiss(path, sha256: str):
    """The FAISS index in ``path`` once its bytes are checked against ``sha256`` (FAISS never
    parses a file other than the one written). A mismatch or an unreadable file is a
    ``VseError``."""
    faiss = import_faiss()
    try:
        found = file_sha256(path)
    except OSError as exc:
        raise VseError(f"cannot read the FAISS index ({exc.strerror})", path) from exc
    if found != sha256:
        raise VseError("differs from the one recorded in meta.json (sha256): the index was altered", path)
    try:
        return faiss.read_index(str(path))
    except RuntimeError as exc:  # pragma: no cover - only a file FAISS itself wrote gets here
        problem = str(exc).strip().splitlines()[-1][:160]
        raise VseError(f"not a readable FAISS index ({problem})", path) from exc


# ---------------------------------------------------------------------------- reading


# The type of each meta.json field an index reads (None: the field may be null or absent).
_META_TYPES = {"complete": bool, "kind": str, "of": str, "dim": int, "count": int, "params": dict,
               "files": dict, "checkpoint_sha256": str, "checkpoint": (str, None), "image_root": (str, None),
               "recall": (dict, None), "embeddings": (dict, None), "build": (dict, None),
               "rescore": (dict, None)}


def _check_meta_types(meta: dict, meta_path) -> None:
    """Every field read has its type (a bool is not an int): an edited meta.json is refused in
    one line naming the field, never a KeyError or TypeError later."""
    for name, kinds in _META_TYPES.items():
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        value = meta.get(name)
        ok = (value is None and None in kinds) or any(
            k is not None and (is_int(value) if k is int else isinstance(value, k)) for k in kinds)
        if not ok:
            wanted = " or ".join("null" if k is None else k.__name__ for k in kinds)
            raise VseError(f"index metadata is incomplete or altered: {name} is {value!r}, not {wanted}",
                           meta_path)
    if meta["complete"] is not True:
        raise VseError("index metadata is incomplete or altered: complete is not true", meta_path)
    if meta["kind"] not in KINDS or meta["of"] not in GROUPS or meta["dim"] < 1 or meta["count"] < 0:
        raise VseError(f"index metadata is altered (kind {meta['kind']!r}, of {meta['of']!r}, dim "
                       f"{meta['dim']}, count {meta['count']})", meta_path)
    for name in (FAISS_FILE, ITEMS_FILE):
        entry = meta["files"].get(name)
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            raise VseError(f"index metadata is incomplete or altered: files.{name}.sha256 missing", meta_path)


class StoredCorrection:
    """A per-item correction against hubness stored with an index (`vse index --rescore`; the methods:
    pipeline.evaluation.rescore, docs/PROTOCOL.md "Re-scoring at test time"). The index holds each
    item's vector with one more column, ``-bias / scale``: a query searched as ``[q, 1]`` scores
    ``q·x - bias / scale``, the corrected score over ``scale``, so the index ranks by the corrected score
    as exactly as it ranks raw ones; searched as ``[q, 0]`` it scores the raw ``q·x``. csls subtracts the
    query's own mean of its k best raw scores (its ranking unchanged); qbnorm corrects a query only when
    its raw top-1 item is in the activation set, else answers the raw search."""

    def __init__(self, method: str, scale: float, active: np.ndarray | None = None,
                 query_k: int | None = None):
        self.method, self.scale, self.active, self.query_k = method, scale, active, query_k

    @property
    def label(self) -> str:
        return self.method

    @classmethod
    def read(cls, path: Path, meta: dict, meta_path) -> StoredCorrection:
        record, entry = meta["rescore"], meta["files"].get(RESCORE_FILE)
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            raise VseError(f"index metadata is incomplete or altered: files.{RESCORE_FILE}.sha256 missing",
                           meta_path)
        stored = path / RESCORE_FILE
        if not stored.is_file():
            raise VseError(f"index is missing {RESCORE_FILE}", path)
        if file_sha256(stored) != entry["sha256"]:
            raise VseError("differs from the one recorded in meta.json (sha256): the index was altered",
                           stored)
        scale, query_k = record.get("scale"), record.get("query_k")
        if not isinstance(scale, float) or scale <= 0 or not (query_k is None or is_int(query_k)):
            raise VseError(f"index metadata is altered: rescore scale {scale!r}, query_k {query_k!r}",
                           meta_path)
        with np.load(stored, allow_pickle=False) as arrays:
            active = arrays["active"].astype(bool) if "active" in arrays.files else None
        if (active is None) != (record.get("method") != "qbnorm") or \
                (active is not None and len(active) != meta["count"]):
            raise VseError(f"{RESCORE_FILE} does not hold the correction meta.json names: the index was "
                           "altered", meta_path)
        return cls(str(record.get("method")), scale, active, query_k)

    def search(self, index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows) of the corrected search (the raw search for a qbnorm query outside its set)."""
        ones, zeros = np.ones((len(queries), 1), np.float32), np.zeros((len(queries), 1), np.float32)
        scores, rows = index.search(np.hstack([queries, ones]), k)
        scores = self.scale * scores.astype(np.float64)
        if self.query_k:  # csls: minus the query's mean of its k best raw scores
            raw, _ = index.search(np.hstack([queries, zeros]), self.query_k)
            scores -= raw.astype(np.float64).mean(axis=1, keepdims=True)
        if self.active is not None:  # qbnorm: corrected only when the raw top-1 item is in the set
            raw, raw_rows = index.search(np.hstack([queries, zeros]), k)
            hit = self.active[raw_rows[:, 0]][:, None] & (raw_rows[:, :1] >= 0)
            scores, rows = np.where(hit, scores, raw), np.where(hit, rows, raw_rows)
        return scores.astype(np.float32), rows


class SearchIndex:
    """An index folder, checked whole on opening: ``search(queries, k)``, ``items``, ``meta``."""

    def __init__(self, path):
        import h5py

        self.path = Path(path)
        meta_path = self.path / FOLDER_META
        if not self.path.is_dir():
            raise VseError("not a search index folder (made by `vse index`)", self.path)
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise VseError(f"not a search index: no {FOLDER_META} (made by `vse index`)", self.path) from None
        except (OSError, ValueError) as exc:
            raise VseError(f"unreadable index metadata ({exc})", meta_path) from exc
        SEARCH_INDEX.check(meta, meta_path)
        _check_meta_types(meta, meta_path)
        self.kind, self.of, self.dim, self.count = meta["kind"], meta["of"], meta["dim"], meta["count"]
        self.params, self.checkpoint_sha256 = meta["params"], meta["checkpoint_sha256"]
        expected = {name: meta["files"][name]["sha256"] for name in (FAISS_FILE, ITEMS_FILE)}
        self.meta = meta

        items_path = self.path / ITEMS_FILE
        if not items_path.is_file():
            raise VseError(f"index is missing {ITEMS_FILE}", self.path)
        if file_sha256(items_path) != expected[ITEMS_FILE]:
            raise VseError("differs from the one recorded in meta.json (sha256): the index was altered",
                           items_path)
        with h5py.File(items_path, "r") as f:
            held = f.attrs.get("of")
            held = held.decode() if isinstance(held, bytes) else held
            if held != self.of or GROUP_FIELD[self.of] not in f or "ids" not in f:
                raise VseError(f"index metadata says it holds {self.of}, {ITEMS_FILE} holds {held}: "
                               "the index was altered", meta_path)
            self.ids = f["ids"].asstr()[()]
            self.shown = f[GROUP_FIELD[self.of]].asstr()[()]
            self.captions = f["captions"].asstr()[()] if "captions" in f else None
        if len(self.ids) != self.count or len(self.shown) != self.count:
            raise VseError(f"index metadata says {self.count} items, {ITEMS_FILE} holds {len(self.ids)}",
                           self.path)

        faiss_path = self.path / FAISS_FILE
        if not faiss_path.is_file():
            raise VseError(f"index is missing {FAISS_FILE}", self.path)
        self.index = read_faiss(faiss_path, expected[FAISS_FILE])
        if self.index.ntotal != self.count or self.index.ntotal != len(self.ids):
            raise VseError(f"the FAISS index holds {self.index.ntotal} vectors for {len(self.ids)} ids",
                           self.path)
        self.correction = StoredCorrection.read(self.path, meta, meta_path) if meta.get("rescore") else None
        if self.index.d != self.dim + (self.correction is not None):  # a correction: one column more
            raise VseError(f"the FAISS index is {self.index.d}-d, the metadata says {self.dim}", self.path)
        inner_product = import_faiss().METRIC_INNER_PRODUCT
        if _faiss_kind(self.index) != self.kind or self.index.metric_type != inner_product:
            raise VseError(f"the FAISS index is not the inner-product {self.kind} index the metadata names",
                           self.path)
        set_search_params(self.index, self.kind, self.params)
        self._rows = {item: row for row, item in enumerate(self.ids.tolist())}

    def row(self, item_id: str) -> int | None:
        return self._rows.get(item_id)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows), each (n, min(k, count)), best first; rows of -1 (an approximate
        index that found fewer) are cut from the results by ``hits``."""
        queries = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        if queries.shape[1] != self.dim:
            raise VseError(f"query vectors are {queries.shape[1]}-d, the index is {self.dim}-d", self.path)
        if self.correction is not None:
            return self.correction.search(self.index, queries, min(int(k), self.count))
        return self.index.search(queries, min(int(k), self.count))

    def hits(self, scores: np.ndarray, rows: np.ndarray) -> list[dict]:
        """One query's results: rank, id, score and path (images) or text (captions)."""
        name = GROUP_FIELD[self.of][:-1]  # path | text
        hits = [{"rank": rank, "id": str(self.ids[row]), "score": float(score), name: str(self.shown[row])}
                for rank, (score, row) in enumerate(((s, r) for s, r in zip(scores, rows) if r >= 0), 1)]
        if self.captions is not None:  # an image index that knows its images' captions
            for hit, row in zip(hits, (r for r in rows if r >= 0)):
                if self.captions[row]:
                    hit["caption"] = str(self.captions[row])
        return hits

    def info(self) -> dict:
        recall = self.meta.get("recall") or {}
        return {"of": self.of, "kind": self.kind, "params": self.params, "count": self.count, "dim": self.dim,
                "checkpoint_sha256": self.checkpoint_sha256, "recall_at": recall.get("at"),
                "recall": recall.get("value"), "exact": self.kind == "flat",
                "embeddings_sha256": (self.meta.get("embeddings") or {}).get("sha256"),
                "rescore": None if self.correction is None else self.correction.label,
                "created": (self.meta.get("build") or {}).get("created")}
