"""A run's code identity: which code trained it, as it records it (torch-free at import).

The record (``of_config``; a checkpoint's ``code_identity`` entry and the run folder's
``code.json``):

- ``version``: ``pipeline.__version__``;
- ``git``: the commit of vse's checkout and whether tracked files differed from it (``dirty``),
  or None without git or outside a checkout. Informational only;
- ``plugins``: each plug-in the run names (``PLUGIN_OPTIONS``: a ``FILE.py:Class`` or a
  ``package.module:Class`` outside vse), by option: its file, the sha256 of the bytes that were
  executed, and ``beside``: the sha256 of each module it imports from beside it (its folder, or its
  own top-level package), keyed by the path relative to that folder (``helper.py``);
- ``builtins``: the sha256 of the files that define the run's built-in loss and network classes,
  keyed by their path from the folder holding ``pipeline/`` (``pipeline/losses/hinge.py`` for mh);
- ``code_id``: a 12-hex digest of the version, the plug-ins (option, file name, sha256, beside) and
  the built-ins. Not of any absolute path: the same files elsewhere have the same code_id.

What enters ``code_id`` decides which runs are one method: seeds of one configuration are pooled
(``vse report``), counted as done (``vse sweep``), continued (``--resume``) and compared
(``vse compare``) only within one code_id. The git commit does not enter it: every commit, a
docs typo included, would split every seed group, and an installed vse has no commit at all. So
a change to vse outside the run's loss and network files (the trainer, the loss base class, the
data pipeline) is seen by the version only, and by the recorded commit for whoever looks.

A plug-in's sibling modules are the ones it imported while it was imported (``plugin_import``
puts its folder first on ``sys.path`` for that, as Python does for a script), and those its names
come from: import them at the top of the file. A module imported later, inside a function, is
not hashed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from functools import lru_cache
from pathlib import Path

RECORD_KEY = "code_identity"   # the checkpoint's entry (and code.json's content)
COLUMN = "code_id"             # the results row's column
UNRECORDED = ""                # a run saved before its code identity was recorded
PLUGIN_OPTIONS = {"loss": "loss", "network": "network", "image_pool": "pool", "text_pool": "pool"}
# ^ the training options that may name a plug-in → the kind of plug-in (plugin_import's ``what``)
OPTIONS = tuple(PLUGIN_OPTIONS)  # the training options a run's code identity is read from
_PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # the folder holding pipeline/


def version() -> str:
    import sys

    return sys.modules["pipeline"].__version__  # the package holding this module: imported already


@lru_cache(maxsize=1)
def git_state() -> dict | None:
    """{"commit", "dirty"} of vse's checkout, None without one (or without git): informational."""
    if not (_PACKAGE_PARENT / ".git").exists():
        return None

    def git(*args) -> str:
        return subprocess.run(["git", "-C", str(_PACKAGE_PARENT), *args], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None
    try:
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        dirty = None
    return {"commit": commit, "dirty": dirty}


def plugin_specs(config) -> dict[str, str]:
    """The options of ``config`` (a TrainConfig or its dict) that name a plug-in → its spec."""
    from pipeline.core.plugin_import import is_import_path

    get = config.get if isinstance(config, dict) else (lambda name: getattr(config, name, None))
    return {name: get(name) for name in PLUGIN_OPTIONS
            if isinstance(get(name), str) and is_import_path(get(name))}


def plugin_name(spec) -> str | None:
    """``topk.py:TopK`` for ``/any/folder/topk.py:TopK``: a plug-in file by its name, as config_id
    counts it (its content is the code identity's); None for a built-in name or a module's path."""
    from pipeline.core.plugin_import import is_file, is_import_path

    if not isinstance(spec, str) or not is_import_path(spec):
        return None
    module, _, class_name = spec.rpartition(":")
    return f"{os.path.basename(module)}:{class_name}" if is_file(module) else None


def absolute_plugins(options: dict) -> dict[str, str]:
    """The options (a run's ``OPTIONS``) whose plug-in file is named by a relative path → the spec
    naming it by its absolute path, as the run records it: a run resumed, evaluated or swept again
    from another folder finds it."""
    from pipeline.core.plugin_import import is_file

    found = {}
    for name, spec in plugin_specs(options).items():
        module, _, class_name = spec.rpartition(":")
        if is_file(module) and not os.path.isabs(module) and os.path.isfile(module):
            found[name] = f"{os.path.abspath(module)}:{class_name}"
    return found


def plugins(config) -> dict[str, dict]:
    """Each plug-in of ``config`` (imported, if it was not yet) → {file, sha256, beside}. A spec
    naming vse's own module is vse's code: ``builtins`` hashes it."""
    from pipeline.core.plugin_import import plugin_sources

    found = {}
    for name, spec in plugin_specs(config).items():
        sources = plugin_sources(spec, PLUGIN_OPTIONS[name])
        if sources is not None:
            found[name] = sources
    return found


def builtins(config) -> dict[str, str]:
    """The files of vse that define the run's loss and network classes → their sha256."""
    from pipeline.core.registry import LOSSES, NETWORKS

    get = config.get if isinstance(config, dict) else (lambda name: getattr(config, name, None))
    modules = []
    loss, network = get("loss") or "mh", get("network") or "vse++"
    if loss in LOSSES:
        modules.append(LOSSES[loss].partition(":")[0])
    if network in NETWORKS:
        modules.append(NETWORKS.spec(network).model.partition(":")[0])
    for spec in plugin_specs(config).values():  # pipeline.x:Class names vse's own code
        module = spec.rpartition(":")[0]
        if module.split(".")[0] == "pipeline" and not module.endswith(".py"):
            modules.append(module)
    files = {}
    for module in dict.fromkeys(modules):
        path = _module_file(module)
        if path is not None:
            files[path.relative_to(_PACKAGE_PARENT).as_posix()] = _sha256(path)
    return dict(sorted(files.items()))


def _module_file(module: str) -> Path | None:
    """The source file of one of vse's modules, found without importing it."""
    base = _PACKAGE_PARENT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def of_config(config) -> dict:
    """The code identity of a run of ``config`` (imports its plug-ins: call it where they are built)."""
    record = {"version": version(), "git": git_state(), "plugins": plugins(config),
              "builtins": builtins(config)}
    return {COLUMN: code_id(record), **record}


def code_id(record: dict) -> str:
    """The digest of what decides a run's code (module docstring): never of a path or the commit."""
    found = record.get("plugins") or {}
    kept = {"version": record.get("version"),
            "plugins": {name: _plugin_key(entry) for name, entry in sorted(found.items())},
            "builtins": dict(sorted((record.get("builtins") or {}).items()))}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:12]


def _plugin_key(entry: dict) -> list:
    return [os.path.basename(str(entry.get("file", ""))), entry.get("sha256"),
            sorted((entry.get("beside") or {}).items())]


def plugin_digests(record: dict | None) -> dict[str, str]:
    """option → one digest of a plug-in's file name, its sha256 and its siblings': what config_id
    adds for a run with plug-ins (not the path: the same file elsewhere is the same plug-in)."""
    return {name: hashlib.sha256(json.dumps(_plugin_key(entry)).encode()).hexdigest()[:16]
            for name, entry in sorted(((record or {}).get("plugins") or {}).items())}


def of_state(state_or_record: dict | None) -> dict | None:
    """The record a checkpoint (or a code.json, the record itself) holds; None before it was recorded."""
    if not isinstance(state_or_record, dict):
        return None
    entry = state_or_record.get(RECORD_KEY, state_or_record)
    return entry if isinstance(entry, dict) and COLUMN in entry else None


def id_of(state_or_record: dict | None) -> str:
    """The code_id a checkpoint or record holds; ``UNRECORDED`` before it was recorded."""
    record = of_state(state_or_record)
    return str(record[COLUMN]) if record else UNRECORDED


def short(code: str) -> str:
    """How a row's label names its code: ``code=abc123`` (``code=?`` for an unrecorded one)."""
    return f"code={code[:6] if code else '?'}"


def differences(old: dict | None, new: dict | None) -> str | None:
    """None when two records are one code (or one is unrecorded), else one line naming what
    differs first: a plug-in file (its name and both sha256), a built-in file, or the version."""
    if not old or not new or id_of(old) == id_of(new):
        return None
    old_files, new_files = _files(old), _files(new)
    for name in dict.fromkeys([*old_files, *new_files]):
        then, now = old_files.get(name), new_files.get(name)
        if then != now:
            return (f"{name} is other code than the run's (sha256 {_hash(then)} then, {_hash(now)} now)")
    if old.get("version") != new.get("version"):
        return f"vse {new.get('version')} is not the version that trained the run ({old.get('version')})"
    return f"code_id {id_of(new)} is not the run's ({id_of(old)})"


def _hash(value) -> str:
    return f"{value[:12]}…" if value else "none"


def _files(record: dict) -> dict[str, str]:
    """Every file a record hashes, by name: the plug-ins and their siblings, then vse's."""
    files = {}
    for entry in (record.get("plugins") or {}).values():
        files[os.path.basename(str(entry.get("file", "")))] = entry.get("sha256")
        files.update(entry.get("beside") or {})
    files.update(record.get("builtins") or {})
    return files


def mixed(labels: dict) -> str | None:
    """None when every run (name → code_id) has one code identity, else the line saying which differ."""
    groups: dict[str, list[str]] = {}
    for name, label in labels.items():
        groups.setdefault(str(label or "unrecorded"), []).append(str(name))
    if len(groups) < 2:
        return None
    parts = [f"{label}: {', '.join(sorted(names)[:3])}{' …' if len(names) > 3 else ''}"
             for label, names in sorted(groups.items())]
    return "runs of different code (code_id: vse version, plug-in and built-in files) — " + "; ".join(parts)


def _sha256(path) -> str:
    from pipeline.core.fsutil import file_sha256

    return file_sha256(path)


def labelled(labels: list[str], rows: list[dict]) -> list[str]:
    """Table labels with `` (code=abc123)`` added where one label stands for rows of different code
    (``COLUMN``): runs named alike but trained by other code are never shown as one thing."""
    codes: dict[str, set[str]] = {}
    for text, row in zip(labels, rows):
        codes.setdefault(text, set()).add(str(row.get(COLUMN) or ""))
    return [f"{text} ({short(str(row.get(COLUMN) or ''))})" if len(codes[text]) > 1 else text
            for text, row in zip(labels, rows)]


def clash(records: dict) -> str | None:
    """None when runs (name → record) may be compared as programs, else one line saying why not:
    they come from different vse versions, or hold one file (a plug-in, a sibling, a built-in loss
    or network file) with different contents. Runs of different methods differ in their method's
    files, which is what a comparison compares; unrecorded runs are left out (unknown)."""
    known = {name: record for name, record in records.items() if of_state(record)}
    versions: dict[str, list[str]] = {}
    for name, record in known.items():
        versions.setdefault(str(record.get("version")), []).append(str(name))
    if len(versions) > 1:
        return "runs of different vse versions (" + "; ".join(
            f"{version}: {', '.join(names)}" for version, names in sorted(versions.items())) + ")"
    seen: dict[str, tuple[str, str]] = {}
    for name, record in known.items():
        for file, digest in _files(record).items():
            if file in seen and seen[file][1] != digest:
                other, then = seen[file]
                return (f"{file} differs between the runs (sha256 {_hash(then)} in {other}, {_hash(digest)} "
                        f"in {name})")
            seen.setdefault(file, (str(name), digest))
    return None
