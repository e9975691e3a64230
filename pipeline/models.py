"""The joint-embedding model: image projection + GRU caption encoder (VSE++ architecture).

Pure torch: no file I/O. ``ModelConfig`` holds everything needed to rebuild a model from a
checkpoint; the optional ``backbone`` (RC mode) turns pixels into the features the image
projection expects, so the cached and end-to-end trainers share this one model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

SIMILARITIES = ("cosine", "order")


@dataclass
class ModelConfig:
    vocab_size: int
    feature_dim: int
    embed_dim: int = 1024
    word_dim: int = 300
    num_layers: int = 1
    img_norm: bool = True          # False = the VSE0 variant with unnormalised images
    similarity: str = "cosine"     # "order" = order embeddings (abs values, order similarity)
    projection: str = "linear"     # "mlp" = ConVSE two-layer heads (feature → 2048 → embed)
    mlp_hidden: int = 2048

    def __post_init__(self):
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"similarity must be one of {SIMILARITIES}, got {self.similarity!r}")
        if self.projection not in ("linear", "mlp"):
            raise ValueError(f"projection must be 'linear' or 'mlp', got {self.projection!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def l2_normalize(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return F.normalize(x, p=2, dim=dim, eps=1e-8)


def _projection(in_dim: int, out_dim: int, kind: str, hidden: int) -> nn.Module:
    if kind == "linear":
        layer = nn.Linear(in_dim, out_dim)
        # VSE++ init: uniform Xavier on the weight, zero bias.
        bound = math.sqrt(6.0) / math.sqrt(in_dim + out_dim)
        nn.init.uniform_(layer.weight, -bound, bound)
        nn.init.zeros_(layer.bias)
        return layer
    head = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, out_dim))
    for m in head:
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)
    return head


class ImageEncoder(nn.Module):
    """Projection of a (cached or freshly computed) CNN feature into the joint space."""

    def __init__(self, cfg: ModelConfig, backbone: nn.Module | None = None):
        super().__init__()
        self.backbone = backbone
        self.proj = _projection(cfg.feature_dim, cfg.embed_dim, cfg.projection, cfg.mlp_hidden)
        self.normalize = cfg.img_norm or cfg.similarity == "order"
        self.use_abs = cfg.similarity == "order"

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.backbone(images) if self.backbone is not None else images
        emb = self.proj(features.float())
        if self.normalize:
            emb = l2_normalize(emb)
        return emb.abs() if self.use_abs else emb


class TextEncoder(nn.Module):
    """Word embeddings → GRU → last valid hidden state → (optional head) → L2 norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.word_dim, padding_idx=0)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)
        self.rnn = nn.GRU(cfg.word_dim, cfg.embed_dim, cfg.num_layers, batch_first=True)
        self.head = (_projection(cfg.embed_dim, cfg.embed_dim, "mlp", cfg.mlp_hidden)
                     if cfg.projection == "mlp" else None)
        self.use_abs = cfg.similarity == "order"

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(self.embed(tokens), lengths.cpu(), batch_first=True,
                                      enforce_sorted=False)
        _, hidden = self.rnn(packed)
        emb = hidden[-1]  # (B, embed): the state after each caption's last real token
        if self.head is not None:
            emb = self.head(emb)
        emb = l2_normalize(emb)
        return emb.abs() if self.use_abs else emb

    def load_word_vectors(self, vectors: torch.Tensor, mask: torch.Tensor) -> int:
        """Initialise rows where ``mask`` is true from ``vectors`` (V, word_dim); returns the count."""
        with torch.no_grad():
            self.embed.weight[mask] = vectors[mask].to(self.embed.weight)
        return int(mask.sum())


class VSEModel(nn.Module):
    def __init__(self, cfg: ModelConfig, backbone: nn.Module | None = None):
        super().__init__()
        self.config = cfg
        self.image_encoder = ImageEncoder(cfg, backbone)
        self.text_encoder = TextEncoder(cfg)

    def forward(self, images, tokens, lengths):
        return self.image_encoder(images), self.text_encoder(tokens, lengths)

    def head_state_dict(self) -> dict:
        """Weights of the projection + text encoder (what RC mode and ConVSE init from)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("image_encoder.backbone.")}
