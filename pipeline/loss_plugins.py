"""A loss by name: a built-in one (``losses.LOSSES``) or a user's own class given by its
import path, ``path/to/my_loss.py:MyLoss`` or ``package.module:MyLoss``.

A user's loss is any ``torch.nn.Module`` called as ``loss(img, cap, image_ids=None,
relevance=None)`` → scalar; subclassing ``losses.VseLoss`` is optional (it adds the input
checks and the same-image mask).  It may declare what a built-in loss declares on its class
(``loss_traits``): ``similarity``, ``uses_relevance``, ``collapse_value(global_batch)``.
Its parameters, if any, are trained with the model.  Only training imports the file: a
checkpoint holds the model, so evaluation never needs the loss.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import NamedTuple

from torch import nn

from .errors import VseError
from .losses import LOSS_NAMES, build_loss
from .metrics import SIMILARITIES


class LossTraits(NamedTuple):
    similarity: str          # a name of metrics.SIMILARITIES
    uses_relevance: bool
    collapse_value: float | None


def is_import_path(spec: str) -> bool:
    return ":" in spec


def check_loss_name(spec: str) -> None:
    """VseError unless ``spec`` is a built-in name or has the form of an import path."""
    if not isinstance(spec, str) or not spec:
        raise VseError(f"loss must be a name, got {spec!r}")
    if spec in LOSS_NAMES:
        return
    module, _, name = spec.rpartition(":")
    if not is_import_path(spec) or not module or not name.isidentifier():
        raise VseError(f"unknown loss {spec!r} (built-in: {', '.join(LOSS_NAMES)}; or your own "
                       f"as FILE.py:Class or package.module:Class)")


def loss_class(spec: str) -> type:
    """The class named by ``FILE.py:Class`` or ``package.module:Class`` (VseError otherwise)."""
    check_loss_name(spec)
    module_part, _, class_name = spec.rpartition(":")
    module = _import_file(module_part) if _is_file(module_part) else _import_module(module_part)
    where = getattr(module, "__file__", None) or module_part
    cls = getattr(module, class_name, None)
    if cls is None:
        raise VseError(f"has no {class_name!r} (the loss {spec!r})", where)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise VseError(f"{class_name!r} is not a torch.nn.Module class (the loss {spec!r})", where)
    return cls


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
    try:
        loss = cls(**options)
    except (TypeError, ValueError) as exc:
        where = getattr(sys.modules.get(cls.__module__), "__file__", None) or spec
        raise VseError(f"cannot build {spec} with options {options} ({exc})", where) from exc
    loss_traits(loss, spec)  # fail now on a bad declaration, not after an epoch
    return loss


def loss_traits(loss: nn.Module, spec: str = "") -> LossTraits:
    """What the trainer needs to know about a loss, from what its class declares."""
    similarity = getattr(loss, "similarity", "cosine")
    if not isinstance(similarity, str) or similarity not in SIMILARITIES:
        raise VseError(f"loss {spec or type(loss).__name__} declares similarity {similarity!r}; "
                       f"expected one of {', '.join(SIMILARITIES)}")
    collapse = getattr(loss, "collapse_value", None)
    return LossTraits(similarity, bool(getattr(loss, "uses_relevance", False)),
                      collapse if callable(collapse) else None)


def _is_file(module_part: str) -> bool:
    return module_part.endswith(".py") or "/" in module_part or "\\" in module_part


def _import_file(path_text: str):
    path = Path(path_text)
    if not path.is_file():
        raise VseError("no such loss file", path)
    name = "vse_loss_plugin_" + re.sub(r"\W", "_", str(path.resolve()))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise VseError("cannot be imported as a Python file", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses, pickling and spawned workers look it up
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's code: any error, said in one line
        del sys.modules[name]
        raise VseError(f"cannot import ({_one_line(exc)})", path) from exc
    return module


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except Exception as exc:  # ModuleNotFoundError, or the module's own error
        raise VseError(f"cannot import module {name!r} ({_one_line(exc)})") from exc


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
