"""Reading run folders as the trainer leaves them: finding them, their config and their
validation log (``RUN/config.json``, ``RUN/metrics.jsonl``, ``best.pt``, ``last.pt``)."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

from .config import identity_values, with_old_defaults
from .errors import VseError

RUN_FILES = ("config.json", "metrics.jsonl", "best.pt", "last.pt")


def config_id(config: dict) -> str:
    """A short digest of a training config without the seed and the execution-only options:
    equal for the seeds of one configuration, different when any other option differs."""
    import hashlib

    kept = dict(sorted(identity_values(config).items()))
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:12]


def is_run_dir(path) -> bool:
    path = Path(path)
    return path.is_dir() and any((path / name).is_file() for name in RUN_FILES)


def find_runs(patterns) -> list[Path]:
    """Run folders matched by shell-style ``patterns`` ('runs/*'). A matched folder that is
    not a run itself stands for the runs below it (a sweep's folder), so 'runs/*' also
    finds 'runs/<sweep>/<params>'. Sorted, without duplicates."""
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    found = set()
    for pattern in patterns:
        for match in sorted(glob.glob(os.path.expanduser(str(pattern)))):
            match = Path(match)
            if is_run_dir(match):
                found.add(match)
            elif match.is_dir():
                found.update(p.parent for name in RUN_FILES for p in match.rglob(name)
                             if is_run_dir(p.parent))
    return sorted(found)


def run_names(run_dirs) -> list[str]:
    """Short unique names: each path relative to the deepest folder above all of them
    ('runs/a', 'runs/sweep/b' → 'a', 'sweep/b'); a single run is named by its folder."""
    run_dirs = [Path(p).resolve() for p in run_dirs]
    if len(run_dirs) == 1:
        return [run_dirs[0].name]
    common = Path(os.path.commonpath(run_dirs))
    return [p.relative_to(common).as_posix() or p.name for p in run_dirs]


def read_config(run_dir) -> dict:
    """``config.json`` of a run ({} when the run has none yet)."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return {}
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise VseError(f"unreadable run config ({str(exc).splitlines()[0][:120]})", path) from exc
    if not isinstance(values, dict):
        raise VseError("run config is not a JSON object", path)
    return with_old_defaults(values)


def validation_log_lines(path) -> list[tuple[str, dict | None]]:
    """Each line of a ``metrics.jsonl`` (with its newline) and its validation record, or None
    for a line that holds none (cut short by a killed process). The one parser of the log:
    reports read it, and the trainer trims it on --resume."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        ok = isinstance(record, dict) and "iteration" in record and "rsum" in record
        out.append((line, record if ok else None))
    return out


def read_validation_log(run_dir) -> list[dict]:
    """The validation records of ``metrics.jsonl`` in iteration order.

    A line cut short by a killed process is ignored, and when a resumed run validated an
    iteration again only its latest record is kept."""
    by_iteration = {}
    for _, record in validation_log_lines(Path(run_dir) / "metrics.jsonl"):
        if record is not None:
            record.setdefault("mrecall", record["rsum"] / 6)
            by_iteration[record["iteration"]] = record
    return [by_iteration[i] for i in sorted(by_iteration)]


def best_record(records, key: str = "mrecall") -> dict | None:
    """The first record with the highest ``key`` (the one best.pt holds)."""
    best = None
    for record in records:
        if best is None or record[key] > best[key]:
            best = record
    return best


def epochs_to_best(records, key: str = "mrecall") -> int | None:
    """The (1-based) epoch in which validation ``key`` (M-Recall) first reached its maximum."""
    best = best_record(records, key)
    return None if best is None else int(best["epoch"])


def fractional_epochs(records) -> list[float]:
    """x positions of the records in epochs. Validations inside an epoch (``val_every``)
    are placed by iteration, using the iterations of epoch 1 once a later epoch shows it
    complete; otherwise each record sits at its epoch number."""
    epochs = [r["epoch"] for r in records]
    if len(set(epochs)) == len(epochs) or max(epochs, default=0) < 2:
        return [float(e) for e in epochs]
    per_epoch = max(r["iteration"] for r in records if r["epoch"] == 1) if 1 in epochs else None
    if not per_epoch:
        return [float(e) for e in epochs]
    return [r["iteration"] / per_epoch for r in records]
