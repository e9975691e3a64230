"""The network seam: what every network of `vse train --network` is, built-in or a user's own.

Two kinds (``registry.NETWORK_KINDS``), designed from two real cases:

- ``dual`` (VSE++, VSE∞; ``vse_model.VSEModel``): each side is encoded to one vector, and the
  score of a pair is their similarity. ``forward(images, *captions)`` → (image embeddings,
  caption embeddings); the trainer gathers them across processes and the loss scores them.
- ``pairwise`` (SGR, SAF; ``sgraf``): each side is encoded to local features (an image block,
  a caption block), and ``score(image_block, caption_block)`` gives the (Bi, Bc) scores of every
  pair, jointly. ``forward(images, captions, lengths)`` → the batch's (B, B) score matrix;
  the loss takes it (``VseLoss.scored``).

``PairwiseNetwork`` is the base class of pairwise networks: it owns the options (a frozen
dataclass per network, ``Options``: its own options, declared once, checked here), the build
from a ``NetworkConfig`` (what a checkpoint keeps to rebuild the network), the forward of a
training batch and the blocked scoring of evaluation. A subclass owns only ``encode_images``,
``encode_captions`` and ``score``. A user's network is ``FILE.py:Class`` (a subclass, or any
module with the same members); ``vse check-network`` runs its contract (``network_check``).

Inputs: images are sets ``(B, K, D)`` of member features (CNN grid cells, precomputed
regions); captions are ``(tokens (B, T) int64, lengths (B,))`` for a network with its own word
encoder (``vocab_size > 0``), or ``(token vectors (B, T, d), lengths)`` of `vse encode-text
--tokens` (``text_dim > 0``). Lengths stay on the CPU; positions >= length are padding.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import asdict, dataclass, field, fields

import torch
from torch import nn

from pipeline.core.errors import VseError
from pipeline.core.plugin_import import class_file, is_import_path, plugin_class, user_code_error
from pipeline.core.registry import NETWORK_KINDS, NETWORKS


@dataclass
class NetworkConfig:
    """What builds a pairwise network again (a checkpoint's ``model_config``)."""

    network: str                # a name of registry.NETWORKS, or FILE.py:Class
    feature_dim: int            # the size of an image member
    set_size: int               # members per image (K of the cache); layers over member slots need it
    embed_dim: int = 1024
    vocab_size: int = 0         # > 0: captions are word ids, encoded by the network's own GRU
    word_dim: int = 300
    text_dim: int = 0           # > 0: captions are cached token vectors of this size
    options: dict = field(default_factory=dict)  # the network's own options (its ``Options``)

    def __post_init__(self):
        if (self.vocab_size > 0) == (self.text_dim > 0):
            raise ValueError("a network reads word ids (vocab_size > 0) or token vectors (text_dim > 0), "
                             f"one of the two; got vocab_size {self.vocab_size}, text_dim {self.text_dim}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> NetworkConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    @property
    def similarity(self) -> str:
        return "cosine"  # the scores of a pairwise network are its own: no similarity of vectors


class PairwiseNetwork(nn.Module):
    """Base of networks that score an image–caption pair jointly (see the module's text)."""

    kind = "pairwise"
    Options = None               # a frozen dataclass of the network's own options, or None
    backbone = None              # no CNN inside (RC mode is for dual networks)
    eval_pair_budget = 1 << 22   # floats of one scoring chunk's largest intermediate (16 MB: cache-sized
                                 # chunks measured faster on a CPU than large ones)

    def __init__(self, config: NetworkConfig):
        super().__init__()
        self.config = config
        self.options = network_options(type(self), config.options, config.network)

    # ---- what a subclass owns
    def encode_images(self, images: torch.Tensor):
        """(B, K, D) member features → an image block (anything ``score`` reads)."""
        raise NotImplementedError

    def encode_captions(self, captions: torch.Tensor, lengths: torch.Tensor):
        """Word ids (B, T) or token vectors (B, T, d), and lengths (B,) → a caption block."""
        raise NotImplementedError

    def score(self, image_block, caption_block) -> torch.Tensor:
        """(Bi, Bc): the score of every image of the block with every caption of the block."""
        raise NotImplementedError

    # ---- what the base class gives
    def forward(self, images: torch.Tensor, captions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The (B, B) score matrix of a training batch: S[i, j] = score(image i, caption j).
        Members cached as float16 arrive as float32 (``at_least_float32``)."""
        image_block = self.encode_images(at_least_float32(images))
        return self.score(image_block, self.encode_captions(captions, lengths))

    def auxiliary_losses(self) -> dict:
        """Extra loss terms of the last forward pass (name → scalar), added to the loss and logged."""
        return {}

    def head_state_dict(self) -> dict:
        return self.state_dict()

    def pool_weights(self, sizes: dict | None = None) -> dict:
        return {}


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """float16 / bfloat16 features (a set cache's members) as float32; float32 and float64 as given."""
    return x.to(torch.promote_types(x.dtype, torch.float32)) if x.is_floating_point() else x


def network_kind(model: nn.Module) -> str:
    """``dual`` or ``pairwise``: what a model declares (``kind``); a model that declares nothing
    (VSE++'s before the seam) is dual."""
    kind = getattr(model, "kind", "dual")
    if kind not in NETWORK_KINDS:
        raise VseError(f"network {type(model).__name__} declares kind {kind!r}; expected "
                       f"{' or '.join(NETWORK_KINDS)}")
    return kind


def network_options(cls, given: dict | None, spec: str = "") -> object:
    """The ``Options`` of network class ``cls`` from ``given`` (name → value), checked: an unknown
    name or a wrong type is a VseError naming the network and its options."""
    given = dict(given or {})
    options_class = getattr(cls, "Options", None)
    if options_class is None:
        if given:
            raise VseError(f"network {spec or cls.__name__} has no options; got {', '.join(sorted(given))}")
        return None
    known = {f.name: f for f in dataclasses.fields(options_class)}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise VseError(f"network {spec or cls.__name__} has no option {', '.join(unknown)} "
                       f"(its options: {', '.join(known)})")
    checked = {}
    for name, value in given.items():
        default = known[name].default
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        else:
            ok = isinstance(value, type(default))
        if not ok:
            raise VseError(f"network {spec or cls.__name__}: option {name} must be like {default!r}, "
                           f"got {value!r}")
        checked[name] = value
    try:
        return options_class(**checked)
    except (TypeError, ValueError) as exc:
        raise VseError(f"network {spec or cls.__name__}: {exc}") from exc


def network_class(spec: str) -> type:
    """The class of a network name (registry.NETWORKS) or of an import path (a user's)."""
    NETWORKS.check(spec)
    return plugin_class(spec, "network") if is_import_path(spec) else NETWORKS.get_part(spec)


def build_network(config: NetworkConfig) -> nn.Module:
    """A pairwise network (built-in or a user's) from its config; VseError naming the class's
    file when a user's class cannot be built or is not a network."""
    cls = network_class(config.network)
    if getattr(cls, "kind", "dual") != "pairwise":
        raise VseError(f"network {config.network} is not a pairwise network (kind "
                       f"{getattr(cls, 'kind', 'dual')!r}); a dual network is built from a ModelConfig")
    users = is_import_path(config.network)
    try:
        model = cls(config)
    except Exception as exc:  # a user's class: whatever its own code raised, said in one line
        error = user_code_error(exc, f"cannot build network {config.network}") if users else None
        if error is not None:
            raise error from exc
        if not isinstance(exc, (TypeError, ValueError, RuntimeError)):
            raise
        raise VseError(f"cannot build network {config.network} ({str(exc).splitlines()[0][:160]})",
                       class_file(cls, config.network) if users else None) from exc
    for name in ("encode_images", "encode_captions", "score"):
        if not callable(getattr(model, name, None)):
            raise VseError(f"network {config.network} has no {name}(): a pairwise network encodes "
                           "images and captions into blocks and scores every pair of two blocks")
    if users:  # what the loss and the metrics read, checked where the user's network hands it over
        model.register_forward_hook(functools.partial(_check_score_matrix, config.network,
                                                      class_file(cls, config.network)))
    return model


def _check_score_matrix(spec: str, where: str, module, args, scores) -> None:
    """A forward hook on a user's network: ``forward(images, captions, lengths)`` gives the batch's
    (B, B) score matrix; anything else is a VseError naming the network and what it returned
    (a module-level function with no model inside, so a copy of the network checks itself)."""
    batch = len(args[0]) if args and isinstance(args[0], torch.Tensor) else None
    if isinstance(scores, torch.Tensor) and batch is not None and tuple(scores.shape) == (batch, batch):
        return
    got = f"shape {tuple(scores.shape)}" if isinstance(scores, torch.Tensor) else type(scores).__name__
    raise VseError(f"network {spec} returned scores of {got} for a batch of {batch} pairs; forward(images, "
                   f"captions, lengths) must give the ({batch}, {batch}) score matrix", where)
