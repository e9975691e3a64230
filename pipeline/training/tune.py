"""`vse tune`: a search over training options with Optuna, one run folder per trial.

    name: mh_tuned                # optional; default: the file's stem
    runs_dir: runs                # optional; the tune folder is <runs_dir>/<name>
    base:                         # fixed TrainConfig fields, as in a sweep file
      features: cache/f8k.h5
      loss: mh
    search:                       # option → one distribution
      lr: {log_uniform: [1.0e-5, 1.0e-3]}
      margin: {uniform: [0.05, 0.5]}
      loss_options.warmup_epochs: {int: [0, 2]}
      batch_size: {choice: [64, 128]}

The objective is one validation metric (``--metric``, default rsum) of the trial's best.pt, on
the run's ``val_split`` (dev): the test split is never read. Each validation reports the metric
to the pruner (median, or Hyperband), which stops a trial that trails the others after an
epoch or two. The tune folder holds the study (``study.db``, SQLite; or ``--storage URL``),
one ordinary run folder per trial (``trial_0007/``: config.json, metrics.jsonl, best.pt and
``tune.json``, the trial's parameters, state and value) and ``plots/``. ``--trials N`` counts
COMPLETE and PRUNED trials of the study, whichever process ran them; a trial whose process was
killed is marked failed and re-run once with its parameters, never counted twice.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.config import TrainConfig
from pipeline.core.errors import VseError
from pipeline.core.fsutil import atomic_path
from pipeline.training.run_folder import best_record, read_validation_log
from pipeline.training.sweep import paths_for_file
from pipeline.training.tune_spec import (  # noqa: F401  (the file's names, re-exported)
    DEFAULT_METRIC,
    DISTRIBUTIONS,
    NOT_SEARCHED,
    PRUNERS,
    TEST_SPLIT,
    TUNE_KEYS,
    Budget,
    Param,
    TuneSpec,
    check_metric,
    check_schedules,
    load_tune,
    parse_budget,
)
from pipeline.training.tune_storage import (  # noqa: F401  (re-exported)
    HEARTBEAT_S,
    STUDY_FILE,
    check_storage,
    open_storage,
    storage_errors,
    storage_label,
    storage_url,
)

TRIAL_FILE = "tune.json"       # in each trial folder, and in the folder an exported sweep fills
EXPORT_TAG = "# vse tune export"
SAMPLER = "TPE"
TPE_STARTUP_TRIALS = 10       # TPE draws at random until the study has this many COMPLETE + PRUNED trials
DRAWN = ("random", "TPE", "re-run")  # how a trial's values were drawn (tune.json's "drawn")
MEDIAN_STARTUP_TRIALS = 3      # the median pruner prunes from the 4th trial on, from its 1st epoch
RETRIES = 1                    # a killed trial is re-run this many times with its parameters
UNCLAIMED_GRACE_S = 60         # a RUNNING trial that never named its host is stale after this


# ---------------------------------------------------------------------------- the study
@dataclass
class Settings:
    """What a study is made with, recorded in it: a second process (or a resumed tune) must
    give the same, and takes the recorded values for what it leaves unsaid."""

    budget: Budget
    metric: str
    pruner: str
    sampler_seed: int

    def attrs(self, tune: TuneSpec) -> dict:
        return {"budget": str(self.budget), "trials": self.budget.trials, "epochs": self.budget.epochs,
                "metric": self.metric, "pruner": self.pruner, "sampler": SAMPLER,
                "sampler_seed": self.sampler_seed, "fingerprint": tune.fingerprint(),
                "space": tune.space(), "tune_file": str(tune.path), "code": tune.code()}


def queue_again(study, frozen) -> bool:
    """Queue a failed trial again with its parameters (WAITING: the next ask takes it), unless it
    was a re-run already ``RETRIES`` times. Returns whether it was queued."""
    import optuna

    history = [*frozen.system_attrs.get("retry_history", []), frozen.number]
    if len(history) > RETRIES:
        return False
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.WAITING, params=frozen.params, distributions=frozen.distributions,
        system_attrs={**frozen.system_attrs, "failed_trial": history[0], "retry_history": history}))
    return True


def _pruner(name: str, epochs: int):
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=MEDIAN_STARTUP_TRIALS, n_warmup_steps=0)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=epochs, reduction_factor=3)
    return optuna.pruners.NopPruner()


def open_study(tune: TuneSpec, storage: str | None, budget: Budget | None, trials: int | None,
               metric: str | None, pruner: str | None, sampler_seed: int | None):
    """(study, settings): the tune's study, made with the settings given, or reopened with its
    recorded ones (a different budget's epochs, metric, pruner, seed or search is refused).
    Nothing is written before the settings are known to be complete and consistent."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # vse says what each trial did
    given = (budget, trials, metric, pruner, sampler_seed)
    if storage is None and not (tune.root / STUDY_FILE).exists():
        _settings(tune, {}, *given)  # a new study: refuse incomplete settings before any file
    url = storage_url(tune.root, storage)
    check_storage(url, tune.name, own_file=storage is None)  # reads only: nothing made in a wrong one
    lock = TuneLock(tune.root).acquire()  # one process of this machine makes the database at a time
    try:
        with storage_errors(url):
            return _open_study(tune, url, storage is not None, given)
    finally:
        lock.release()


def _open_study(tune: TuneSpec, url: str, shared: bool, given: tuple):
    import optuna

    store = open_storage(url, stale_trial=queue_again if shared else None)
    summary = {s.study_name: s for s in store.get_all_studies()}.get(tune.name)
    if summary is not None and "fingerprint" not in summary.user_attrs:  # not a study vse tune made
        made = len(store.get_all_trials(store.get_study_id_from_name(tune.name), deepcopy=False))
        if made:  # (one with no trial may be another process's, between its creation and its settings)
            raise VseError(f"holds a study named {tune.name!r} with {made} trial(s) that `vse tune` did not "
                           "make (no settings recorded): give another --name", storage_label(url))
    recorded = summary.user_attrs if summary is not None else {}
    settings, higher = _settings(tune, recorded, *given)
    study = optuna.create_study(study_name=tune.name, storage=store, load_if_exists=True,
                                pruner=_pruner(settings.pruner, settings.budget.epochs),
                                direction="maximize" if higher else "minimize")
    for key, value in settings.attrs(tune).items():
        if recorded.get(key) != value:
            study.set_user_attr(key, value)
    return study, settings


def _settings(tune: TuneSpec, recorded: dict, budget, trials, metric, pruner, sampler_seed):
    """(Settings, higher is better) from what is given, else recorded, else the defaults; sets
    base's epochs to the budget's. VseError for a setting unlike the study's."""
    epochs = budget.epochs if budget else recorded.get("epochs")
    if epochs is None:
        epochs = int(tune.base.get("epochs", TrainConfig.default("epochs")))
    count = budget.trials if budget else trials if trials is not None else recorded.get("trials")
    if count is None:
        raise VseError("give --budget TRIALSxEPOCHS (or --trials N): the study has none recorded", tune.path)
    settings = Settings(Budget(int(count), int(epochs)), metric or recorded.get("metric", DEFAULT_METRIC),
                        pruner or recorded.get("pruner", "median"),
                        sampler_seed if sampler_seed is not None else recorded.get("sampler_seed", 0))
    if settings.pruner not in PRUNERS:
        raise VseError(f"--pruner must be one of {', '.join(PRUNERS)}, got {settings.pruner!r}")
    higher = check_metric(settings.metric, tune.path)
    tune.base["epochs"] = settings.budget.epochs  # the budget's, over base's (the study's when reopened)
    check_schedules(tune)  # no trial trains another method under its loss's name
    attrs = settings.attrs(tune)
    # "code": a study made before vse recorded it keeps its trials (unknown code), as a sweep's runs do
    for key in ("epochs", "metric", "pruner", "sampler_seed", "fingerprint", "code"):
        if key in recorded and recorded[key] != attrs[key]:
            what = {"fingerprint": "the base: or search:", "code": "code (plug-in or built-in files, vse "
                    "version; code_id)"}.get(key, key)
            raise VseError(f"the study {tune.name!r} was made with another {what} ({recorded[key]!r}, now "
                           f"{attrs[key]!r}): its trials would not be comparable; give a new --name",
                           tune.path)
    return settings, higher


def sampler_for(study, settings: Settings):
    """The TPE sampler of the study's next trial, seeded by the sampler seed and that trial's
    number: one process's tune is the same whether killed and resumed or not, and processes
    sharing a study do not draw the same startup trials (as one seeded sampler each would)."""
    import optuna

    number = len(study.get_trials(deepcopy=False))
    seed = (settings.sampler_seed * 1_000_003 + number) % 2**32
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True, n_startup_trials=TPE_STARTUP_TRIALS)


# ---------------------------------------------------------------------------- running trials
class TuneLock:
    """TUNE/.tune.lock, held (flock, waiting) while a process checks for dead trials, counts and
    asks for a trial until it holds the new trial's folder: the processes of one machine never
    take a trial for dead in the instant between asking for it and locking its folder."""

    def __init__(self, root: Path):
        self.path, self.fd = Path(root) / ".tune.lock", None

    def acquire(self):
        if self.fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


class SurplusTrial(Exception):
    """A trial asked for by a process that raced another for the last ones of the budget."""


def trial_dir(tune: TuneSpec, number: int) -> Path:
    return tune.root / f"trial_{number:04d}"


def counts(study) -> dict:
    from optuna.trial import TrialState

    out = {state.name: 0 for state in TrialState}
    for trial in study.get_trials(deepcopy=False):
        out[trial.state.name] += 1
    out["counted"] = out["COMPLETE"] + out["PRUNED"]
    return out


def fail_dead_trials(study, tune: TuneSpec, echo=print) -> list[int]:
    """Mark failed each RUNNING trial of this machine whose process is gone (its folder's lock is
    free), and queue it again with its parameters (once). Call with the TuneLock held."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    from pipeline.core.runlock import RunLock

    host, failed = socket.gethostname(), []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get("host")
        if owner is None:
            started = trial.datetime_start.timestamp() if trial.datetime_start else time.time()
            if time.time() - started < UNCLAIMED_GRACE_S:
                continue
        elif owner != host:
            continue  # another machine's: its heartbeat tells (RDB storages)
        else:
            folder = trial_dir(tune, trial.number)
            lock = RunLock(folder)
            try:
                lock.acquire()
            except VseError:
                continue  # alive
            lock.release()
        try:
            if not study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL):
                continue
        except UpdateFinishedTrialError:
            continue  # another process failed it first
        again = queue_again(study, study._storage.get_trial(trial._trial_id))
        _update_trial_file(tune, trial.number, state="FAIL", reason="its process was gone")
        failed.append(trial.number)
        echo(f"trial {trial.number}: its process is gone; marked failed"
             + (" and queued again with its parameters" if again else ""))
    return failed


def run_tune(tune: TuneSpec, study, settings: Settings, echo=print) -> dict:
    """Run trials until the study has ``settings.budget.trials`` COMPLETE + PRUNED ones (or the
    rest are running in other processes). Returns ``counts``."""
    from pipeline.core.runtime import release_run_memory

    lock = TuneLock(tune.root)
    while True:
        lock.acquire()
        try:
            fail_dead_trials(study, tune, echo)
            now = counts(study)
            if now["counted"] >= settings.budget.trials:
                return now
            if now["counted"] + now["RUNNING"] >= settings.budget.trials:
                echo(f"{now['counted']} trials done, the other {now['RUNNING']} running in other processes")
                return now
            objective = _Objective(tune, settings, lock, echo)
            study.sampler = sampler_for(study, settings)
            study.optimize(objective, n_trials=1, catch=(SurplusTrial,))
        finally:
            lock.release()
            # a pruned or failed trial's exception (kept by Optuna's trial loop with its traceback) holds
            # the trial's trainer in a cycle: free it before the next trial loads its data again
            release_run_memory()


@dataclass
class _Objective:
    tune: TuneSpec
    settings: Settings
    lock: TuneLock
    echo: object

    def __call__(self, trial) -> float:
        from optuna.trial import TrialState

        from pipeline.core.runlock import RunLock

        folder = trial_dir(self.tune, trial.number)
        run_lock = RunLock(folder).acquire()
        try:
            trial.set_user_attr("host", socket.gethostname())
            trial.set_user_attr("pid", os.getpid())
            trial.set_user_attr("run_dir", str(folder))
            self.lock.release()  # the trial is claimed: others may ask for theirs
            study = trial.study
            earlier = [t for t in study.get_trials(deepcopy=False)
                       if t.number < trial.number and t.state in (TrialState.RUNNING, TrialState.WAITING)]
            if counts(study)["counted"] + len(earlier) >= self.settings.budget.trials:
                trial.set_user_attr("surplus", True)
                raise SurplusTrial(f"trial {trial.number}: the budget's trials are taken")
            drawn = _drawn(study, trial)
            trial.set_user_attr("drawn", drawn)
            values = {p.key: p.suggest(trial) for p in self.tune.params}
            config = self.tune.trial_config(values, folder)
            _write_json(folder / TRIAL_FILE, {**_trial_record(self.tune, self.settings, trial.number, values,
                                                              "RUNNING", None, {}), "drawn": drawn})
            self.echo(f"trial {trial.number}: " + ", ".join(f"{k}={_short(v)}" for k, v in values.items()))
            return self._train(trial, config, folder)
        finally:
            run_lock.release()

    def _train(self, trial, config: dict, folder: Path) -> float:
        import optuna

        metric = self.settings.metric
        try:
            _trial_trainer(TrainConfig.from_dict(config), trial, metric).fit()
        except optuna.TrialPruned:
            self._finish(trial, folder, "PRUNED")
            raise
        except VseError as exc:
            if "loss became" not in str(exc):  # a diverging trial is a bad trial; anything else stops
                self._finish(trial, folder, "FAIL", reason=str(exc))
                raise
            trial.set_user_attr("diverged", str(exc)[:300])
            self._finish(trial, folder, "PRUNED", reason=str(exc))
            raise optuna.TrialPruned(str(exc)) from None
        except BaseException as exc:  # Ctrl-C, a bug: Optuna marks the trial failed
            self._finish(trial, folder, "FAIL", reason=repr(exc)[:300])
            raise
        best = best_record(read_validation_log(folder), key="rsum")  # the record best.pt holds
        value = float(best[metric])
        trial.set_user_attr("best_epoch", int(best["epoch"]))
        self._finish(trial, folder, "COMPLETE", value)
        self.echo(f"trial {trial.number}: {metric} {value:.2f} (best.pt at epoch {best['epoch']})")
        return value

    def _finish(self, trial, folder: Path, state: str, value=None, reason=None) -> None:
        records = read_validation_log(folder)
        steps = {str(i): r[self.settings.metric] for i, r in enumerate(records, 1)}
        record = _trial_record(self.tune, self.settings, trial.number, dict(trial.params), state, value,
                               steps)
        _write_json(folder / TRIAL_FILE, {**record, "drawn": trial.user_attrs.get("drawn"),
                                          **({"reason": reason} if reason else {})})
        if state == "PRUNED":
            self.echo(f"trial {trial.number}: pruned after {len(records)} validation(s)"
                      + (f" ({reason.split(': ', 1)[-1]})" if reason else ""))


def _drawn(study, trial) -> str:
    """How the trial's values are drawn (one of DRAWN): a failed trial's queued again ("re-run"),
    TPE's start-up ("random": fewer than TPE_STARTUP_TRIALS COMPLETE + PRUNED trials, the count
    TPESampler reads), else "TPE"."""
    from optuna.trial import TrialState

    if "failed_trial" in study._storage.get_trial(trial._trial_id).system_attrs:  # queue_again's mark
        return DRAWN[2]
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    return DRAWN[0] if len(done) < TPE_STARTUP_TRIALS else DRAWN[1]


def _trial_trainer(config: TrainConfig, trial, metric: str):
    """The run's Trainer, reporting ``metric`` to the trial after each validation (step: the
    validation's number, the epoch when the run validates at epoch ends) and stopping when the
    pruner says so: through ``validate_and_save``, after the record and checkpoints are written."""
    import optuna

    from pipeline.training.build import build_run
    from pipeline.training.trainer import Trainer

    class TrialTrainer(Trainer):
        def validate_and_save(self):
            super().validate_and_save()
            records = self.run.records()
            if not records:
                return
            trial.report(float(records[-1][metric]), len(records))
            if trial.should_prune():
                raise optuna.TrialPruned(f"pruned at validation {len(records)}")

    return TrialTrainer(build_run(config, echo=lambda *a, **k: None))


def _trial_record(tune, settings, number, params, state, value, steps) -> dict:
    return {"format": "vse-tune-trial", "study": tune.name, "tune_file": str(tune.path), "trial": number,
            "params": params, "state": state, "metric": settings.metric, "value": value,
            "intermediate": steps, "budget": str(settings.budget), "sampler": SAMPLER,
            "sampler_seed": settings.sampler_seed, "pruner": settings.pruner}


def _update_trial_file(tune: TuneSpec, number: int, **changes) -> None:
    """Change entries of a trial folder's tune.json (a trial that failed)."""
    path = trial_dir(tune, number) / TRIAL_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    _write_json(path, {**record, **changes})


def _write_json(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(record, indent=2, default=str, ensure_ascii=False), encoding="utf-8")


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# ---------------------------------------------------------------------------- results
def best_trial(study):
    """The best COMPLETE trial (None when there is none yet)."""
    try:
        return study.best_trial
    except ValueError:
        return None


def summary_lines(study, settings: Settings) -> list[str]:
    now = counts(study)
    lines = [f"study {study.study_name}: {now['COMPLETE']} complete, {now['PRUNED']} pruned, "
             f"{now['FAIL']} failed, {now['RUNNING']} running (budget {settings.budget}, {SAMPLER} seed "
             f"{settings.sampler_seed}, {settings.pruner} pruner)"]
    best = best_trial(study)
    if best is not None:
        lines.append(f"best: trial {best.number}, dev {settings.metric} {best.value:.2f}: "
                     + ", ".join(f"{k}={_short(v)}" for k, v in best.params.items()))
    return lines


def export_best(tune: TuneSpec, study, settings: Settings, out, overwrite: bool = False) -> Path:
    """Write the best trial's options as an experiment YAML for `vse sweep OUT --seeds 0-2`:
    base: the tune's base with the chosen values (the same config_id as the trial). The folder
    that sweep fills gets ``tune.json`` (the study, its budget), which `vse report` shows."""
    import yaml

    best = best_trial(study)
    if best is None:
        raise VseError("the study has no complete trial yet: nothing to export", tune.root)
    out = Path(out)
    if out.exists() and not overwrite and not out.read_text(encoding="utf-8").startswith(EXPORT_TAG):
        raise VseError("exists and is not a `vse tune --export` file (give --overwrite to replace it)", out)
    config = tune.trial_config(best.params, "")
    config.pop("run_dir")
    if not config.get("loss_options"):
        config.pop("loss_options")
    name = f"{tune.name}-best"
    # its paths as read from OUT's folder: swept from here, the seeds name the trial's files alike
    spec = paths_for_file({"name": name, "runs_dir": str(tune.runs_dir)}, out.parent)
    spec["base"] = paths_for_file(config, out.parent)
    header = (f"{EXPORT_TAG} of {tune.path}: study {tune.name}, trial {best.number} "
              f"(dev {settings.metric} {best.value:.2f}), budget {settings.budget}, {SAMPLER} seed "
              f"{settings.sampler_seed}, {settings.pruner} pruner\n"
              f"# vse sweep {out} --seeds 0-2\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        Path(tmp).write_text(header + yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    _write_json(tune.runs_dir / name / TRIAL_FILE,
                {**_trial_record(tune, settings, best.number, best.params, "COMPLETE", best.value, {}),
                 "format": "vse-tune-export", "export": str(out)})
    return out


def tune_budget(run_dir) -> str | None:
    """The tune budget of a run: ``tune.json`` in its folder (a trial) or the folder above (the
    sweep of an exported best trial); None for a run that was not tuned."""
    for folder in (Path(run_dir), Path(run_dir).parent):
        path = folder / TRIAL_FILE
        if path.is_file():
            try:
                return str(json.loads(path.read_text(encoding="utf-8"))["budget"])
            except (OSError, ValueError, KeyError, TypeError):
                return None
    return None
