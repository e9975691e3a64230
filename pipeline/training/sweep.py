"""Grids of training runs from one YAML file (`vse sweep`), restartable after a kill.

    name: negatives               # optional; default: the file's stem
    runs_dir: ../runs             # optional; runs go to <runs_dir>/<name>/<param-string>
    base:                         # TrainConfig fields shared by every run
      features: ../cache/f8k.h5
      epochs: 15
      loss_options: {warmup_epochs: 1}
    grid:                         # option → list of values; the runs are the product
      loss: [sh, mh]
      loss_options.negative_set_size: [8, 32, 127]
      seed: [0, 1]

Grid keys are TrainConfig fields, or ``loss_options.<option>`` for one loss option, or any
other name whose values are mappings of such options set together (a "bundle", for a loss
with its own options):

    grid:
      method:
        - {name: vse0, loss: sh}
        - {name: vsepp, loss: mh, loss_options.warmup_epochs: 1}

``slurm:`` (optional) sets the jobs' resources for ``vse sweep --launcher slurm`` (partition, time,
cpus, gpus, mem: ``launchers.SLURM_OPTIONS``); the command line's options win over it.

Relative paths in the file (``runs_dir:``, every option that names a file or folder, and a
plug-in's ``FILE.py`` in ``loss:``, ``network:``, ``image_pool:``, ``text_pool:``) are read from
the file's folder, as an include is (``resolve_paths``), so the file works from any working folder;
paths given on the command line (``--runs-dir``, overrides) are the working folder's. A plug-in
is recorded by its absolute path.

Each run is named by its grid values ("loss=mh,negative_set_size=8,seed=0", "method=vsepp").
A run is done once the sweep has written ``RUN/sweep-done.json`` after ``fit()`` (or its last.pt
is at the final epoch); done runs are skipped, unfinished ones (a last.pt short of the final
epoch) continue with ``resume=True``, so a killed sweep goes on where it stopped. A run trained by
other code than the sweep's (its ``code.json``: a plug-in file or a sibling edited, a built-in loss
or network file changed, another vse version; ``core.code_identity``) is never counted as done nor
continued: the sweep refuses, naming the file, until it is given another ``--name`` or told to
train those runs again (``overwrite``). A run from before vse recorded its code counts as before.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core import code_identity
from pipeline.core.config import TrainConfig, file_options, option_names
from pipeline.core.errors import VseError
from pipeline.core.plugin_import import user_code_error
from pipeline.training.run_folder import RunFolder

LOSS_OPTION_PREFIX = "loss_options."
SWEEP_KEYS = ("name", "runs_dir", "base", "grid", "seeds", "slurm")  # slurm: the jobs' resources (launchers)


@dataclass
class SweepRun:
    name: str                 # the param string
    run_dir: Path
    config: dict              # TrainConfig fields
    status: str = ""          # new | unfinished | done | changed | other-code (before running);
    #                           then trained | failed
    detail: str = ""


@dataclass
class Sweep:
    name: str
    runs_dir: Path
    runs: list[SweepRun] = field(default_factory=list)
    slurm: dict | None = None  # the file's slurm: mapping, checked by launchers.slurm_settings
    path: Path | None = None

    @property
    def root(self) -> Path:
        return self.runs_dir / self.name


def load_sweep(path, runs_dir=None, seeds=None, overrides=None, name=None, only=None) -> Sweep:
    """Parse a sweep file and expand its grid (VseError naming the file when it is wrong).

    ``seeds`` (or the file's ``seeds:`` list) repeats every grid point with each seed: the
    last grid axis, so a configuration's seeds are listed together and `vse report` shows
    their mean ± std. ``overrides`` (training options, e.g. the command line's) replace the
    file's ``base:`` values (their loss options merge into base's); they may not set a grid axis.
    ``name`` replaces the file's ``name:`` (the sweep's folder), so one grid can be swept again with
    an override, e.g. another network, beside the first. ``only`` ("KEY=VALUE" strings, as the run
    names write them, e.g. "method=mh") keeps the runs that have every one of them: one method's
    extra seeds without a second file that copies the first's base:."""
    path = Path(path)
    spec = read_yaml_mapping(path, "sweep file", "base: and grid:")
    unknown = sorted(set(spec) - set(SWEEP_KEYS))
    if unknown:
        raise VseError(f"unknown sweep key(s) {', '.join(unknown)} (expected {', '.join(SWEEP_KEYS)}; "
                       "training options go under base:)", path)
    base, grid = spec.get("base") or {}, spec.get("grid") or {}
    if not isinstance(base, dict) or not isinstance(grid, dict):
        raise VseError("base: and grid: must be mappings", path)
    seeds = list(seeds) if seeds is not None else spec.get("seeds")
    if seeds is not None:
        if not isinstance(seeds, list) or not seeds or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in seeds) or (
                len(set(seeds)) < len(seeds)):
            raise VseError(f"seeds must be a non-empty list of distinct integers, got {seeds!r}", path)
        if "seed" in grid:
            raise VseError("give the seeds once: seeds (or --seeds) and a grid 'seed:' axis both set", path)
        grid = {**grid, "seed": seeds}
    overrides = dict(overrides or {})
    set_here = {k for k in overrides if k != "loss_options"}
    set_here |= {LOSS_OPTION_PREFIX + k for k in overrides.get("loss_options") or {}}
    clash = sorted(set_here & set(grid))
    if clash:
        raise VseError(f"{', '.join(clash)} is a grid axis of this sweep; an override would give every "
                       "grid point the same value", path)
    if "loss_options" in overrides:
        overrides["loss_options"] = {**(base.get("loss_options") or {}), **overrides["loss_options"]}
    base = {**resolve_paths(base, path.parent), **overrides}  # the file's paths are its folder's
    name = check_folder_name(str(name or spec.get("name") or path.stem), "sweep name", path)
    file_runs_dir = spec.get("runs_dir")
    if file_runs_dir is not None and not isinstance(file_runs_dir, str):
        raise VseError(f"runs_dir must be a folder name, got {file_runs_dir!r}", path)
    file_runs_dir = file_runs_dir and resolved_path(file_runs_dir, path.parent)
    sweep = Sweep(name, Path(runs_dir or file_runs_dir or "runs"), slurm=spec.get("slurm"), path=path)
    for values in expand_grid(grid, path):
        config = run_config(base, values, path, folder=path.parent)
        if not config.get("features"):
            raise VseError("no features: for the runs (set it under base: or grid:)", path)
        run_name = param_string(values)
        config["run_dir"] = str(sweep.root / run_name)
        sweep.runs.append(SweepRun(run_name, sweep.root / run_name, config))
    return select_runs(sweep, only or ())


def select_runs(sweep: Sweep, only) -> Sweep:
    """The sweep's runs whose names have every "KEY=VALUE" of ``only`` (VseError naming the file and
    the filter when one is malformed or matches no run)."""
    for item in only:
        key, sep, value = item.partition("=")
        if not (sep and key and value):
            raise VseError(f"--only {item!r}: expected KEY=VALUE as the run names write it, e.g. method=mh",
                           sweep.path)
        kept = [run for run in sweep.runs if item in run.name.split(",")]
        if not kept:
            seen = sorted({part for run in sweep.runs for part in run.name.split(",")
                           if part.partition("=")[0] == key})
            raise VseError(f"--only {item!r} matches no run (its values: {', '.join(seen) or 'no such key'})",
                           sweep.path)
        sweep.runs = kept
    return sweep


def _is_option(key: str) -> bool:
    """A TrainConfig field or ``loss_options.<option>``."""
    if key.startswith(LOSS_OPTION_PREFIX):
        return len(key) > len(LOSS_OPTION_PREFIX)
    return key in set(option_names()) - {"run_dir"}


def _is_bundle(key: str, value) -> bool:
    return isinstance(value, dict) and not _is_option(key)


def expand_grid(grid: dict, path=None) -> list[dict]:
    """The product of the grid's value lists, in file order (the last key varies fastest).

    A key that is no option but lists mappings is a bundle axis: each mapping sets several
    options together (``{name: vsepp, loss: mh, loss_options.warmup_epochs: 1}``), for
    options that only make sense with one value of another, like a loss's own options."""
    axes = []
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise VseError(f"grid key {key!r} needs a non-empty list of values", path)
        if not _is_option(key):
            if not all(isinstance(v, dict) for v in values):
                raise VseError(f"grid key {key!r} is not a training option (TrainConfig field), nor "
                               f"{LOSS_OPTION_PREFIX}<option>, nor a list of option mappings", path)
            inner = sorted({k for v in values for k in v if k != "name" and not _is_option(k)})
            if inner:
                raise VseError(f"grid key {key!r}: {', '.join(map(repr, inner))} is not a training "
                               f"option (TrainConfig field) nor {LOSS_OPTION_PREFIX}<option>", path)
        axes.append([(key, v) for v in values])
    return [dict(combination) for combination in itertools.product(*axes)]


def resolved_path(value: str, folder) -> str:
    """A path of a YAML file read from its ``folder`` (an absolute one as it is): relative to the
    working folder when it lies below it (as the repository's experiments have always recorded
    their caches: config_id and results columns unchanged), else absolute."""
    value = os.path.expanduser(value)
    if os.path.isabs(value):
        return value
    full = os.path.normpath(os.path.join(os.path.abspath(folder), value))
    relative = os.path.relpath(full, os.getcwd())
    return full if relative == ".." or relative.startswith(".." + os.sep) else relative


def resolve_paths(values: dict, folder) -> dict:
    """``values`` (options from a YAML file in ``folder``) with their relative paths read from
    ``folder``: the options that name a file or folder (``config.file_options``), and the file of a
    plug-in (``code_identity.PLUGIN_OPTIONS``: ``topk.py:TopK``), which becomes absolute."""
    from pipeline.core.plugin_import import is_file, is_import_path

    paths, out = set(file_options()), dict(values)
    for name, value in values.items():
        if not isinstance(value, str) or not value:
            continue
        if name in paths:
            out[name] = resolved_path(value, folder)
        elif name in code_identity.PLUGIN_OPTIONS and is_import_path(value):
            module, _, class_name = value.rpartition(":")
            if is_file(module):
                full = os.path.abspath(os.path.join(folder, os.path.expanduser(module)))
                out[name] = f"{full}:{class_name}"
    return out


def paths_for_file(values: dict, folder) -> dict:
    """``values`` as a YAML file in ``folder`` names them (``resolve_paths`` reads them back): a
    relative path is written relative to ``folder``; absolute ones, and plug-ins, as they are."""
    paths, out = {*file_options(), "runs_dir"}, dict(values)
    for name, value in values.items():
        if name in paths and isinstance(value, str) and value and not os.path.isabs(value):
            out[name] = os.path.relpath(os.path.abspath(value), os.path.abspath(folder))
    return out


def run_config(base: dict, values: dict, path=None, folder=None) -> dict:
    """``base`` with one grid point applied: TrainConfig fields replace, loss options merge.
    ``folder``: the grid's paths are that YAML folder's (``resolve_paths``; base's are resolved by
    the caller, before the command line's overrides)."""
    config = dict(base)
    loss_options = dict(config.get("loss_options") or {})
    for key, value in values.items():
        for option, setting in (value.items() if _is_bundle(key, value) else [(key, value)]):
            if option == "name" and _is_bundle(key, value):
                continue
            if option.startswith(LOSS_OPTION_PREFIX):
                loss_options[option[len(LOSS_OPTION_PREFIX):]] = setting
            elif option == "loss_options":
                loss_options = dict(setting or {})
            else:
                config[option] = resolve_paths({option: setting}, folder)[option] if folder else setting
    config["loss_options"] = loss_options
    try:
        TrainConfig.from_dict(config)
    except VseError as exc:
        raise VseError(str(exc), path) from None
    return config


_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")


def read_yaml_mapping(path: Path, what: str, holds: str) -> dict:
    """The YAML mapping in ``path`` (a sweep or tune file); one-line VseError naming the file when it
    cannot be read or parsed, or is not a mapping (``holds``: what the mapping should hold)."""
    import yaml

    try:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise VseError(f"cannot read {what} ({exc.strerror})", path) from None
    except yaml.YAMLError as exc:
        raise VseError(f"cannot parse {what} ({str(exc).splitlines()[0]})", path) from None
    if not isinstance(spec, dict):
        raise VseError(f"a {what} is a mapping with {holds}", path)
    return spec


def check_folder_name(name: str, what: str, where=None) -> str:
    """``name`` when it is one plain folder name under the runs dir (letters, digits, '.', '_', '-';
    not '.' or '..', which name the runs dir itself or its parent); VseError otherwise."""
    if not _SAFE_NAME.fullmatch(name) or name in (".", ".."):
        raise VseError(f"{what} {name!r} may hold only letters, digits, '.', '_' and '-', and is one "
                       "folder name: not '.' or '..'", where)
    return name


def param_string(values: dict) -> str:
    """'loss=mh,negative_set_size=8,seed=0': the grid values, safe as one folder name.
    A bundle is named by its ``name`` entry, else by its settings joined with '+'. A path is named
    as written, without its leading '../' and './' (the file's folder's way up: the same name
    whichever folder the file sits in)."""
    if not values:
        return "base"
    parts = []
    for key, value in values.items():
        if _is_bundle(key, value):
            text = str(value["name"]) if "name" in value else "+".join(
                f"{_short(k)}-{_text(v, k)}" for k, v in value.items())
        else:
            text = _text(value, key)
        parts.append(f"{_short(key)}={re.sub(r'[^A-Za-z0-9._+-]+', '_', text).strip('_') or '_'}")
    return ",".join(parts)


def _short(key: str) -> str:
    return key[len(LOSS_OPTION_PREFIX):] if key.startswith(LOSS_OPTION_PREFIX) else key


def _text(value, key: str = "") -> str:
    if isinstance(value, (dict, list, bool)) or value is None:
        return json.dumps(value, sort_keys=True)
    if isinstance(value, str) and (key in file_options() or key in code_identity.PLUGIN_OPTIONS):
        return re.sub(r"^(\.\.?/)+", "", value)
    return str(value)


def run_status(run: SweepRun) -> tuple[str, str]:
    """(new | unfinished | done | changed | other-code, detail) from what the run folder holds;
    ``changed``: the folder holds a run made with other options than the sweep's (what --resume may
    not change); ``other-code``: one trained by other code (``_changed_code``), done or not."""
    from pipeline.core.checkpoint import load_checkpoint

    changed = _changed_options(run)
    if changed:
        return "changed", changed
    other = _changed_code(run)
    if other:
        return "other-code", other
    epochs = int(run.config.get("epochs", TrainConfig.default("epochs")))
    done = RunFolder(run.run_dir).done()
    if done is not None:
        if done.get("epoch", -1) >= epochs:
            return "done", (f"best rsum {done.get('best_rsum', float('nan')):.2f} "
                            f"at epoch {done.get('best_epoch')}")
    last = run.run_dir / "last.pt"
    if not last.is_file():
        return "new", ""
    try:
        epoch = int(load_checkpoint(last)["epoch"])
    except VseError as exc:
        return "unfinished", f"unreadable last.pt ({exc})"
    if epoch >= epochs:
        return "done", f"last.pt at epoch {epoch}"
    return "unfinished", f"last.pt at epoch {epoch}/{epochs}"


def _changed_options(run: SweepRun) -> str:
    """How the run already in ``run.run_dir`` (its config.json) differs from the sweep's in the
    options --resume may not change (``config.resume_may_change``: the epoch count may), as one
    line; "" when it does not, or when the folder holds no run."""
    from pipeline.core.config import file_options, resume_may_change, with_old_defaults
    from pipeline.training.run_folder import read_config, same_file

    folder = RunFolder(run.run_dir)
    saved = read_config(run.run_dir)
    if not saved or not (folder.holds_run() or folder.done() is not None):
        return ""
    try:
        old = TrainConfig.from_dict(with_old_defaults(saved))
    except VseError as exc:
        return f"its config.json: {exc}"
    new, files, allowed = TrainConfig.from_dict(run.config), file_options(), resume_may_change()
    recorded: list[dict] = []  # the files' identities last.pt recorded, read when first needed

    def same(name, a, b):
        if same_file(a, b, None):
            return True
        if not recorded:
            recorded.append(_recorded_files(folder))
        return same_file(a, b, recorded[0].get(name))

    def differs(name):
        a, b = getattr(new, name), getattr(old, name)
        if name in code_identity.PLUGIN_OPTIONS and a != b and code_identity.plugin_name(a) == \
                code_identity.plugin_name(b) is not None:
            return False  # the same plug-in file elsewhere: its code is compared by _changed_code
        return a != b and not (name in files and a and b and same(name, a, b))

    names = [name for name in option_names() if name != "run_dir" and name not in allowed and differs(name)]
    return ", ".join(f"{name} {getattr(new, name)!r} (the run's: {getattr(old, name)!r})" for name in names)


def _recorded_files(folder: RunFolder) -> dict:
    """The ``file_identity`` last.pt recorded (a file named by a path that no longer leads to it,
    e.g. relative to another working folder, is the same when its sha256 is)."""
    from pipeline.core.checkpoint import load_checkpoint

    if not folder.last.is_file():
        return {}
    try:
        return load_checkpoint(folder.last).get("file_identity") or {}
    except VseError:
        return {}


def _changed_code(run: SweepRun) -> str:
    """How the code that trained the run in ``run.run_dir`` (its code.json) differs from the code
    this sweep would train it with, as one line naming the file and both sha256; "" when it does
    not, when the folder holds no run, or when the run is from before vse recorded its code. The
    sweep's code is found by importing its plug-ins: a plug-in that cannot be is left to fail when
    its run trains, with its own line."""
    from pipeline.training.run_folder import read_code_identity

    folder = RunFolder(run.run_dir)
    if not (folder.holds_run() or folder.done() is not None):
        return ""
    recorded = read_code_identity(run.run_dir)
    if recorded is None:
        return ""
    try:
        wanted = code_identity.of_config(TrainConfig.from_dict(run.config))
    except VseError:
        return ""
    return code_identity.differences(recorded, wanted) or ""


def unreached(runs: list[SweepRun]) -> list[tuple[SweepRun, str]]:
    """(run, line) for each run whose loss's method would not begin within its epochs
    (``training.settings.unreached_phases``: it would train another method under the loss's name).
    A run whose loss cannot be built is left to fail alone, with its own line."""
    from pipeline.training.factories import schedule_note

    found = []
    for run in runs:
        try:
            note = schedule_note(TrainConfig.from_dict(run.config))
        except VseError:
            continue
        if note:
            found.append((run, note))
    return found


def plan(sweep: Sweep) -> Sweep:
    """Fill in every run's status."""
    for run in sweep.runs:
        run.status, run.detail = run_status(run)
    return sweep


def train_run(config: dict, resume: bool, threads: int | None = None, echo=print,
              overwrite: bool = False) -> dict:
    """Train one run to the end and write its done marker; returns the Trainer's summary.
    ``overwrite``: replace the run its folder holds (one trained by other code)."""
    import torch

    from pipeline.training.build import build_trainer

    if threads:
        torch.set_num_threads(threads)
    folder = RunFolder(config["run_dir"])
    with folder.lock:  # another sweep training this run keeps it (and its log)
        cfg = TrainConfig.from_dict(config)
        summary = build_trainer(cfg, resume=resume, echo=echo, overwrite=overwrite).fit()
        summary = {**summary, "epoch": cfg.epochs, "finished": time.time()}
        folder.mark_done(summary)
    return summary


def _train_safely(run: SweepRun, resume: bool, threads: int | None, quiet: bool) -> tuple[str, str]:
    """For joblib workers: ('trained' | 'failed', detail) instead of an exception. The run's memory is
    released before the next run of this process (a sweep's, or a joblib worker's next task) begins.
    A run whose folder holds one trained by other code replaces it (``run_sweep``'s ``overwrite``)."""
    try:
        return _train_outcome(run, resume, threads, quiet)
    finally:  # after the run's frames are gone: a failed run's exception cycles through them
        from pipeline.core.runtime import release_run_memory

        release_run_memory()


def _train_outcome(run: SweepRun, resume: bool, threads: int | None, quiet: bool) -> tuple[str, str]:
    prefix = f"[{run.name}] "

    def echo(message, *args, **kwargs):
        if not quiet:
            print(prefix + str(message), flush=True)

    try:
        summary = train_run(run.config, resume, threads, echo, overwrite=run.status == "other-code")
    except Exception as exc:  # a VseError, or the user's plug-in raised it: one line; a bug of vse: raised
        error = user_code_error(exc)
        if error is None:
            raise
        return "failed", str(error)
    return "trained", f"best rsum {summary['best_rsum']:.2f} at epoch {summary['best_epoch']}"


def check_plan(sweep: Sweep, overwrite: bool = False) -> None:
    """After ``plan``: VseError when a run folder holds a run of other options (never trained over), or of
    other code unless ``overwrite`` (what a local sweep and a Slurm submission refuse alike)."""
    changed = [run for run in sweep.runs if run.status == "changed"]
    if changed:
        raise VseError(f"{len(changed)} of its runs were made with other options than this sweep's (first: "
                       f"{changed[0].name}: {changed[0].detail}); give the sweep another --name", sweep.root)
    other = [run for run in sweep.runs if run.status == "other-code"]
    if other and not overwrite:
        raise VseError(f"{len(other)} of its runs were trained by other code than this sweep's, so they are "
                       f"not done (first: {other[0].name}: {other[0].detail}); give the sweep another --name "
                       "for a new folder, or --overwrite to train them again", sweep.root)


def run_sweep(sweep: Sweep, *, jobs: int = 1, resume: bool = False, echo=print,
              quiet_runs: bool = False, overwrite: bool = False) -> Sweep:
    """Train every run that is not done, one after another or ``jobs`` at a time (joblib
    processes). Unfinished runs continue only with ``resume``; otherwise they are left as
    they are and reported. A failing run does not stop the others. Runs trained by other code
    than the sweep's are refused, or, with ``overwrite``, trained again in their folders."""
    plan(sweep)
    check_plan(sweep, overwrite)
    todo = []
    for run in sweep.runs:
        if run.status == "done":
            echo(f"done already: {run.name} ({run.detail})")
        elif run.status == "unfinished" and not resume:
            echo(f"unfinished: {run.name} ({run.detail}); pass --resume to continue it")
        else:
            todo.append(run)
    if not todo:
        return sweep
    echo(f"sweep {sweep.name}: training {len(todo)} of {len(sweep.runs)} runs"
         + (f", {jobs} at a time" if jobs > 1 else ""))
    for run, note in unreached(todo):  # said before the runs, whose own output --quiet may hide
        echo(f"warning: {run.name}: {note}")
    tasks = [(run, run.status == "unfinished") for run in todo]
    if jobs > 1:
        import os

        from joblib import Parallel, delayed

        threads = max(1, (os.cpu_count() or 1) // jobs)
        with _workers_die_with_the_sweep():
            outcomes = Parallel(n_jobs=jobs, backend="loky")(
                delayed(_train_safely)(run, run_resume, threads, quiet_runs) for run, run_resume in tasks)
    else:
        outcomes = [_train_safely(run, run_resume, None, quiet_runs) for run, run_resume in tasks]
    for run, (status, detail) in zip(todo, outcomes):
        run.status, run.detail = status, detail
        echo(f"{status}: {run.name} ({detail})")
    return sweep


@contextlib.contextmanager
def _workers_die_with_the_sweep():
    """A sweep stopped by SIGTERM (``kill``) or Ctrl-C stops its worker processes too: without this,
    joblib's loky workers outlive a SIGTERM'd parent and go on training (and locking) run folders
    nobody asked for any more. SIGTERM becomes KeyboardInterrupt here; on it the workers are killed."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    except KeyboardInterrupt:
        from joblib.externals.loky import get_reusable_executor

        get_reusable_executor().shutdown(wait=False, kill_workers=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
