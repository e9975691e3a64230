"""The network seam: what every network of `vse train --network` is, built-in or a user's own.

Two kinds (``registry.NETWORK_KINDS``), designed from two real cases:

- ``dual`` (VSE++, VSE∞, VSRN; ``DualNetwork``): each side is encoded to one vector, and the
  score of a pair is their similarity. ``forward(images, *captions)`` → (image embeddings (B, E),
  caption embeddings (B, E)); the trainer gathers them across processes and the loss scores them.
- ``pairwise`` (SGR, SAF; ``PairwiseNetwork``): each side is encoded to local features (an image
  block, a caption block), and ``score(image_block, caption_block)`` gives the (Bi, Bc) scores of
  every pair, jointly. ``forward(images, captions, lengths)`` → the batch's (B, B) score matrix;
  the loss takes it (``VseLoss.scored``).

A network is its class and its declaration (``registry.NetworkSpec``: kind, defaults, ``Options``,
``check(config)``), which ``TrainConfig`` applies and checks without building anything. A built-in
network's declaration is a torch-free module beside its code (``vse_spec``, ``vsrn_spec``,
``sgraf_spec``) named by one ``registry.NETWORKS`` line; a user's network is ``FILE.py:Class``,
whose class declares the same as attributes (``kind``, ``defaults``, ``Options``, optionally a
static ``check(config)``): a subclass of ``PairwiseNetwork`` or ``DualNetwork`` has them.
``build_network`` builds either kind from a ``NetworkConfig`` (what a checkpoint keeps to rebuild
it); ``vse check-network`` runs either kind's contract (``network_check``).

The base classes own the options (a frozen dataclass per network, ``Options``: its own options,
declared once, checked here) and the forward. A ``PairwiseNetwork`` subclass owns only
``encode_images``, ``encode_captions`` and ``score`` (the base gives the training batch's forward
and the blocked scoring of evaluation); a ``DualNetwork`` subclass owns two modules,
``image_encoder`` (images → (B, E)) and ``text_encoder`` (a caption batch → (B, E)), which
evaluation and `vse embed` run one side at a time, and declares ``takes_sets``. VSE's own model
(``vse_model.VSEModel``, VSE++ / VSE∞ / VSRN) is a ``DualNetwork`` built from a ``ModelConfig``
(the head options of ``TrainConfig``: pools, projections, RC's CNN); every other network reads
cached features and is built from a ``NetworkConfig``.

Inputs: images are sets ``(B, K, D)`` of member features (CNN grid cells, precomputed regions),
or for a dual network that does not take sets one vector ``(B, D)`` each; captions are
``(tokens (B, T) int64, lengths (B,))`` for a network with its own word encoder (``vocab_size >
0``), or ``(token vectors (B, T, d), lengths)`` of `vse encode-text --tokens` (``text_dim > 0``).
Lengths stay on the CPU; positions >= length are padding.
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
    set_size: int               # members per image (K of the cache); layers over member slots need it;
                                # 0: one vector per image (a dual network that does not take sets)
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
        """A pairwise network's scores are its own (no similarity of vectors); a dual network's
        embeddings are scored by cosine (a user's network is trained with a cosine loss)."""
        return "cosine"

    @property
    def image_pool(self) -> str | None:
        """What pools an image's set (what evaluation checks a cache against): the network itself
        when its images are sets, None when they are one vector each."""
        return self.network if self.set_size else None


class Network(nn.Module):
    """What both kinds share: the declaration (kind, options, presets) and the hooks the trainer
    reads after a forward pass. A network subclasses ``DualNetwork`` or ``PairwiseNetwork``."""

    kind: str = ""
    Options = None               # a frozen dataclass of the network's own options, or None
    defaults: dict = {}          # TrainConfig options the network sets when they are left at their defaults
    backbone = None              # no CNN inside (RC mode is VSE's model's)

    def __init__(self, config):
        super().__init__()
        self.config = config
        if isinstance(config, NetworkConfig):  # VSE's own model: its ModelConfig holds its options
            self.options = network_options(type(self), config.options, config.network)

    def auxiliary_losses(self) -> dict:
        """Extra loss terms of the last forward pass (name → scalar), added to the loss and logged."""
        return {}

    def head_state_dict(self) -> dict:
        return self.state_dict()

    def pool_weights(self, sizes: dict | None = None) -> dict:
        return {}


class PairwiseNetwork(Network):
    """Base of networks that score an image–caption pair jointly (see the module's text)."""

    kind = "pairwise"
    eval_pair_budget = 1 << 22   # floats of one scoring chunk's largest intermediate (16 MB: cache-sized
                                 # chunks measured faster on a CPU than large ones)

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


class DualNetwork(Network):
    """Base of networks that encode each side to one vector (see the module's text): a subclass
    builds ``image_encoder`` and ``text_encoder`` (``nn.Module``s) in ``__init__``."""

    kind = "dual"
    takes_sets = False           # images are sets (B, K, D) of a set cache; False: one vector (B, D) each

    def forward(self, images: torch.Tensor, *captions):
        """(image embeddings (B, E), caption embeddings (B, E)) of a training batch. Members cached
        as float16 arrive as float32 (``at_least_float32``)."""
        return self.image_encoder(at_least_float32(images)), self.text_encoder(*captions)


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
    """The ``Options`` of network class ``cls`` from ``given`` (name → value), checked by the one check
    of a part's options (``values.declared_options``): an unknown name, a wrong type or a value out of
    range is a VseError naming the network and the option. None for a network without options."""
    from pipeline.core.values import declared_options

    owner, options_class = f"network {spec or cls.__name__}", getattr(cls, "Options", None)
    if options_class is not None and not dataclasses.is_dataclass(options_class):
        raise VseError(f"{owner} declares Options that are not a dataclass")
    options = declared_options(options_class, given, owner, error=VseError)
    return None if options_class is None else options


def network_class(spec: str) -> type:
    """The class of a network name (registry.NETWORKS) or of an import path (a user's)."""
    NETWORKS.check(spec)
    return plugin_class(spec, "network") if is_import_path(spec) else NETWORKS.get_part(spec)


# What each kind's class must have once built, and what it is for (a refusal names the first missing).
MEMBERS = {"pairwise": (("encode_images", "encode_captions", "score"),
                        "a pairwise network encodes images and captions into blocks and scores every pair "
                        "of two blocks"),
           "dual": (("image_encoder", "text_encoder"),
                    "a dual network encodes images and captions into one vector each, side by side")}


def build_network(config: NetworkConfig) -> nn.Module:
    """A network built from a ``NetworkConfig`` (built-in or a user's, either kind: its declaration
    says which); VseError naming the class's file when a user's class cannot be built or is not a
    network of its kind. VSE's own model is built from a ``ModelConfig`` (``vse_model``)."""
    declared = NETWORKS.spec(config.network)
    if declared.vse_heads:
        raise VseError(f"network {config.network} is VSE's model, built from a ModelConfig (vse_model), "
                       "not from a NetworkConfig")
    cls, kind = network_class(config.network), declared.kind
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
    names, purpose = MEMBERS[kind]
    for name in names:
        if not callable(getattr(model, name, None)):
            where = class_file(cls, config.network) if users and kind == "dual" else None
            raise VseError(f"network {config.network} has no {name}{'()' if kind == 'pairwise' else ''}: "
                           f"{purpose}", where)
    if users:  # what the loss and the metrics read, checked where the user's network hands it over
        check = _check_score_matrix if kind == "pairwise" else _check_embeddings
        model.register_forward_hook(functools.partial(check, config.network, class_file(cls, config.network)))
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


def _check_embeddings(spec: str, where: str, module, args, out) -> None:
    """A forward hook on a user's dual network: ``forward(images, *captions)`` gives (image embeddings
    (B, E), caption embeddings (B, E)); anything else is a VseError naming the network and what it
    returned."""
    batch = len(args[0]) if args and isinstance(args[0], torch.Tensor) else None
    pair = isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(x, torch.Tensor) for x in out)
    if pair and all(x.ndim == 2 and len(x) == batch for x in out) and out[0].shape[1] == out[1].shape[1]:
        return
    got = (", ".join(str(tuple(x.shape)) for x in out) if pair
           else f"{len(out)} outputs" if isinstance(out, (tuple, list)) else type(out).__name__)
    raise VseError(f"network {spec} returned {got} for a batch of {batch} pairs; forward(images, *captions) "
                   f"must give (image embeddings ({batch}, E), caption embeddings ({batch}, E))", where)
