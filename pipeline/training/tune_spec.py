"""A `vse tune` file read and checked: its search space (``Param``), its budget (``Budget``) and
the whole file (``TuneSpec``, ``load_tune``). Every problem is one VseError naming the file and the
key, raised before any trial runs (pipeline.training.tune runs the study). Its relative paths
(``runs_dir:``, base's files, a plug-in's ``FILE.py``, also among a search's choices) are the
file's folder's, as a sweep file's (``sweep.resolve_paths``)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.config import LOSS_FLAGS, TrainConfig, execution_only, option_names
from pipeline.core.errors import VseError
from pipeline.core.values import allowed_types, option_types
from pipeline.training.sweep import (
    LOSS_OPTION_PREFIX,
    check_folder_name,
    read_yaml_mapping,
    resolve_paths,
    resolved_path,
    run_config,
)

TUNE_KEYS = ("name", "runs_dir", "base", "search")
DISTRIBUTIONS = ("uniform", "log_uniform", "int", "choice")
NO_PRUNER = "none"              # every trial trains the whole budget (Optuna's NopPruner)
PRUNERS = ("median", "hyperband", NO_PRUNER)
DEFAULT_METRIC = "rsum"
TEST_SPLIT = "test"
# Options a search may not vary: what and where a run reads (the split it validates on included),
# how long it trains (the budget's EPOCHS), and where and how it runs.
NOT_SEARCHED = ("features", "text_features", "relevance", "root", "run_dir", "seed", "epochs",
                "train_split", "val_split", "val_images", "init_from", "noise_index")

# ---------------------------------------------------------------------------- the file
@dataclass
class Param:
    """One searched option: ``kind`` (one of DISTRIBUTIONS) over ``values`` ([low, high] or choices)."""

    key: str
    kind: str
    values: list

    def suggest(self, trial):
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, self.values)
        low, high = self.values
        if self.kind == "int":
            return trial.suggest_int(self.key, low, high)
        return trial.suggest_float(self.key, float(low), float(high), log=self.kind == "log_uniform")

    def corners(self) -> list:
        """The values that bound the range, of the type a trial gets: what the checks try."""
        floats = self.kind in ("uniform", "log_uniform")
        return [float(v) for v in self.values] if floats else list(self.values)

    def to_dict(self) -> dict:
        return {self.kind: self.values}


@dataclass
class Budget:
    trials: int
    epochs: int

    def __str__(self) -> str:
        return f"{self.trials}×{self.epochs}"


@dataclass
class TuneSpec:
    path: Path
    name: str
    runs_dir: Path
    base: dict                      # the file's base: with the tune's own settings (epochs, val_every);
    #                                 its paths as the file names them (``config`` reads them)
    params: list[Param] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.runs_dir / self.name

    def space(self) -> dict:
        return {p.key: p.to_dict() for p in self.params}

    def config(self, values: dict) -> dict:
        """base with the searched ``values`` applied (a sweep's rule), paths read from the file's folder."""
        folder = self.path.parent
        return run_config(resolve_paths(self.base, folder), values, self.path, folder=folder)

    def trial_config(self, values: dict, run_dir) -> dict:
        """The training config of one trial."""
        config = self.config(values)
        config["run_dir"] = str(run_dir)
        return config

    def code(self) -> str:
        """The code_id of every configuration a trial may train (``core.code_identity``; a search over
        plug-ins has one per choice), joined: a study's trials are comparable while it stays the same."""
        from pipeline.core.code_identity import PLUGIN_OPTIONS, of_config

        low = {p.key: p.corners()[0] for p in self.params}
        configs = [self.config(low)] + [self.config({**low, p.key: value}) for p in self.params
                                        if p.key in PLUGIN_OPTIONS for value in p.values]
        return ",".join(sorted({of_config(config)["code_id"] for config in configs}))

    def fingerprint(self) -> str:
        """What the study's trials share: the base and the search space (a digest)."""
        text = json.dumps({"base": self.base, "space": self.space()}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def parse_budget(text: str) -> Budget:
    """'20x3' or '20×3' → 20 trials of 3 epochs."""
    match = re.fullmatch(r"\s*(\d+)\s*[x×X]\s*(\d+)\s*", str(text))
    if not match or int(match[1]) < 1 or int(match[2]) < 1:
        raise VseError(f"--budget is TRIALSxEPOCHS with both at least 1, e.g. 20x3; got {text!r}")
    return Budget(int(match[1]), int(match[2]))


def load_tune(path, runs_dir=None, name=None) -> TuneSpec:
    """Read and check a tune file: every problem is one VseError naming the file and the key,
    raised before any trial runs."""
    path = Path(path)
    spec = read_yaml_mapping(path, "tune file", "base: and search:")
    unknown = sorted(set(spec) - set(TUNE_KEYS))
    if unknown:
        hint = (" (a tune file searches one configuration: tune each method of a comparison from its own "
                "file with the same --budget)" if {"grid", "seeds"} & set(unknown) else "")
        raise VseError(f"unknown tune key(s) {', '.join(unknown)} (expected {', '.join(TUNE_KEYS)}){hint}",
                       path)
    base, search = spec.get("base") or {}, spec.get("search") or {}
    if not isinstance(base, dict) or not isinstance(search, dict):
        raise VseError("base: and search: must be mappings", path)
    if not search:
        raise VseError("search: names no option to tune", path)
    name = check_folder_name(str(name or spec.get("name") or path.stem), "tune name", path)
    base = dict(base)
    base.setdefault("val_every", 0)  # a trial validates at its epoch ends: the pruner's steps
    for key in ("val_split", "train_split"):
        if base.get(key, TrainConfig.default(key)) == TEST_SPLIT:
            raise VseError(f"base: {key}: a tune never reads the {TEST_SPLIT!r} split (it validates "
                           "on dev; test is for the seeds of the chosen options)", path)
    losses = _tune_losses(base, search)
    params = [_param(key, value, base, path, losses) for key, value in search.items()]
    file_runs_dir = spec.get("runs_dir")
    if file_runs_dir is not None and not isinstance(file_runs_dir, str):
        raise VseError(f"runs_dir must be a folder name, got {file_runs_dir!r}", path)
    file_runs_dir = file_runs_dir and resolved_path(file_runs_dir, path.parent)
    tune = TuneSpec(path, name, Path(runs_dir or file_runs_dir or "runs"), base, params)
    _check_corners(tune)
    return tune


def _tune_losses(base: dict, search: dict) -> list:
    """The losses a tune's trials may train with: the searched choices, else base's (or the default)."""
    searched = search.get("loss")
    if isinstance(searched, dict) and isinstance(searched.get("choice"), list):
        return [spec for spec in searched["choice"] if isinstance(spec, str)]
    return [base.get("loss", TrainConfig.default("loss"))]


def _declared_loss_options(losses: list) -> list:
    """The ``Options`` dataclasses of ``losses`` (a loss that declares none, or a name or file that is
    no loss, left out: the corners say so)."""
    from pipeline.losses.plugins import options_class

    declared = []
    for spec in losses:
        try:
            declared.append(options_class(spec))
        except VseError:
            continue
    return [options for options in declared if options is not None]


def _integer_loss_option(option: str, losses: list) -> bool:
    """Some loss of ``losses`` declares its option ``option`` an integer."""
    hints = [option_types(declared).get(option) for declared in _declared_loss_options(losses)]
    return any(hint is not None and set(allowed_types(hint)) - {type(None)} == {int} for hint in hints)


def _loss_option_named(key: str, losses: list) -> str | None:
    """The loss option ``key`` names: one of ``losses`` declares it, or it is a loss flag's name
    (``LOSS_FLAGS``: ``lseh_lambda`` → ``lambda_``); None otherwise."""
    spelled = next((flag.key for name, flag in LOSS_FLAGS.items() if key in (name, flag.key)), None)
    declared = any(key in option_types(options) for options in _declared_loss_options(losses))
    return spelled or (key if declared else None)


def _param(key, value, base: dict, path, losses: list) -> Param:
    where = f"search: {key}"
    if not isinstance(key, str):
        raise VseError(f"{where}: a key is an option name", path)
    if key.startswith(LOSS_OPTION_PREFIX):
        option = key[len(LOSS_OPTION_PREFIX):]
        if not option:
            raise VseError(f"{where}: name the loss option (loss_options.<option>)", path)
        if option in (base.get("loss_options") or {}):
            raise VseError(f"{where}: base: sets loss_options.{option} already (a fixed value); "
                           "fix it in base: or search it, not both", path)
    else:
        if key not in option_names() or key == "loss_options":
            option = _loss_option_named(key, losses)
            hint = f"; did you mean {LOSS_OPTION_PREFIX}{option}?" if option else ""
            raise VseError(f"{where}: unknown option (expected a training option, TrainConfig field, "
                           f"or {LOSS_OPTION_PREFIX}<option>){hint}", path)
        if key in NOT_SEARCHED or key in execution_only():
            raise VseError(f"{where}: not searched (what a run reads, how long it trains and where it "
                           "runs are fixed; --budget sets the epochs)", path)
        if key in base:
            raise VseError(f"{where}: base: sets {key} already (a fixed value); fix it in base: or "
                           "search it, not both", path)
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in DISTRIBUTIONS:
        raise VseError(f"{where}: expected one distribution, {{uniform | log_uniform | int: [low, high]}} "
                       f"or {{choice: [values]}}, got {value!r}", path)
    kind, values = next(iter(value.items()))
    if kind == "choice":
        if not isinstance(values, list) or not values:
            raise VseError(f"{where}: choice needs a non-empty list of values", path)
        if not all(v is None or isinstance(v, (bool, int, float, str)) for v in values):
            raise VseError(f"{where}: choices are numbers, strings, booleans or null", path)
        if len({json.dumps(v) for v in values}) < len(values):
            raise VseError(f"{where}: a choice is listed twice", path)
        return Param(key, kind, values)
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                  for v in (values if isinstance(values, list) else []))
    if not isinstance(values, list) or len(values) != 2 or not numeric:
        raise VseError(f"{where}: {kind} needs a range [low, high] of two finite numbers, got {values!r}",
                       path)
    low, high = values
    if kind == "int" and not all(isinstance(v, int) for v in values):
        raise VseError(f"{where}: int needs whole numbers, got {values!r}", path)
    if low >= high:
        raise VseError(f"{where}: empty range [{low}, {high}] (low must be below high; a single value "
                       "goes in base:)", path)
    option = key[len(LOSS_OPTION_PREFIX):] if key.startswith(LOSS_OPTION_PREFIX) else None
    if kind != "int" and option and _integer_loss_option(option, losses):
        raise VseError(f"{where}: an integer option: use {{int: [low, high]}} or {{choice: [...]}}", path)
    if kind == "log_uniform" and low <= 0:
        raise VseError(f"{where}: log_uniform range [{low}, {high}] reaches 0 or below (a log scale "
                       "needs low > 0)", path)
    return Param(key, kind, [low, high])


def _check_corners(tune: TuneSpec) -> None:
    """Each searched value at the ends of its range (each choice) with the others at their low
    end makes a valid config and loss: a bad range is refused now, not in trial 12. A value that
    fails on its own is blamed first, so the message names the key that is wrong."""
    low = {p.key: p.corners()[0] for p in tune.params}
    for param in tune.params:  # alone: the one at fault, not the first key of a failing combination
        for value in param.corners():
            _check_values(tune, param.key, value, {param.key: value})
    for param in tune.params:
        for value in param.corners():
            _check_values(tune, param.key, value, {**low, param.key: value})


def _check_values(tune: TuneSpec, key: str, value, searched: dict) -> None:
    from pipeline.losses.plugins import make_loss

    try:
        config = TrainConfig.from_dict(tune.config(searched))
        config.check()
        make_loss(config.loss, config.loss_kwargs())
    except VseError as exc:
        raise VseError(f"search: {key}: {value!r} does not make a run: {exc}", tune.path) from None


def check_schedules(tune: TuneSpec) -> None:
    """No trial may train another method under its loss's name (issue 49): with the trials' epochs
    (``tune.base``'s, the budget's), the searched values at their low ends, then each at each end of
    its range (each choice), must let every part of the loss's method begin
    (``training.settings.unreached_phases``). VseError naming the key, before any trial."""
    from pipeline.training.factories import schedule_note

    epochs = tune.base.get("epochs")

    def note(searched: dict) -> str | None:
        return schedule_note(TrainConfig.from_dict(tune.config(searched)))

    low = {p.key: p.corners()[0] for p in tune.params}
    found = note(low)
    if found:
        lows = "".join(f", {key} {value!r}" for key, value in low.items())
        raise VseError(f"base: (with the search's low ends{lows}) every trial of {epochs} epoch(s) would "
                       f"miss its method: {found}; give more epochs (--budget) or a shorter warm-up",
                       tune.path)
    for param in tune.params:
        for value in param.corners():
            found = note({**low, param.key: value})
            if found:
                raise VseError(f"search: {param.key}: {value!r} makes a trial of {epochs} epoch(s) miss its "
                               f"method: {found}; keep the range below it or give more epochs (--budget)",
                               tune.path)


def check_metric(metric: str, path) -> bool:
    """True when higher is better; VseError when the validation log has no such metric."""
    from pipeline.evaluation.metrics import METRIC_KEYS, metric_of

    if metric not in METRIC_KEYS:
        raise VseError(f"--metric {metric!r} is no validation metric (one of {', '.join(METRIC_KEYS)})", path)
    return metric_of(metric).higher_is_better
