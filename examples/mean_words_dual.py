"""A dual network in one file: a linear image head and a mean-of-word-embeddings caption encoder.
An example of a `vse` dual-network plug-in (the simplest one that learns), not a published model.

    vse check-network examples/mean_words_dual.py:MeanWordsDual --words
    vse train --features cache/demo_effnet_1c.h5 --network examples/mean_words_dual.py:MeanWordsDual \\
        --loss mh --run-dir runs/mean_words
    vse evaluate runs/mean_words/best.pt --features cache/demo_effnet_1c.h5 --split test

A dual network subclasses ``pipeline.networks.network.DualNetwork`` (``kind = "dual"``). It is built
as ``Class(config)`` from a ``NetworkConfig`` (feature_dim, set_size: 0 for one vector per image,
embed_dim, vocab_size or text_dim, and ``options``: its own ``Options`` dataclass, checked by the
base class) and owns two modules: ``image_encoder`` (images (B, D), or sets (B, K, D) when the
class says ``takes_sets = True``, → (B, E)) and ``text_encoder`` (word ids (B, T) or cached token
vectors (B, T, d), and lengths (B,), → (B, E)). The base class's ``forward`` gives both sides'
embeddings; the loss scores them by cosine, as evaluation does. Positions past a caption's length
are padding that it must never read.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.networks.network import DualNetwork


@dataclass(frozen=True)
class MeanWordsOptions:
    normalise: bool = True  # unit rows (cosine scores); False: raw embeddings


class LinearImages(nn.Module):
    """(B, D) image vectors → (B, E): one linear map."""

    def __init__(self, feature_dim: int, embed_dim: int, normalise: bool):
        super().__init__()
        self.fc = nn.Linear(feature_dim, embed_dim)
        self.normalise = normalise

    def forward(self, images):
        x = self.fc(images.to(self.fc.weight.dtype))
        return F.normalize(x, dim=-1) if self.normalise else x


class MeanWords(nn.Module):
    """Word ids (or cached token vectors) and lengths → the mean of the caption's valid words'
    vectors, then a linear map → (B, E)."""

    def __init__(self, config, normalise: bool):
        super().__init__()
        if config.vocab_size:
            self.embed = nn.Embedding(config.vocab_size, config.word_dim, padding_idx=0)
        self.fc = nn.Linear(config.word_dim if config.vocab_size else config.text_dim, config.embed_dim)
        self.normalise = normalise

    def forward(self, captions, lengths):
        words = self.embed(captions) if hasattr(self, "embed") else captions.to(self.fc.weight.dtype)
        lengths = lengths.to(words.device)
        mask = (torch.arange(words.shape[1], device=words.device)[None] < lengths[:, None]).to(words.dtype)
        mean = (words * mask[..., None]).sum(1) / lengths[:, None].to(words.dtype)  # padding never read
        x = self.fc(mean)
        return F.normalize(x, dim=-1) if self.normalise else x


class MeanWordsDual(DualNetwork):
    """One vector per side: a linear image head, the mean of a caption's word embeddings."""

    Options = MeanWordsOptions

    def __init__(self, config):
        super().__init__(config)
        self.image_encoder = LinearImages(config.feature_dim, config.embed_dim, self.options.normalise)
        self.text_encoder = MeanWords(config, self.options.normalise)
