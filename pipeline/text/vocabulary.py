"""Caption tokenisation and the vocabulary (stored as JSON, never pickled).

Captions are tokenised once into a compact CSR layout (one flat int32 array + offsets), so a
566k-caption corpus costs a few MB and no work is repeated per epoch.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.core.errors import VseError
from pipeline.core.fsutil import atomic_path
from pipeline.core.tokens import END, SPECIALS, START, UNK

_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(caption: str) -> list[str]:
    """Lowercased alphanumeric words; punctuation dropped."""
    return _TOKEN.findall(caption.lower())


class Vocabulary:
    """Word ↔ id mapping. Ids 0..3 are <pad>, <start>, <end>, <unk> (the VSE++ convention)."""

    def __init__(self, words):
        words = list(words)
        if tuple(words[: len(SPECIALS)]) != SPECIALS:
            raise VseError(f"vocabulary must start with {SPECIALS}")
        self.words = words
        self.index = {w: i for i, w in enumerate(words)}
        if len(self.index) != len(words):
            raise VseError("vocabulary has duplicate words")

    @classmethod
    def build(cls, captions, min_count: int = 4) -> "Vocabulary":
        counts = Counter(tok for cap in captions for tok in tokenize(cap))
        kept = sorted(w for w, c in counts.items() if c >= min_count and w not in SPECIALS)
        return cls(list(SPECIALS) + kept)

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, caption: str) -> list[int]:
        unk = self.index[UNK]
        return [self.index[START], *(self.index.get(t, unk) for t in tokenize(caption)), self.index[END]]

    def save(self, path) -> None:
        with atomic_path(path) as tmp:
            Path(tmp).write_text(json.dumps({"format": "vse-vocab", "words": self.words}))

    @classmethod
    def load(cls, path) -> "Vocabulary":
        try:
            payload = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise VseError(f"cannot read vocabulary ({exc})", path) from exc
        if not isinstance(payload, dict) or payload.get("format") != "vse-vocab":
            raise VseError("not a vse vocabulary file", path)
        return cls(payload["words"])


@dataclass
class TokenizedCaptions:
    """All captions as token ids: caption j is ``ids[offsets[j]:offsets[j+1]]``."""

    ids: np.ndarray      # int32, flat
    offsets: np.ndarray  # int64, len = n + 1

    @classmethod
    def encode(cls, vocab: Vocabulary, captions, max_len: int | None = None) -> "TokenizedCaptions":
        encoded = [vocab.encode(c) for c in captions]
        if max_len is not None:  # keep <start> … <end> framing when truncating very long captions
            encoded = [e if len(e) <= max_len else e[: max_len - 1] + e[-1:] for e in encoded]
        lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter((t for e in encoded for t in e), dtype=np.int32, count=int(offsets[-1]))
        return cls(flat, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded LongTensor (B, T) and lengths (B,) for the given caption indices."""
        indices = np.asarray(indices, dtype=np.int64)
        starts, stops = self.offsets[indices], self.offsets[indices + 1]
        lengths = stops - starts
        positions = np.arange(int(lengths.max(initial=1)))
        valid = positions[None, :] < lengths[:, None]
        out = np.zeros(valid.shape, dtype=np.int64)
        out[valid] = self.ids[(starts[:, None] + positions[None, :])[valid]]
        return torch.from_numpy(out), torch.from_numpy(lengths)
