"""The caption side of a run: one interface, three implementations.

- ``GRUCaptions``: tokens of a vocabulary, embedded by a GRU (``networks.vse_model.TextEncoder``, or
  VSE∞'s BiGRU pooled: ``heads.BiGRUTextEncoder``);
- ``CachedCaptionVectors``: frozen vectors of a caption-feature file (`vse encode-text`),
  held in memory and embedded by a trained head (``networks.vse_model.VectorTextEncoder``);
- ``CachedCaptionTokens``: frozen token vectors of a caption (`vse encode-text --tokens`), a
  padded batch and its lengths, pooled by a set pool (``heads.TokenSetTextEncoder``).

Both turn caption indices of the feature cache into the caption input of the model's text
encoder (``batch``) and embed them (``embed``); the trainer, validation and evaluation only
talk to this interface. What a checkpoint must remember of the caption side (the vocabulary,
or which caption features it needs) comes from ``checkpoint_entry``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from pipeline.core.config import with_old_defaults
from pipeline.core.errors import VseError
from pipeline.core.registry import LAST, TEXT_POOLS
from pipeline.data.cache import check_caption_fingerprint
from pipeline.data.caption_features import CaptionFeatures, CaptionTokenFeatures, caption_features_layout
from pipeline.data.caption_index import caption_fingerprint
from pipeline.text.vocabulary import TokenizedCaptions, Vocabulary


class CaptionEncoder(Protocol):
    vocab: Vocabulary | None
    host_inputs: tuple[int, ...]  # positions of ``batch()``'s tensors that stay on the CPU

    def batch(self, caption_ids: np.ndarray) -> tuple[torch.Tensor, ...]:
        """The text encoder's input for these captions (CPU tensors; picklable for workers)."""

    def embed(self, text_encoder: torch.nn.Module, caption_ids: np.ndarray,
              device: torch.device) -> torch.Tensor:
        """Embeddings of these captions by ``text_encoder`` (the model's caption side)."""

    def model_fields(self, cfg) -> dict:
        """The ``ModelConfig`` fields of this caption side, for training config ``cfg``."""

    def checkpoint_entry(self) -> dict:
        """What a checkpoint keeps to rebuild this caption side."""

    def save(self, run_dir: Path) -> None:
        """Files a run folder gets for it (the vocabulary)."""


class GRUCaptions:
    """Captions as token ids of a vocabulary (VSE++): padded batches + lengths."""

    host_inputs = (1,)  # the lengths stay on the CPU: pack_padded_sequence reads them there

    def __init__(self, vocab: Vocabulary, captions, max_tokens: int,
                 tokens: TokenizedCaptions | None = None):
        self.vocab = vocab
        self.tokens = tokens if tokens is not None else TokenizedCaptions.encode(vocab, captions, max_tokens)

    def batch(self, caption_ids):
        return self.tokens.batch(caption_ids)

    def embed(self, text_encoder, caption_ids, device):
        tokens, lengths = self.tokens.batch(caption_ids)
        return text_encoder(tokens.to(device), lengths)

    def model_fields(self, cfg) -> dict:
        return {"vocab_size": len(self.vocab), "word_dim": 50 if cfg.glove else cfg.word_dim}

    def checkpoint_entry(self) -> dict:
        return {"vocab": self.vocab.words}

    def save(self, run_dir: Path) -> None:
        self.vocab.save(Path(run_dir) / "vocab.json")


class CachedCaptionVectors:
    """Frozen caption vectors held in memory: a batch is one fancy index of a tensor."""

    vocab = None
    host_inputs = ()

    def __init__(self, file: CaptionFeatures, vectors: torch.Tensor):
        self.file = file
        self.vectors = vectors

    @classmethod
    def open(cls, path, captions, cache_path=None, expected: dict | None = None,
             checkpoint=None) -> CachedCaptionVectors:
        """The vectors of ``path`` for ``captions`` (the feature cache's, in order), refused in
        one line when made for other captions, or by another model than ``expected`` (the
        entry of the checkpoint being resumed or evaluated)."""
        file = CaptionFeatures(path)
        check_caption_fingerprint(caption_fingerprint(captions), file.attrs, file.path,
                                  "caption-feature file", cache_path or "the feature cache")
        if expected is not None:
            check_entry(file, expected, checkpoint)
        return cls(file, torch.from_numpy(file.vectors()))

    def batch(self, caption_ids):
        return (self.vectors[torch.as_tensor(caption_ids)],)

    def embed(self, text_encoder, caption_ids, device):
        return text_encoder(self.vectors[torch.as_tensor(caption_ids)].to(device))

    def model_fields(self, cfg) -> dict:
        if cfg.text_pool != LAST:
            raise VseError(f"--text-pool {cfg.text_pool} pools the token vectors of each caption, but this "
                           "file holds one vector per caption: make one with `vse encode-text --tokens`",
                           self.file.path)
        return {"vocab_size": 0, "text_dim": self.file.dim, "text_projection": cfg.text_projection}

    def checkpoint_entry(self) -> dict:
        return {"vocab": [], "text_features": self.file.entry()}

    def save(self, run_dir: Path) -> None:
        pass


class CachedCaptionTokens(CachedCaptionVectors):
    """Frozen token vectors of each caption held in memory (``CaptionTokenFeatures``): a batch
    is a padded (B, T, d) tensor and the lengths (B,), gathered without a loop."""

    host_inputs = (1,)  # the lengths stay on the CPU: the pool's packing reads them there

    def __init__(self, file: CaptionTokenFeatures):
        self.file = file

    @classmethod
    def open(cls, path, captions, cache_path=None, expected: dict | None = None,
             checkpoint=None) -> CachedCaptionTokens:
        file = CaptionTokenFeatures(path, captions, cache_path)  # other captions: refused here
        if expected is not None:
            check_entry(file, expected, checkpoint)
        return cls(file)

    def batch(self, caption_ids):
        return self.file.batch(caption_ids)

    def embed(self, text_encoder, caption_ids, device):
        vectors, lengths = self.file.batch(caption_ids)
        return text_encoder(vectors.to(device), lengths)  # the lengths stay on the host

    def model_fields(self, cfg) -> dict:
        if cfg.text_pool == LAST:
            raise VseError("this file holds the token vectors of each caption: pool them with --text-pool "
                           f"({', '.join(p for p in TEXT_POOLS if p != LAST)} or your own)", self.file.path)
        return {"vocab_size": 0, "text_dim": self.file.dim}


def open_caption_features(path, captions, cache_path=None, expected: dict | None = None, checkpoint=None):
    """The caption side of a caption-feature file, by its layout: one vector per caption, or
    the token vectors of each caption."""
    kind = CachedCaptionTokens if caption_features_layout(path) == "tokens" else CachedCaptionVectors
    return kind.open(path, captions, cache_path, expected=expected, checkpoint=checkpoint)


def check_entry(file: CaptionFeatures, expected: dict, checkpoint=None) -> None:
    """``file`` holds vectors of the model a checkpoint was trained with."""
    found = file.entry()
    if found["model_identity"] != expected["model_identity"]:
        saved, now = json.loads(expected["model_identity"]), json.loads(found["model_identity"])
        differ = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
        raise VseError(f"caption features of model {found['model']!r} ({', '.join(differ)} differ), but "
                       f"{checkpoint or 'the run'} was trained on {expected['model']!r} features "
                       f"({expected['path']})", file.path)


def checkpoint_captions(state: dict, captions, cache_path=None, text_features=None,
                        checkpoint=None) -> CaptionEncoder:
    """The caption side of a saved model for a feature cache's ``captions``: its vocabulary,
    or the caption features it names (``text_features`` overrides the path it names)."""
    entry = state.get("text_features")
    if entry:
        path = text_features or entry["path"]
        if not Path(path).is_file():
            raise VseError(f"{checkpoint or 'the checkpoint'} needs the caption features {entry['path']} "
                           f"({entry['model']}): not found; give --text-features", path)
        return open_caption_features(path, captions, cache_path, expected=entry, checkpoint=checkpoint)
    if text_features:
        raise VseError(f"{checkpoint or 'the checkpoint'} embeds tokens with its GRU: it takes no "
                       "--text-features", text_features)
    max_tokens = max_caption_tokens(state)
    return GRUCaptions(Vocabulary(state["vocab"]), captions, max_tokens)


def max_caption_tokens(state: dict) -> int:
    """The token limit a checkpoint's GRU captions were cut at (its config, old runs' default)."""
    return with_old_defaults(state["train_config"])["max_caption_tokens"]


def caption_key(state: dict, text_features=None) -> tuple:
    """Checkpoints with equal keys get the same caption side on one cache (shared when
    evaluating many runs): the vocabulary and token limit, or the caption features and model."""
    entry = state.get("text_features")
    if entry:
        path = Path(text_features or entry["path"]).resolve()
        return (entry.get("layout", "vectors"), str(path), entry["model_identity"])
    words = hashlib.sha1("\n".join(state["vocab"]).encode("utf-8")).hexdigest()
    return ("vocabulary", words, max_caption_tokens(state))
