"""The base of every loss and what the registry builds from: ``VseLoss`` (the checks, the
options, the masks every loss shares), ``Batch`` (what a loss's ``value`` reads), ``build_loss``
and ``LOSS_NAMES`` (the built-in names, ``core.registry.LOSSES``: each name's class lives in the
file of its family: ``hinge``, ``lseh``, ``ladder``, ``convse``, ``contrastive``, ``noisy/``).

The definitions are those of ``docs/PROTOCOL.md``.  Every loss is called as
``loss(img_emb, cap_emb, image_ids=None, relevance=None)`` on a batch of B pairs
(row i of both is a positive pair) and returns a scalar:

- ``S[i, j] = s(image_i, caption_j)``: the inner product (cosine, since the model
  L2-normalises) or, for ``order``, ``-||max(0, c - i)||^2`` on the given embeddings
  (``core.similarity.order_scores``).
- ``image_ids`` (B,) names each pair's image.  Pairs (i, j) with the same image are not
  negatives (unless ``mask_same_image=False``): several captions of one image may share a
  batch, and pushing them apart would punish correct matches.
- ``relevance`` (B, B) is the caption–caption relevance of the batch (``lseh``, ``ladder``).
- Hinge family (sh, mh, order, lseh, ladder): the sum over the batch, as VSE++.
  Contrastive family (csn, cmn, mvn): the mean over the batch, temperature ``tau``.

``core.registry.LOSSES`` (name → "module:Class") is the one list of the built-in losses: the
CLI's choices, config validation, the docs and the tests derive from it. What a loss is lives on
its class: ``name``, ``similarity`` (a name of ``core.similarity.SIMILARITIES``: how the model's
embeddings are scored, in training and evaluation), ``uses_relevance`` (the trainer then
needs a relevance file) and ``collapse_value(global_batch)`` (the value when all embeddings
are equal, for the trainer's warning; None: no warning), and its options, ``Options`` (a frozen
dataclass of ``values.declare`` fields: defaults, ranges, choices; ``VseLoss`` checks them).  A
user's own loss (any ``nn.Module`` with this call; ``pipeline.losses.plugins``) may declare the
same attributes.

The similarity and the loss are computed in float32 (float64 for float64 inputs) with
autocast disabled: a B × B table is cheap, and hinges of bf16 scores are too coarse.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from pipeline.core import registry, values
from pipeline.core.errors import VseError
from pipeline.core.plugin_import import class_file
from pipeline.core.similarity import image_caption_scores
from pipeline.core.values import declare


def build_loss(name: str, **options) -> nn.Module:
    """The built-in loss ``name`` (one of ``LOSS_NAMES``) with its options (its ``Options``);
    ValueError for an unknown name or option, or a wrong value."""
    if name not in LOSS_NAMES:
        raise ValueError(f"unknown loss {name!r} (known: {', '.join(LOSS_NAMES)})")
    return registry.LOSSES.get_part(name)(**options)


def options_signature(options_class) -> inspect.Signature:
    """``(self, *, name=default, ...)``: the signature of a loss built from ``options_class``."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    return inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
                             + [inspect.Parameter(f.name, keyword, default=f.default)
                                for f in dataclasses.fields(options_class)])


class Batch(NamedTuple):
    """What every loss needs, prepared once by ``VseLoss.forward``."""

    img: torch.Tensor | None   # (B, D); None for a batch given as its scores (``VseLoss.scored``)
    cap: torch.Tensor | None   # (B, D)
    scores: torch.Tensor       # (B, B) S[i, j] = s(image_i, caption_j)
    same_image: torch.Tensor   # (B, B) bool, pairs of the same image (diagonal included)
    negatives: torch.Tensor    # (B, B) bool, pairs that count as negatives
    relevance: torch.Tensor | None
    sample_ids: torch.Tensor | None = None  # (B,) each pair's caption id, for a loss with per-sample state
    stacked: torch.Tensor | None = None     # (k, B, B) the scores of k networks trained together


class VseLoss(nn.Module):
    """Common input checks, the options and batch preparation; subclasses define ``value(batch)``.

    A loss's options are its ``Options``, a frozen dataclass of ``values.declare`` fields that
    extends its base class's (``class Options(VseLoss.Options): ...``): the loss is built as
    ``Loss(**options)``, and this class checks them (``values.declared_options``: an unknown name,
    a wrong type, a value out of range or choices; the dataclass's ``__post_init__`` for rules
    between options), keeps them as ``self.options`` and sets each as an attribute
    (``self.margin``). A subclass's ``__init__(**options)``, if any, only derives its state
    (parameters, buffers) from them after ``super().__init__(**options)``."""

    name = ""                  # the registry name of a built-in loss
    similarity = "cosine"      # the score S of the embeddings (similarity.SIMILARITIES)
    uses_relevance = False
    needs_embeddings = False   # reads the embeddings, not only S: no loss of a pairwise network

    @dataclass(frozen=True)
    class Options:
        mask_same_image: bool = declare(True, "Pairs of the same image are no negatives (false: only the "
                                              "diagonal is a positive).")

    def __init__(self, *args, **options):
        super().__init__()
        names = [f.name for f in dataclasses.fields(self.Options)]
        if len(args) > len(names) or set(names[:len(args)]) & set(options):
            raise TypeError(f"{type(self).__name__} takes its options by name ({', '.join(names)})")
        options.update(zip(names, args))  # positional: in field order (VseLoss(mask_same_image))
        owner = f"loss {self.name or type(self).__name__}"
        self.options = values.declared_options(self.Options, options, owner)
        for name in names:
            setattr(self, name, getattr(self.options, name))
        self.epoch = 0

    def __init_subclass__(cls, **kwargs):
        """A subclass's ``__init__`` that takes its options as ``**options`` shows them as its
        signature (``inspect.signature``, help()): the fields of its ``Options``, with their defaults."""
        super().__init_subclass__(**kwargs)
        clashes = [f.name for f in dataclasses.fields(cls.Options) if hasattr(cls, f.name)]
        if clashes:
            raise TypeError(f"{cls.__name__}: options named as attributes of the loss: {', '.join(clashes)}")
        init = vars(cls).get("__init__")
        if init is None:
            inherited = cls.__init__

            def init(self, *args, **options):
                inherited(self, *args, **options)

            init.__qualname__, cls.__init__ = f"{cls.__qualname__}.__init__", init
        parameters = list(inspect.signature(init).parameters.values())[1:]
        if all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
            init.__signature__ = options_signature(cls.Options)

    def set_epoch(self, epoch: int) -> None:
        """Told by the trainer at the start of each (0-based) epoch."""
        self.epoch = int(epoch)

    def collapse_value(self, global_batch: int) -> float | None:
        """The loss when every embedding is equal (a collapsed model), or None: no warning."""
        return None

    def starts(self) -> dict[str, int]:
        """When each part of the method begins: {what: the first epoch, 0-based, it acts in}, for
        the parts that wait (a warm-up first). A run whose epochs end before one of them trains
        another method under this loss's name; ``training.settings.unreached_phases`` says so for
        every run, sweep, tune and report (issue 49). A user's loss may declare the same method."""
        return {}

    def score_matrix(self, img: torch.Tensor, cap: torch.Tensor) -> torch.Tensor:
        """S[i, j] = s(image_i, caption_j) for the declared ``similarity``."""
        return image_caption_scores(img, cap, self.similarity)

    def value(self, batch: Batch) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, img_emb, cap_emb, image_ids=None, relevance=None) -> torch.Tensor:
        return self._embedded(img_emb, cap_emb, image_ids, relevance)

    def _embedded(self, img_emb, cap_emb, image_ids, relevance, **extra) -> torch.Tensor:
        if img_emb.ndim != 2 or img_emb.shape != cap_emb.shape or len(img_emb) == 0:
            raise ValueError("img_emb and cap_emb must both be (B, D) with B >= 1, got "
                             f"{tuple(img_emb.shape)} and {tuple(cap_emb.shape)}")
        dtype = torch.float64 if img_emb.dtype == torch.float64 else torch.float32
        with torch.autocast(device_type=img_emb.device.type, enabled=False):
            img, cap = img_emb.to(dtype), cap_emb.to(dtype)
            return self._value(self.score_matrix(img, cap), image_ids, relevance, img, cap, **extra)

    def scored(self, scores, image_ids=None, relevance=None) -> torch.Tensor:
        """The loss of a batch given as its (B, B) score matrix ``S[i, j] = s(image_i, caption_j)``
        (a network that scores pairs jointly, ``networks.network``). A loss that reads the
        embeddings themselves (``needs_embeddings``) cannot take one."""
        return self._scored(scores, image_ids, relevance)

    def _scored(self, scores, image_ids, relevance, stacked=None, **extra) -> torch.Tensor:
        if self.needs_embeddings:
            raise ValueError(f"loss {self.name or type(self).__name__} compares the embeddings themselves; "
                             "it cannot train on a score matrix")
        if scores.ndim != 2 or scores.shape[0] != scores.shape[1] or len(scores) == 0:
            raise ValueError(f"scores must be (B, B) with B >= 1, got {tuple(scores.shape)}")
        dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
        with torch.autocast(device_type=scores.device.type, enabled=False):
            stacked = stacked.to(dtype) if stacked is not None else None
            return self._value(scores.to(dtype), image_ids, relevance, stacked=stacked, **extra)

    def _value(self, scores, image_ids, relevance, img=None, cap=None, sample_ids=None,
               stacked=None) -> torch.Tensor:
        """The checks and the masks every loss shares, then the subclass's ``value``."""
        size, device, dtype = len(scores), scores.device, scores.dtype
        if self.uses_relevance:
            if relevance is None:
                raise ValueError(f"loss {type(self).__name__} needs the batch relevance "
                                 "(pass relevance=, a B × B caption–caption matrix)")
            relevance = torch.as_tensor(relevance, device=device).to(dtype)
            if relevance.shape != (size, size):
                raise ValueError(f"relevance must be {size} × {size}, "
                                 f"got {tuple(relevance.shape)}")
        else:
            relevance = None
        if sample_ids is not None:
            sample_ids = torch.as_tensor(sample_ids, device=device)
            if sample_ids.shape != (size,):
                raise ValueError(f"sample_ids must have shape ({size},), got {tuple(sample_ids.shape)}")
        same_image, negatives = self.pair_masks(size, image_ids, device)
        value = self.value(Batch(img, cap, scores, same_image, negatives, relevance, sample_ids, stacked))
        if not (isinstance(value, torch.Tensor) and value.ndim == 0):
            raise _not_a_scalar(self, value)
        return value

    def pair_masks(self, size: int, image_ids, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(same_image, negatives), both (B, B) bool: the pairs of one image (the diagonal
        included), and the pairs that count as negatives (``mask_same_image``)."""
        positives = torch.eye(size, dtype=torch.bool, device=device)
        same_image = positives
        if image_ids is not None:
            image_ids = torch.as_tensor(image_ids, device=device)
            if image_ids.shape != (size,):
                raise ValueError(f"image_ids must have shape ({size},), "
                                 f"got {tuple(image_ids.shape)}")
            same_image = (image_ids[:, None] == image_ids[None, :]) | positives
        return same_image, (~same_image if self.mask_same_image else ~positives)


def with_positives(negatives):
    """The pairs a query's softmax or evidence counts: its negatives and its own positive (the
    diagonal)."""
    return negatives | torch.eye(len(negatives), dtype=torch.bool, device=negatives.device)


def _not_a_scalar(loss: VseLoss, value) -> Exception:
    """What a loss whose ``value`` is not a 0-d tensor raises: a user's subclass, one line naming its
    file (``VseError``); a built-in one, a bug of vse (ValueError, with its traceback)."""
    got = f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
    message = f"loss {loss.name or type(loss).__name__}: value() returned {got}, not a 0-d tensor (a scalar)"
    if type(loss).__module__.split(".")[0] == "pipeline":
        return ValueError(message)
    return VseError(message, class_file(type(loss), type(loss).__name__))


LOSS_NAMES = registry.LOSSES.names
