"""A user's own class by import path, ``path/to/file.py:Class`` or ``package.module:Class``:
the one import machinery of every plug-in kind (losses: ``loss_plugins``; set pools:
``heads``).  Torch-free at import: only ``plugin_class`` asks torch, to check the class.

A plug-in file is imported as Python runs a script: its folder first on ``sys.path`` while it is
imported, so ``from helper import X`` finds ``helper.py`` beside it. What was executed is
remembered (``plugin_sources``: the sha256 of the file's bytes and of each module it imported from
beside it; ``core.code_identity`` records them); a file changed since is imported again, with its
siblings, so a long-lived process never runs other code than it hashes.

Errors are one line (``VseError``) naming the file and, with ``what``, the kind of plug-in:
``no such loss file``, ``has no 'X' (the pool 'f.py:X')``. An exception raised inside a
plug-in's own code, wherever vse called it (building it, a training step, an evaluation, a
contract check), is the user's: ``user_code_error`` says it in one line naming the plug-in's
file and line; an exception raised in vse's own code is a bug of vse and keeps its traceback.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
import sysconfig
import traceback
import types
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


def _file_module_name(path: Path, what: str) -> str:
    return f"vse_{what}_plugin_" + re.sub(r"\W", "_", str(path.resolve()))


def import_file(path_text: str, what: str):
    """The module of a Python file, imported once per resolved path and content (``sys.modules``
    keeps it: dataclasses, pickling and spawned workers look it up). While it is imported, its
    folder is first on ``sys.path`` (as for a script); the modules it imports from there are its
    siblings (``_IMPORTED``). A file, or a sibling, changed since is imported again."""
    path = Path(path_text)
    if not path.is_file():
        raise VseError(f"no such {what} file", path)
    name = _file_module_name(path, what)
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise VseError(f"cannot read ({exc.strerror})", path) from None
    digest = hashlib.sha256(source).hexdigest()
    known = _IMPORTED.get(name)
    if name in sys.modules and (known is None or _unchanged(known, digest)):
        if known is None:  # put there by someone else (a worker unpickling): what is on disk now
            _IMPORTED[name] = {"sha256": digest, "beside": {}}
        return sys.modules[name]
    for old in [name, *((known or {}).get("modules") or ())]:  # the old version and its siblings go
        sys.modules.pop(old, None)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise VseError("cannot be imported as a Python file", path)
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    # names the folder holds, imported before (by another plug-in, from here or elsewhere), are run
    # afresh from here, as for a script: the ones it does not import again are put back after
    shadowed = {other: sys.modules.pop(other) for other in list(sys.modules)
                if _in_folder(other, Path(folder)) and _is_users(sys.modules[other])}
    before = set(sys.modules)
    sys.modules[name] = module
    sys.path.insert(0, folder)
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)  # the very bytes hashed
    except Exception as exc:  # the user's code: any error, said in one line
        del sys.modules[name]
        raise VseError(f"cannot import ({one_line(exc)})", path) from exc
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
        for other, old in shadowed.items():
            sys.modules.setdefault(other, old)
    siblings = _siblings(module, Path(folder), set(sys.modules) - before - {name}, path)
    files = dict(sorted(siblings.values()))
    _IMPORTED[name] = {"sha256": digest, "modules": sorted(siblings), "files": files,
                       "beside": {rel: _sha256(file) for rel, file in files.items()}}
    _PLUGIN_FILES.update(files.values())  # their exceptions are the user's too
    return module


_IMPORTED: dict[str, dict] = {}  # a plug-in file's module name → what was executed: sha256, siblings


def _unchanged(known: dict, digest: str) -> bool:
    """The file and each of its siblings still hold what was executed."""
    if known["sha256"] != digest:
        return False
    return all(Path(file).is_file() and _sha256(file) == known["beside"].get(rel)
               for rel, file in (known.get("files") or {}).items())


def _is_users(module) -> bool:
    """A module of the user's own files: not vse's, Python's or an installed package's (a plug-in's
    ``random.py`` does not replace Python's ``random`` for the whole process: ``_siblings`` refuses)."""
    file = getattr(module, "__file__", None)
    if not file:
        return False
    path = os.path.realpath(file)
    return not _is_vse_file(path) and not path.startswith(_INSTALLED)


_INSTALLED = tuple(os.path.realpath(folder) + os.sep for folder in {
    sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")})


def _in_folder(name: str, folder: Path) -> bool:
    """Module ``name``'s top-level name is a module or package of ``folder``."""
    top = name.split(".")[0]
    return (folder / f"{top}.py").is_file() or (folder / top / "__init__.py").is_file()


def _siblings(module, folder: Path, loaded: set[str], where) -> dict[str, tuple[str, str]]:
    """The modules ``module`` imported from beside it (name → (path relative to ``folder``, file)):
    the ones loaded while it ran from ``folder`` (its own top-level names there), and those its
    names come from, followed through theirs. A name that ``folder`` holds but that is already
    imported from elsewhere would run other code than the file beside it: VseError."""
    def beside(name: str) -> tuple[str, str] | None:
        mod = sys.modules.get(name)
        file = getattr(mod, "__file__", None)
        top = name.split(".")[0]
        if not file or mod is module or not _in_folder(name, folder):
            return None
        real = os.path.realpath(file)
        if _is_vse_file(real):
            return None
        if not real.startswith(str(folder) + os.sep):
            raise VseError(f"imports {top!r}, which is beside it ({folder / top}…) but was imported from "
                           f"{file} already: rename one of them", where)
        return Path(real).relative_to(folder).as_posix(), real

    found: dict[str, tuple[str, str]] = {}
    todo = [*loaded, *_referenced(module)]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        entry = beside(name)
        if entry is not None:
            found[name] = entry
            todo.extend(_referenced(sys.modules[name]))
    return found


def _referenced(module) -> list[str]:
    """The modules a module's names come from (``import x``, ``from x import f``)."""
    names = []
    for value in list(vars(module).values()):
        if isinstance(value, types.ModuleType):
            names.append(value.__name__)
        elif isinstance(getattr(value, "__module__", None), str):
            names.append(value.__module__)
    return names


def _sha256(path) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def plugin_sources(spec: str, what: str) -> dict | None:
    """What the plug-in ``spec`` executed (imported now if it was not): {"file", "sha256",
    "beside": {path relative to its folder: sha256}}. A ``package.module:Class`` outside vse:
    its module's file, and the modules of its own top-level package its names come from; None
    for vse's own modules (``pipeline.x:Class``)."""
    plugin_class(spec, what)
    module_part = spec.rpartition(":")[0]
    if is_file(module_part):
        path = Path(module_part)
        known = _IMPORTED[_file_module_name(path, what)]
        return {"file": str(path.resolve()), "sha256": known["sha256"], "beside": dict(known["beside"])}
    module = sys.modules[module_part]
    file = getattr(module, "__file__", None)
    if not file or _is_vse_file(os.path.realpath(file)):
        return None
    top = module_part.split(".")[0]
    top_file = Path(os.path.realpath(getattr(sys.modules[top], "__file__", None) or file))
    root = top_file.parent.parent if top_file.name == "__init__.py" else top_file.parent  # holds ``top``
    beside = {}
    todo, seen = _referenced(module), {module_part}
    while todo:
        name = todo.pop()
        if name in seen or name.split(".")[0] != top:
            continue
        seen.add(name)
        other = getattr(sys.modules.get(name), "__file__", None)
        if other:
            beside[Path(os.path.realpath(other)).relative_to(root).as_posix()] = _sha256(other)
            todo.extend(_referenced(sys.modules[name]))
    return {"file": os.path.realpath(file), "sha256": _sha256(file), "beside": dict(sorted(beside.items()))}


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
