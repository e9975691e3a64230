"""The joint-embedding model: image projection + GRU caption encoder (VSE++ architecture), or
a trained head over frozen caption vectors (cached caption features) instead of the GRU; an
image that is a set of vectors (CNN grid cells, precomputed regions) is pooled by a set head,
and the caption's words or cached token vectors by a set pool (VSE∞; ``pipeline.networks.heads``).

Pure torch: no file I/O. ``ModelConfig`` holds everything needed to rebuild a model from a
checkpoint; the optional ``backbone`` (RC mode) turns pixels into the features the image
projection expects, so the cached and end-to-end trainers share this one model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import torch
from torch import nn

from pipeline.core.errors import VseError
from pipeline.core.registry import LAST, PROJECTIONS
from pipeline.core.similarity import SIMILARITIES, is_order, is_probabilistic  # the one list of names
from pipeline.core.tokens import PAD_ID
from pipeline.networks.gaussian_head import GaussianText
from pipeline.networks.heads import GPO, BiGRUTextEncoder, SetImageHead, TokenSetTextEncoder
from pipeline.networks.layers import l2_normalize, load_word_vectors, pack_by_length
from pipeline.networks.network import DualNetwork, NetworkConfig, build_network
from pipeline.networks.set_augment import size_augment


@dataclass
class ModelConfig:
    vocab_size: int
    feature_dim: int
    embed_dim: int = 1024
    word_dim: int = 300
    num_layers: int = 1
    img_norm: bool = True          # False = the VSE0 variant with unnormalised images
    similarity: str = "cosine"     # "order"/"order-norm" = order embeddings (abs values, order score);
    #                                "csd": [mean, log-variance] embeddings (networks.gaussian_head)
    projection: str = "linear"     # "mlp" = ConVSE two-layer heads (feature → 2048 → embed)
    mlp_hidden: int = 2048
    text_dim: int = 0              # > 0: captions arrive as frozen vectors of this size (cached
    text_projection: str = "linear"  # caption features), embedded by this head instead of the GRU
    image_pool: str | None = None  # images are sets (B, K, D) pooled by this (registry.SET_POOLS name
    set_projection: str = "linear"  # or FILE.py:Class), members projected by this; None: vectors
    size_augment: str | None = None  # training drops set members by this rule (registry.SIZE_AUGMENT_RULES)
    text_pool: str = LAST          # "last": the GRU's last state (or the caption vector); a set pool:
    pool_options: dict = field(default_factory=dict)  # BiGRU states or cached token vectors pooled
    caption_loss_weight: float = 0.0  # > 0: VSRN's caption branch (networks.vsrn.CaptionDecoder) trains too
    network_options: dict = field(default_factory=dict)  # VSRN's (vsrn.VSRNOptions, variant resolved)

    def __post_init__(self):
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"similarity must be one of {SIMILARITIES}, got {self.similarity!r}")
        for name in ("projection", "text_projection"):
            if getattr(self, name) not in PROJECTIONS:
                raise ValueError(f"{name} must be one of {PROJECTIONS}, got {getattr(self, name)!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


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
    """A (cached or freshly computed) CNN feature into the joint space: a projection of one
    vector, or (``image_pool``) a set head over a set of vectors (B, K, D), which in training
    drops members at random by ``size_augment`` (VSE∞'s size augmentation)."""

    def __init__(self, cfg: ModelConfig, backbone: nn.Module | None = None):
        super().__init__()
        self.backbone = backbone
        self.normalize = cfg.img_norm or cfg.similarity != "cosine"
        self.use_abs = is_order(cfg.similarity)
        self.augment = cfg.size_augment
        self.log_variance = None  # a probabilistic similarity's variance branch (gaussian_head)
        probabilistic = is_probabilistic(cfg.similarity)
        if cfg.image_pool is None:
            self.proj = _projection(cfg.feature_dim, cfg.embed_dim, cfg.projection, cfg.mlp_hidden)
            if probabilistic:
                self.log_variance = _projection(cfg.feature_dim, cfg.embed_dim, cfg.projection,
                                                cfg.mlp_hidden)
        else:
            self.head = SetImageHead(cfg.feature_dim, cfg.embed_dim, projection=cfg.set_projection,
                                     pool=cfg.image_pool, pool_options=cfg.pool_options,
                                     no_imgnorm=not self.normalize, use_abs=self.use_abs)
            if probabilistic:
                self.log_variance = SetImageHead(cfg.feature_dim, cfg.embed_dim,
                                                 projection=cfg.set_projection, pool=cfg.image_pool,
                                                 pool_options=cfg.pool_options, no_imgnorm=True)

    @property
    def takes_sets(self) -> bool:
        return hasattr(self, "head")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.backbone(images) if self.backbone is not None else images
        # in the head's precision: float32 (whatever the features' type), float64 in a .double() model
        features = features.to(next((self.head if self.takes_sets else self.proj).parameters()).dtype)
        if not self.takes_sets:
            emb = self.proj(features)
            if self.normalize:
                emb = l2_normalize(emb)
            return self._with_variance(emb.abs() if self.use_abs else emb, features)
        lengths = torch.full((len(features),), features.shape[1], dtype=torch.int64)  # on the host
        if self.training and self.augment:
            # drawn from torch's generator: a checkpoint's RNG state makes a resumed run draw the same
            rng = np.random.default_rng(int(torch.randint(2 ** 62, (1,))))
            features, lengths = size_augment(features, lengths, rng=rng, rule=self.augment)
        return self._with_variance(self.head(features, lengths), features, lengths)

    def _with_variance(self, emb: torch.Tensor, *inputs) -> torch.Tensor:
        """``emb``, or ``[emb, log-variance]`` where the similarity is probabilistic."""
        if self.log_variance is None:
            return emb
        return torch.cat([emb, self.log_variance(*inputs)], dim=-1)


class TextEncoder(nn.Module):
    """Word embeddings → GRU → last valid hidden state → (optional head) → L2 norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.word_dim, padding_idx=PAD_ID)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)
        self.rnn = nn.GRU(cfg.word_dim, cfg.embed_dim, cfg.num_layers, batch_first=True)
        self.head = (_projection(cfg.embed_dim, cfg.embed_dim, "mlp", cfg.mlp_hidden)
                     if cfg.projection == "mlp" else None)
        self.use_abs = is_order(cfg.similarity)
        self.normalize = True  # False: a log-variance branch (gaussian_head)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``lengths`` belong on the CPU, where the packing reads them (lengths on a GPU cost a
        host sync).  The GRU runs in fp32 even under autocast, which would cast a cuDNN RNN to
        fp16 — under bf16 autocast too — and its gradients could underflow."""
        words = self.embed(tokens).to(self.rnn.weight_ih_l0.dtype)  # float64 in a .double() model
        with torch.autocast(device_type=tokens.device.type, enabled=False):
            _, hidden = self.rnn(pack_by_length(words, lengths.cpu()))
        emb = hidden[-1]  # (B, embed): the state after each caption's last real token
        if self.head is not None:
            emb = self.head(emb)
        emb = l2_normalize(emb) if self.normalize else emb
        return emb.abs() if self.use_abs else emb

    def load_word_vectors(self, vectors: torch.Tensor, mask: torch.Tensor) -> int:
        """Initialise rows where ``mask`` is true from ``vectors`` (V, word_dim); returns the count."""
        return load_word_vectors(self.embed, vectors, mask)


class VectorTextEncoder(nn.Module):
    """Frozen caption vectors (cached caption features) → trained head → L2 norm: the caption
    side when the sentence encoder is fixed and only the projection learns."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.proj = _projection(cfg.text_dim, cfg.embed_dim, cfg.text_projection, cfg.mlp_hidden)
        self.use_abs = is_order(cfg.similarity)
        self.normalize = True  # False: a log-variance branch (gaussian_head)

    def forward(self, vectors: torch.Tensor) -> torch.Tensor:
        emb = self.proj(vectors.float())
        emb = l2_normalize(emb) if self.normalize else emb
        return emb.abs() if self.use_abs else emb


def text_encoder_for(cfg: ModelConfig) -> nn.Module:
    """The caption side a config describes: a head over frozen vectors (or over frozen token
    vectors, pooled), or a GRU over word tokens (VSE++'s last state, or VSE∞'s BiGRU pooled).
    Its ``forward`` takes the caption input of a batch (``pipeline.data.captions``) unpacked. A
    probabilistic similarity's: two of them, mean and log-variance (``gaussian_head.GaussianText``)."""
    if is_probabilistic(cfg.similarity):
        return GaussianText(_text_encoder(cfg), _text_encoder(cfg))
    return _text_encoder(cfg)


def _text_encoder(cfg: ModelConfig) -> nn.Module:
    if cfg.text_pool == LAST:
        return VectorTextEncoder(cfg) if cfg.text_dim else TextEncoder(cfg)
    use_abs = is_order(cfg.similarity)
    if cfg.text_dim:
        return TokenSetTextEncoder(cfg.text_dim, cfg.embed_dim, pool=cfg.text_pool,
                                   pool_options=cfg.pool_options, use_abs=use_abs)
    return BiGRUTextEncoder(cfg.vocab_size, cfg.word_dim, cfg.embed_dim, cfg.num_layers,
                            pool=cfg.text_pool, pool_options=cfg.pool_options, use_abs=use_abs)


CNN_PREFIX = "image_encoder.backbone.cnn."


def join_state(head: dict, cnn: dict | None = None) -> dict:
    """A ``VSEModel`` state dict from its two parts as checkpoints keep them: the head
    (``head_state_dict()``) and, in RC mode, the CNN's own state dict."""
    return {**head, **{CNN_PREFIX + k: v for k, v in (cnn or {}).items()}}


class VSEModel(DualNetwork):
    """VSE's dual network (``networks.network``), built from a ``ModelConfig``: VSE++, VSE∞ and VSRN
    (their declarations: ``vse_spec``, ``vsrn_spec``); ``forward`` gives the embeddings of both sides."""

    def __init__(self, cfg: ModelConfig, backbone: nn.Module | None = None):
        super().__init__(cfg)
        self.image_encoder = ImageEncoder(cfg, backbone)
        self.text_encoder = text_encoder_for(cfg)
        self.caption_decoder = None
        self._auxiliary: dict = {}
        if cfg.caption_loss_weight:
            from pipeline.networks.vsrn import CaptionDecoder, vsrn_options

            options = vsrn_options(cfg.network_options)
            self.caption_decoder = CaptionDecoder(
                cfg.vocab_size, cfg.embed_dim, hidden=options.caption_hidden,
                word_dim=options.caption_word_dim, max_len=options.caption_max_len,
                dropout=options.caption_dropout)
            self._listed_twice = options.caption_params_twice

    def forward(self, images, *captions):
        """``captions``: the caption input of the batch, (tokens, lengths) or (vectors,). In
        training with VSRN's caption branch, its loss is kept for ``auxiliary_losses``."""
        img = self.image_encoder(images)
        if self.caption_decoder is not None and self.training:
            regions, mask, region_lengths = self.image_encoder.head.pool.last_regions
            loss = self.caption_decoder(regions, mask, *captions, region_lengths=region_lengths)
            self._auxiliary = {"caption": self.config.caption_loss_weight * loss}
        return img, self.text_encoder(*captions)

    def listed_twice(self) -> list:
        """The parameters the optimizer's list holds a second time (factories.trainable_parameters):
        VSRN's caption branch, as the authors' Adam list (``VSRNOptions.caption_params_twice``)."""
        if self.caption_decoder is None or not self._listed_twice:
            return []
        return list(self.caption_decoder.parameters())

    def auxiliary_losses(self) -> dict:
        """The network's own loss terms of the last training forward (name → scalar): VSRN's
        caption generation, weighted; empty otherwise."""
        terms, self._auxiliary = self._auxiliary, {}
        return terms

    @property
    def backbone(self) -> nn.Module | None:
        return self.image_encoder.backbone

    @property
    def takes_sets(self) -> bool:
        return self.image_encoder.takes_sets

    @torch.no_grad()
    def pool_weights(self, sizes: dict | None = None) -> dict:
        """The weights learned pools give each rank (VSE∞'s GPO), side ("image", "text") →
        table over sets of 1..n members (row n-1: a set of n, zero past it), n from ``sizes``
        or else the widest batch the pool has seen.  Empty for pools without weights (mean,
        max) or not yet run; a checkpoint keeps it under "pool_weights" for plots."""
        out = {}
        sides = (("image", getattr(self.image_encoder, "head", None)), ("text", self.text_encoder))
        for side, module in sides:
            pool = getattr(module, "pool", None)
            size = (sizes or {}).get(side) or getattr(pool, "largest_set", 0)
            if isinstance(pool, GPO) and size:
                out[side] = pool.weight_table(int(size)).float().cpu().tolist()
        return out

    def head_state_dict(self) -> dict:
        """Weights of the projection + text encoder (what RC mode and ConVSE init from)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("image_encoder.backbone.")}


def model_of_checkpoint(state: dict, checkpoint, backbone: nn.Module | None = None) -> VSEModel:
    """The model a checkpoint's state describes (``model_config``) with its weights: the head, and
    with ``backbone`` the CNN weights the checkpoint carries (an RC run). The one way a model is
    rebuilt from a checkpoint; one that does not fit its own description is a VseError naming it."""
    try:
        config = state["model_config"]
        if "co_trained" in config:  # k networks trained together (networks.cotrain)
            from pipeline.networks.cotrain import CoTrained

            model = CoTrained([_model_of_config(config) for _ in range(int(config["co_trained"]))])
            model.load_state_dict(state["model"])
            return model
        if "network" in config:  # a network built from a NetworkConfig (pairwise, or a user's dual): no CNN
            model = _model_of_config(config, backbone)
            model.load_state_dict(state["model"])
        else:  # VSRN's caption branch trains only: a model for inference is built without it
            model = _model_of_config({**config, "caption_loss_weight": 0.0}, backbone)
            cnn = state["backbone"]["state"] if backbone is not None else None
            head = {k: v for k, v in state["model"].items() if not k.startswith("caption_decoder.")}
            model.load_state_dict(join_state(head, cnn))
    except (TypeError, ValueError, RuntimeError, KeyError) as exc:
        raise VseError(f"checkpoint does not match the model it describes ({str(exc).splitlines()[0][:160]})",
                       checkpoint) from exc
    return model


def _model_of_config(config: dict, backbone: nn.Module | None = None):
    """The untrained network a checkpoint's ``model_config`` describes: a network built from a
    ``NetworkConfig`` (``network`` key, networks.network: pairwise, or a user's dual) or VSE's model."""
    if "network" in config:
        return build_network(NetworkConfig.from_dict(config))
    return VSEModel(ModelConfig.from_dict(config), backbone)
