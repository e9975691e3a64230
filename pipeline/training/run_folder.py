"""Run folders: ``RunFolder`` owns every file of one (the trainer and the sweep write through
it), and the readers find runs and read their config and validation log.

    RUN/config.json      the effective config (TrainConfig.to_dict)
    RUN/code.json        the code that trains it (core.code_identity: vse version, git commit,
                         sha256 of its plug-in files and siblings, and of its built-in loss and
                         network files); the checkpoints hold the same record
    RUN/metrics.jsonl    one validation record a line, appended whole and atomically
    RUN/best.pt          the checkpoint of the best validation rsum
    RUN/last.pt          the latest checkpoint (what --resume continues)
    RUN/vocab.json       the vocabulary of a run whose captions are tokenised (the GRU's;
                         pipeline.data.captions); a run on caption features has none
    RUN/noise_index.npy  the noise index a run on noisy pairs trained on (pipeline.data.noise)
    RUN/noise.json       what that index was drawn for (split, counts, caption fingerprint), its
                         layout and sha256; a resumed run must train on the same index
    RUN/tb/              TensorBoard scalars, written live (pipeline.training.curves)
    RUN/sweep-done.json  the sweep's mark of a finished run
    RUN/.lock            held while a process trains the run (pipeline.core.runlock)
    RUN/.replacing       present only while --overwrite swaps an old run's files for a new one's

A folder holding a checkpoint is a run: a new training there is refused unless it continues it
(--resume) or replaces it (--overwrite, which keeps every old file until the new run's first
checkpoint is complete).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
from pathlib import Path

from pipeline.core.config import TrainConfig, identity_values, with_old_defaults
from pipeline.core.errors import VseError
from pipeline.core.fsutil import atomic_path, file_sha256, remove_stale_temporaries, write_atomic
from pipeline.core.runlock import RunLock

RUN_FILES = ("config.json", "metrics.jsonl", "best.pt", "last.pt")
CONFIG, METRICS, BEST, LAST = RUN_FILES
DONE_MARKER = "sweep-done.json"
CODE = "code.json"
CURVES = "tb"
REPLACING = ".replacing"
STAGED = (".last.pt.new", ".best.pt.new")  # an --overwrite run's first checkpoint, before the swap


def config_id(config: dict, code: dict | None = None) -> str:
    """A short digest of a training config without the seed and the execution-only options:
    equal for the seeds of one configuration, different when any other option differs. The
    config is read as TrainConfig reads it first (an option left unset, e.g. None for "the
    network decides", counts as the value it resolves to), so a run saved by an older version
    groups with today's runs of the same behaviour.

    A plug-in file (``--loss FILE.py:Class``) counts by its file name, not its folder, and, given
    the run's ``code`` identity (``core.code_identity``), by its sha256 and its siblings': the same
    file elsewhere is the same configuration, an edited one another. A run without plug-ins keeps
    the id it always had."""
    import hashlib

    from pipeline.core.code_identity import plugin_digests, plugin_specs
    from pipeline.core.plugin_import import is_file

    try:
        config = TrainConfig.from_dict(config).to_dict()
    except (VseError, TypeError):  # an option this version no longer has: the saved values as they are
        pass
    kept = dict(sorted(identity_values(config).items()))
    for name, spec in plugin_specs(kept).items():
        module, _, class_name = spec.rpartition(":")
        if is_file(module):
            kept[name] = f"{os.path.basename(module)}:{class_name}"
    if plugin_digests(code):
        kept["plugin_sha256"] = plugin_digests(code)
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


def read_code_identity(run_dir) -> dict | None:
    """``code.json`` of a run (its code identity), None for a run saved before it was recorded."""
    from pipeline.core.code_identity import of_state

    path = Path(run_dir) / CODE
    if not path.is_file():
        return None
    try:
        return of_state(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise VseError(f"unreadable code identity ({str(exc).splitlines()[0][:120]})", path) from exc


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


class RunFolder:
    """The files of one run folder, and the rules for them: the one owner of a training's folder.

    A folder is opened for one training, in its mode (``resume``: continue the run here;
    ``overwrite``: replace it). ``begin`` is the one way in: it holds the folder (its lock) and
    checks, once, that the training may begin here (``start``); the command's ``claim`` (before
    anything is built), a resumed build (before it reads last.pt) and the Trainer's ``fit`` all
    ask it, and ``held`` lets go when the last of them is done. The trainer then writes its
    config (``prepare``), validation records and checkpoints through ``save_validation``, which
    saves ``last.pt`` at every validation and ``best.pt`` when rsum improves. An --overwrite
    run holds its records back until its first checkpoint is complete, then swaps the old run's
    files for its own (``REPLACING`` marks the few milliseconds of the swap). The run's other
    files (``vocab.json``, ``noise_index.npy`` and ``noise.json``: the module's list) are written
    by ``prepare``'s ``write_files``, beside the config."""

    def __init__(self, path, resume: bool = False, overwrite: bool = False):
        self.path = Path(path)
        self.resuming, self.overwriting = resume, overwrite  # the mode of the training it is opened for
        self.lock = RunLock(self.path)
        self._begun = False          # ``start`` has said yes (or is not this process's to say)
        self._holders = 0            # ``held`` blocks open: the last one lets go of the lock
        self._replacing = False      # an --overwrite run that has not replaced the old one yet
        self._fresh = True
        self._pending: list[dict] = []

    # ---------------------------------------------------------------- what is here
    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def last(self) -> Path:
        return self.path / LAST

    @property
    def best(self) -> Path:
        return self.path / BEST

    @property
    def curves_dir(self) -> Path:
        return self.path / CURVES

    def holds_run(self) -> bool:
        """A run is here: its last.pt, what --resume continues (a folder of an attempt that never
        completed a checkpoint holds nothing a new run would lose)."""
        return self.last.is_file()

    # ---------------------------------------------------------------- starting
    def begin(self, every_rank: bool = False) -> RunFolder:
        """Hold the folder (RUN/.lock, creating the folder) and check, the first time, that the
        training it was opened for may begin here (``start``). Under torchrun rank 0 holds and
        checks; ``every_rank``: every process checks (the command, before a process group exists,
        so that each one stops on a refusal)."""
        from pipeline.core.distributed import env_is_main

        self.lock.acquire()
        if not self._begun and (every_rank or env_is_main()):
            self.start(self.resuming, self.overwriting)
        self._begun = True
        return self

    @contextlib.contextmanager
    def held(self, every_rank: bool = False):
        """``begin``, and let go of the folder when the last ``held`` block ends (the command's
        ``claim`` and the Trainer's ``fit`` may nest; a resumed build's hold ends with them)."""
        self._holders += 1
        try:
            yield self.begin(every_rank)
        finally:
            self._holders -= 1
            if not self._holders:
                self.lock.release()

    @contextlib.contextmanager
    def claim(self):
        """What a command does before building a trainer, so that a refusal comes first: hold the
        folder and check on every process (if the folder exists; a new one is begun by ``fit``).
        Hand this folder to ``build_trainer(..., run=)``: it asks here, and checks nothing twice."""
        if not self.path.is_dir():
            yield self
            return
        with self.held(every_rank=True):
            yield self

    def start(self, resume: bool, overwrite: bool) -> None:
        """Check that a training may begin here (VseError otherwise); call with the lock held."""
        if resume and overwrite:
            raise VseError("--resume continues the run and --overwrite replaces it: give one", self.path)
        if (self.path / REPLACING).exists() and not overwrite:
            raise VseError("an --overwrite was cut off while it replaced the files of an older run, so they "
                           "are mixed: train again with --overwrite", self.path)
        self._fresh = not resume
        if resume:
            if not self.last.is_file():
                raise VseError("--resume given but the run has no last.pt", self.path)
            return
        if self.holds_run() and not overwrite:
            held = ", ".join(name for name in RUN_FILES if self.file(name).is_file())
            raise VseError(f"holds a run ({held}): continue it with --resume, replace it with --overwrite, "
                           "or give another --run-dir", self.path)
        self._replacing = self.holds_run() or (self.path / REPLACING).exists()

    def prepare(self, config: dict, write_files=None, code: dict | None = None) -> None:
        """Create the folder, clear temporaries of killed processes (and, for a fresh start,
        the log and curves of an attempt that never reached a checkpoint), and, unless an older
        run is still to be replaced, write the config, its ``code`` identity (code.json) and
        ``write_files(folder)`` (the run's other files: the GRU's vocab.json, a noisy-pair run's
        noise_index.npy and noise.json)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise VseError(f"cannot create the run folder ({exc.strerror})", self.path) from exc
        remove_stale_temporaries(self.path)
        for name in STAGED:  # a first checkpoint of an --overwrite run killed before its swap
            self.file(name).unlink(missing_ok=True)
        self._config, self._write_files, self._code = config, write_files or (lambda folder: None), code
        if self._fresh and not self._replacing:  # an attempt that never reached a checkpoint
            self.clear_records()                  # leaves nothing worth keeping
            _remove_tree(self.curves_dir)
        if not self._replacing:
            self.write_config(config, code)
            self._write_files(self.path)

    # ---------------------------------------------------------------- config
    def write_config(self, config: dict, code: dict | None = None) -> None:
        """config.json, and code.json when the ``code`` identity is given (a run from before it
        was recorded, replaced, loses its stale one)."""
        with atomic_path(self.file(CONFIG)) as tmp:
            Path(tmp).write_text(json.dumps(config, indent=2, sort_keys=True))
        if code is None:
            self.file(CODE).unlink(missing_ok=True)
            return
        with atomic_path(self.file(CODE)) as tmp:
            Path(tmp).write_text(json.dumps(code, indent=2, sort_keys=True))

    def config(self) -> dict:
        return read_config(self.path)

    # ---------------------------------------------------------------- validation log
    def records(self) -> list[dict]:
        return read_validation_log(self.path)

    def append_record(self, record: dict) -> None:
        """One validation record; the file is rewritten whole and atomically (it is small): a
        full disk leaves the previous file intact, never a torn last line."""
        if self._replacing:  # the old run's log stays until this run has a checkpoint
            self._pending.append(record)
            return
        path = self.file(METRICS)
        old = path.read_bytes() if path.exists() else b""
        write_atomic(path, old + (json.dumps(record) + "\n").encode("utf-8"))

    def trim_records(self, iteration: int) -> None:
        """Keep only the records a checkpoint at ``iteration`` covers (a run killed between
        appending a record and saving last.pt would log that validation twice after --resume);
        a line cut short by a killed process goes too."""
        path = self.file(METRICS)
        lines = validation_log_lines(path)
        kept = [line for line, record in lines if record is not None and record["iteration"] <= iteration]
        if len(kept) != len(lines):
            with atomic_path(path) as tmp:
                Path(tmp).write_text("".join(kept), encoding="utf-8")

    def clear_records(self) -> None:
        """A fresh start forgets the log of an attempt that never reached a checkpoint."""
        self.file(METRICS).unlink(missing_ok=True)

    # ---------------------------------------------------------------- checkpoints
    def save_validation(self, record: dict, metrics: dict, state: dict, improved: bool, save) -> None:
        """The files of one validation: its record, best.pt (with ``metrics``) when ``improved``,
        last.pt always. ``save(state, path)`` writes a checkpoint atomically."""
        if self._replacing:
            self._replace(record, metrics, state, save)
            return
        self.append_record(record)
        if improved:
            save({**state, "metrics": metrics}, self.best)
        save(state, self.last)

    def _replace(self, record: dict, metrics: dict, state: dict, save) -> None:
        """The first checkpoint of an --overwrite run: write it beside the old run's files, then
        swap them (the first validation is always the best so far)."""
        staged_last, staged_best = (self.path / name for name in STAGED)
        save(state, staged_last)
        save({**state, "metrics": metrics}, staged_best)  # both complete before anything old goes
        marker = self.path / REPLACING
        write_atomic(marker, b"replacing an older run's files\n")
        self.file(DONE_MARKER).unlink(missing_ok=True)
        _remove_tree(self.curves_dir)
        self.write_config(self._config, self._code)
        self._write_files(self.path)
        write_atomic(self.file(METRICS), b"".join((json.dumps(r) + "\n").encode("utf-8")
                                                 for r in [*self._pending, record]))
        os.replace(staged_best, self.best)
        os.replace(staged_last, self.last)
        marker.unlink()
        self._replacing, self._pending = False, []

    def resume(self, config, given):
        """last.pt and the config the run continues with (``config.resume_config``: the run's
        own, with the options in ``given``; files compared by identity). A resumed build calls it
        once ``begin`` holds the folder (it holds it anyway): no other process may write the run
        while it is read and continued. Returns (state, config, notes)."""
        from pipeline.core.checkpoint import load_checkpoint
        from pipeline.core.code_identity import PLUGIN_OPTIONS, plugin_name
        from pipeline.core.config import resume_config

        self.lock.acquire()
        state = load_checkpoint(self.last)
        identities = state.get("file_identity") or {}

        def same(name, new, old):
            return same_file(new, old, identities.get(name))

        saved = dict(state["train_config"])
        for name in PLUGIN_OPTIONS:  # the run's plug-in file named by another path (another folder, or
            new = getattr(config, name, None)  # absolute now): its content is compared by code identity
            if new != saved.get(name) and plugin_name(new) is not None and plugin_name(new) == plugin_name(
                    saved.get(name)):
                saved[name] = new
        config, _, notes = resume_config(saved, config, given, self.last, same_file=same)
        return state, config, notes

    @property
    def replacing(self) -> bool:
        """An --overwrite run whose first checkpoint has not replaced the old run yet."""
        return self._replacing

    # ---------------------------------------------------------------- the sweep's mark
    def mark_done(self, summary: dict) -> None:
        with atomic_path(self.file(DONE_MARKER)) as tmp:
            Path(tmp).write_text(json.dumps(summary, indent=2), encoding="utf-8")

    def done(self) -> dict | None:
        """The sweep's summary of a finished run, or None."""
        path = self.file(DONE_MARKER)
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            return {}


def _remove_tree(path: Path) -> None:
    import shutil

    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------- file identity
def file_identity(path) -> dict:
    """What identifies a file a run names (a feature cache, caption features, relevance, a
    checkpoint to start from): its sha256. A resumed run may name the same file by another
    path (relative, absolute, a symlink, a moved project folder); it is the same when it is the
    same file on disk or has the same digest."""
    return {"sha256": file_sha256(path)}


def same_file(new, old, recorded: dict | None) -> bool:
    """``new`` names the file the run knew as ``old`` (``recorded``: its ``file_identity`` when
    the run started, None for runs from before vse recorded it)."""
    new, old = Path(new), Path(old)
    try:
        if old.exists() and os.path.samefile(new, old):
            return True
    except OSError:
        pass
    if recorded is None or not new.is_file():
        return False
    return file_sha256(new) == recorded.get("sha256")
