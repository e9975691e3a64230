"""A user's own class by import path, ``path/to/file.py:Class`` or ``package.module:Class``:
the one import machinery of every plug-in kind (losses: ``loss_plugins``; set pools:
``heads``).  Torch-free at import: only ``plugin_class`` asks torch, to check the class.

Errors are one line (``VseError``) naming the file and, with ``what``, the kind of plug-in:
``no such loss file``, ``has no 'X' (the pool 'f.py:X')``. An exception raised inside a
plug-in's own code, wherever vse called it (building it, a training step, an evaluation, a
contract check), is the user's: ``user_code_error`` says it in one line naming the plug-in's
file and line; an exception raised in vse's own code is a bug of vse and keeps its traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import traceback
from pathlib import Path

from pipeline.core.errors import VseError

FORMS = "FILE.py:Class or package.module:Class"


def is_import_path(spec: str) -> bool:
    return ":" in spec


def check_spec(spec, builtins, what: str) -> None:
    """VseError unless ``spec`` is one of ``builtins`` or has the form of an import path."""
    if not isinstance(spec, str) or not spec:
        raise VseError(f"{what} must be a name, got {spec!r}")
    if spec in builtins:
        return
    module, _, name = spec.rpartition(":")
    if not is_import_path(spec) or not module or not name.isidentifier():
        raise VseError(f"unknown {what} {spec!r} (built-in: {', '.join(builtins)}; or your own "
                       f"as {FORMS})")


def plugin_class(spec: str, what: str) -> type:
    """The ``torch.nn.Module`` class named by the import path ``spec`` (VseError otherwise)."""
    from torch import nn

    module_part, _, class_name = spec.rpartition(":")
    module = import_file(module_part, what) if is_file(module_part) else import_module(module_part)
    where = getattr(module, "__file__", None) or module_part
    _remember(module)
    cls = getattr(module, class_name, None)
    if cls is None:
        raise VseError(f"has no {class_name!r} (the {what} {spec!r})", where)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise VseError(f"{class_name!r} is not a torch.nn.Module class (the {what} {spec!r})", where)
    return cls


def class_file(cls: type, spec: str) -> str:
    """Where a plug-in class comes from, for an error about building it."""
    return getattr(sys.modules.get(cls.__module__), "__file__", None) or spec


def is_file(module_part: str) -> bool:
    return module_part.endswith(".py") or "/" in module_part or "\\" in module_part


def import_file(path_text: str, what: str):
    """The module of a Python file, imported once per resolved path (``sys.modules`` keeps it:
    dataclasses, pickling and spawned workers look it up)."""
    path = Path(path_text)
    if not path.is_file():
        raise VseError(f"no such {what} file", path)
    name = f"vse_{what}_plugin_" + re.sub(r"\W", "_", str(path.resolve()))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise VseError("cannot be imported as a Python file", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's code: any error, said in one line
        del sys.modules[name]
        raise VseError(f"cannot import ({one_line(exc)})", path) from exc
    return module


def import_module(name: str):
    try:
        return importlib.import_module(name)
    except Exception as exc:  # ModuleNotFoundError, or the module's own error
        raise VseError(f"cannot import module {name!r} ({one_line(exc)})") from exc


# ---------------------------------------------------------------------------- the user's exceptions
_VSE_FOLDERS = tuple(str(Path(__file__).resolve().parents[i] / name) + os.sep
                     for i, name in ((1, ""), (2, "cli")))  # pipeline/ and cli/: vse's own code
_PLUGIN_FILES: set[str] = set()  # the resolved files of the plug-in modules imported so far


def _remember(module) -> None:
    file = getattr(module, "__file__", None)
    if file and not _is_vse_file(os.path.realpath(file)):  # pipeline.x:Class names vse's own code
        _PLUGIN_FILES.add(os.path.realpath(file))


def _is_vse_file(path: str) -> bool:
    return path.startswith(_VSE_FOLDERS)


def user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The plug-in's frame where ``exc`` was raised, or None when vse's own code raised it. From
    the innermost frame outwards, the first frame that is vse's or a plug-in's decides: a library
    the plug-in called (torch, numpy) counts as the plug-in's code."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = os.path.realpath(frame.filename)
        if path in _PLUGIN_FILES:
            return frame
        if _is_vse_file(path):
            return None
    return None


def user_code_error(exc: BaseException, doing: str = "") -> VseError | None:
    """``exc`` in one line naming the plug-in file, its line and function, when it was raised
    inside a plug-in's code (``user_frame``); None otherwise (a bug of vse: keep the traceback)."""
    if isinstance(exc, VseError):
        return exc
    frame = user_frame(exc)
    if frame is None:
        return None
    return VseError(f"{doing + ': ' if doing else ''}{one_line(exc)} (line {frame.lineno}, in {frame.name})",
                    frame.filename)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
