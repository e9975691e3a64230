"""A loss by name: a built-in one (``core.registry.LOSSES``) or a user's own class given by its
import path, ``path/to/my_loss.py:MyLoss`` or ``package.module:MyLoss``.

A user's loss is any ``torch.nn.Module`` called as ``loss(img, cap, image_ids=None,
relevance=None)`` → scalar; subclassing ``losses.base.VseLoss`` is optional (it adds the input
checks and the same-image mask).  It may declare what a built-in loss declares on its class
(``loss_traits``): ``similarity``, ``uses_relevance``, ``collapse_value(global_batch)``. A
pairwise network (``networks.network``) gives the loss only the batch's score matrix: it trains
with a loss that has ``scored(scores, image_ids=None, relevance=None)`` (every subclass of
``VseLoss`` that does not declare ``needs_embeddings``).
Its parameters, if any, are trained with the model.  Only training imports the file: a
checkpoint holds the model, so evaluation never needs the loss.

Its options (``--loss-option``, ``loss_options:``) are its ``__init__``'s keywords; declared as a
built-in loss's are (an ``Options`` frozen dataclass of ``values.declare`` fields: a subclass of
``VseLoss`` extends ``VseLoss.Options``, and any other class receives them as keywords), they are
checked before the class is built, in one line naming the file and the option
(``values.declared_options``).
"""

from __future__ import annotations

import functools
import inspect
from typing import NamedTuple

import torch
from torch import nn

from pipeline.core.errors import VseError
from pipeline.core.plugin_import import class_file, is_import_path, plugin_class, user_code_error
from pipeline.core.registry import LOSSES
from pipeline.core.similarity import SIMILARITIES
from pipeline.core.values import declared_options, options_of
from pipeline.losses.base import build_loss


class LossTraits(NamedTuple):
    similarity: str          # a name of similarity.SIMILARITIES
    uses_relevance: bool
    collapse_value: float | None
    takes_scores: bool = True  # has ``scored(scores, image_ids, relevance)``: trains a pairwise network
    networks: int = 1        # copies of the network trained together (NCR: 2; networks.cotrain)
    sample_pass: bool = False  # wants every training pair's statistic before each epoch (NCR, DECL)
    takes_sample_ids: bool = False  # its call takes ``sample_ids=`` (per-sample state, keyed by caption id)
    starts: tuple = ()       # (what, first epoch) of each part of the method that waits (``VseLoss.starts``)


# VseError unless ``spec`` is a built-in name or has the form of an import path
check_loss_name = LOSSES.check


def loss_class(spec: str) -> type:
    """The class named by ``FILE.py:Class`` or ``package.module:Class`` (VseError otherwise)."""
    check_loss_name(spec)
    return plugin_class(spec, "loss")


def options_class(spec: str) -> type | None:
    """The ``Options`` dataclass a loss (a built-in name or an import path) is built from, or None."""
    check_loss_name(spec)
    return options_of(loss_class(spec) if is_import_path(spec) else LOSSES.get_part(spec))


def make_loss(spec: str, options: dict | None = None) -> nn.Module:
    """The loss ``spec`` (built-in name or import path) built with ``options``."""
    options = dict(options or {})
    check_loss_name(spec)
    if not is_import_path(spec):
        try:
            return build_loss(spec, **options)
        except ValueError as exc:
            raise VseError(str(exc)) from exc
    cls = loss_class(spec)
    declared = options_of(cls)
    if declared is not None:  # checked as a built-in loss's are: one line naming the file
        try:
            declared_options(declared, options, f"loss {spec}", error=VseError)
        except VseError as exc:
            raise VseError(str(exc), class_file(cls, spec)) from None
    try:
        loss = cls(**options)
    except Exception as exc:  # the user's class: whatever its own code raised, said in one line
        error = user_code_error(exc, f"cannot build {spec} with options {options}")
        if error is not None:
            raise error from exc
        if not isinstance(exc, (TypeError, ValueError)):
            raise
        raise VseError(f"cannot build {spec} with options {options} ({exc})",
                       class_file(cls, spec)) from exc
    try:
        loss_traits(loss, spec)  # fail now on a bad declaration, not after an epoch
    except Exception as exc:  # a declaration that is a property of the user's code
        error = user_code_error(exc, f"loss {spec}")
        if error is None:
            raise
        raise error from exc
    loss.register_forward_hook(functools.partial(_check_scalar, spec, class_file(cls, spec)))
    return loss


def _check_scalar(spec: str, where: str, module, args, value) -> None:
    """A forward hook on a user's loss: the trainer backpropagates a 0-d tensor; anything else is
    a VseError naming the loss and what it returned (``VseLoss`` checks its own ``value``)."""
    if isinstance(value, torch.Tensor) and value.ndim == 0:
        return
    got = f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
    raise VseError(f"loss {spec} returned {got}, not a 0-d tensor (a scalar)", where)


def loss_traits(loss: nn.Module, spec: str = "") -> LossTraits:
    """What the trainer needs to know about a loss, from what its class declares."""
    similarity = getattr(loss, "similarity", "cosine")
    if not isinstance(similarity, str) or similarity not in SIMILARITIES:
        raise VseError(f"loss {spec or type(loss).__name__} declares similarity {similarity!r}; "
                       f"expected one of {', '.join(SIMILARITIES)}")
    collapse = getattr(loss, "collapse_value", None)
    takes_scores = callable(getattr(loss, "scored", None)) and not getattr(loss, "needs_embeddings", False)
    name = spec or type(loss).__name__
    networks = getattr(loss, "networks", 1)
    if isinstance(networks, bool) or not isinstance(networks, int) or networks < 1:
        raise VseError(f"loss {name} declares networks={networks!r}; expected an integer >= 1")
    sample_pass = bool(getattr(loss, "sample_pass", False))
    hooks = ("sample_statistic", "begin_epoch")
    if sample_pass and not all(callable(getattr(loss, hook, None)) for hook in hooks):
        raise VseError(f"loss {name} declares sample_pass but lacks sample_statistic() or begin_epoch() "
                       "(see pipeline.losses.noisy.base.NoisyPairLoss)")
    takes_ids = "sample_ids" in inspect.signature(loss.forward).parameters
    if networks > 1 and not takes_scores:
        raise VseError(f"loss {name} trains {networks} networks together, so it must take their stacked "
                       "score matrices (scored())")
    starts = getattr(loss, "starts", None)
    begins = starts() if callable(starts) else {}
    if not isinstance(begins, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in begins.items()):
        raise VseError(f"loss {name}: starts() must return {{what: first epoch (int)}}, got {begins!r}")
    return LossTraits(similarity, bool(getattr(loss, "uses_relevance", False)),
                      collapse if callable(collapse) else None, takes_scores, networks, sample_pass,
                      takes_ids, tuple(begins.items()))
