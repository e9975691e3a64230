"""`vse tune`: the search file's checks, trials as run folders, pruning, resuming after a kill,
two processes on one study, plots, and the exported sweep file's round trip."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, vse

optuna = pytest.importorskip("optuna")

from pipeline.core.errors import VseError  # noqa: E402
from pipeline.data.caption_index import CaptionIndex  # noqa: E402
from pipeline.training.run_folder import config_id, read_config, read_validation_log  # noqa: E402
from pipeline.training.tune import (  # noqa: E402
    Budget,
    Settings,
    load_tune,
    parse_budget,
    run_tune,
    trial_dir,
    tune_budget,
)

TINY = {"embed_dim": 16, "word_dim": 8, "batch_size": 16, "min_word_count": 1, "workers": 0, "log_every": 1,
        "device": "cpu"}
SEARCH = {"lr": {"log_uniform": [1e-3, 2e-2]}, "margin": {"uniform": [0.05, 0.5]}}
# A loss that takes a while per step, so a process can be killed in the middle of a trial.
SLOW_LOSS = '''
import time
from torch import nn
from pipeline.losses.base import build_loss


class SlowHinge(nn.Module):
    similarity = "cosine"

    def __init__(self, margin: float = 0.2):
        super().__init__()
        self.inner = build_loss("sh", margin=margin)

    def forward(self, img, cap, image_ids=None, relevance=None):
        time.sleep(0.03)
        return self.inner(img, cap, image_ids=image_ids, relevance=relevance)
'''


def _tune_file(tmp_path, cache, search=SEARCH, name="tune.yaml", **base) -> Path:
    path = tmp_path / name
    spec = {"runs_dir": str(tmp_path / "runs"), "base": {"features": str(cache), **TINY, **base},
            "search": search}
    path.write_text(yaml.safe_dump(spec))
    return path


def _slow_file(tmp_path, cache, **base) -> Path:
    (tmp_path / "slow_loss.py").write_text(SLOW_LOSS)
    return _tune_file(tmp_path, cache, {"lr": {"log_uniform": [1e-3, 2e-2]},
                                        "loss_options.margin": {"uniform": [0.05, 0.5]}},
                      loss=f"{tmp_path / 'slow_loss.py'}:SlowHinge", **base)


def _study(tmp_path, name="tune"):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'runs' / name / 'study.db'}")


def _states(study) -> list[str]:
    return [t.state.name for t in study.get_trials()]


@pytest.fixture
def no_test_split(monkeypatch):
    """Reading the test split raises: a tune must never read it."""
    original = CaptionIndex.split

    def split(self, name):
        if name == "test":
            raise AssertionError("the test split was read while tuning")
        return original(self, name)

    monkeypatch.setattr(CaptionIndex, "split", split)


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("search, base, flags, key, problem", [
    ({"lrr": {"uniform": [0.1, 0.2]}}, {}, (), "search: lrr", "unknown option"),
    ({"loss_options.tua": {"uniform": [0.1, 0.2]}}, {}, (), "search: loss_options.tua",
     "loss mh has no option tua (its options: "),
    ({"lr": {"log_uniform": [1e-3, 2e-2]}, "loss_options.tua": {"uniform": [0.1, 0.2]}}, {}, (),
     "search: loss_options.tua", "loss mh has no option tua"),  # the wrong key is named, not the first
    ({"margin": {"uniform": [0.5, 0.1]}}, {}, (), "search: margin", "empty range [0.5, 0.1]"),
    ({"warmup_epochs": {"int": [0, 2]}}, {}, (), "search: warmup_epochs",
     "unknown option (expected a training option, TrainConfig field, or loss_options.<option>); did you mean "
     "loss_options.warmup_epochs?"),
    ({"loss_options.warmup_epochs": {"int": [2, 1]}}, {}, (), "search: loss_options.warmup_epochs",
     "empty range"),
    ({"lr_decay_epoch": {"choice": []}}, {}, (), "search: lr_decay_epoch", "non-empty list"),
    ({"lr_decay_epoch": {"uniform": [1, 3]}}, {}, (), "search: lr_decay_epoch", "must be an integer"),
    ({"loss_options.warmup_epochs": {"uniform": [0, 2]}}, {}, (), "search: loss_options.warmup_epochs",
     "an integer option"),
    ({"lr": {"log_uniform": [0, 1e-3]}}, {}, (), "search: lr", "reaches 0"),
    ({"lr": {"uniform": [0, 1e-3]}}, {}, (), "search: lr", "lr must be more than 0"),
    ({"margin": {"uniform": [0.1, 0.2]}}, {"margin": 0.2}, (), "search: margin", "base: sets margin already"),
    ({"loss_options.warmup_epochs": {"int": [0, 2]}}, {"loss_options": {"warmup_epochs": 1}}, (),
     "search: loss_options.warmup_epochs", "base: sets loss_options.warmup_epochs already"),
    ({"epochs": {"int": [1, 3]}}, {}, (), "search: epochs", "--budget sets the epochs"),
    ({"lr": {"normal": [0, 1]}}, {}, (), "search: lr", "expected one distribution"),
    (SEARCH, {"val_split": "test"}, (), "base: val_split", "never reads the 'test' split"),
    (SEARCH, {}, ("--metric", "rsun"), "--metric 'rsun'", "no validation metric"),
])
def test_bad_input_is_refused_in_one_line_before_any_trial(tmp_path, tiny_cache, search, base, flags, key,
                                                           problem):
    path = _tune_file(tmp_path, tiny_cache, search, **base)
    result = vse("tune", path, "--budget", "2x1", *flags)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: {key}"), result.output
    assert problem in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()  # nothing written, no study made


def test_budget_accepts_x_and_times_sign():
    assert parse_budget("20x3") == parse_budget("20×3") == Budget(20, 3)
    assert str(Budget(20, 3)) == "20×3"
    with pytest.raises(VseError, match="TRIALSxEPOCHS"):
        parse_budget("20")
    with pytest.raises(VseError, match="TRIALSxEPOCHS"):
        parse_budget("0x3")


def test_a_tune_file_has_no_grid(tmp_path, tiny_cache):
    path = _tune_file(tmp_path, tiny_cache)
    path.write_text(path.read_text() + "grid:\n  loss: [sh, mh]\n")
    with pytest.raises(VseError, match="unknown tune key.*grid.*same --budget"):
        load_tune(path)


# ---------------------------------------------------------------------------- a whole tune
def test_tune_runs_trials_as_run_folders_plots_and_exports_a_sweep(tmp_path, tiny_cache, no_test_split):
    path = _tune_file(tmp_path, tiny_cache)
    best_yaml = tmp_path / "best.yaml"
    result = vse("tune", path, "--budget", "4x2", "--export", best_yaml)
    assert result.exit_code == 0, result.output
    study = _study(tmp_path)
    assert sorted(_states(study)) == sorted(s for s in _states(study) if s in ("COMPLETE", "PRUNED"))
    assert len(study.trials) == 4
    assert {k: study.user_attrs[k] for k in ("budget", "sampler", "sampler_seed", "metric", "pruner")} == {
        "budget": "4×2", "sampler": "TPE", "sampler_seed": 0, "metric": "rsum", "pruner": "median"}
    root = tmp_path / "runs" / "tune"
    for trial in study.trials:  # each trial is an ordinary run folder, its record beside
        folder = root / f"trial_{trial.number:04d}"
        config = read_config(folder)
        assert config["lr"] == trial.params["lr"] and config["margin"] == trial.params["margin"]
        assert config["epochs"] == 2 and config["val_every"] == 0 and config["run_dir"] == str(folder)
        record = json.loads((folder / "tune.json").read_text())
        assert record["state"] == trial.state.name and record["params"] == trial.params
        assert record["budget"] == "4×2" and tune_budget(folder) == "4×2"
        assert len(read_validation_log(folder)) == len(record["intermediate"])
        if trial.state.name == "COMPLETE":
            assert record["value"] == trial.value == max(r["rsum"] for r in read_validation_log(folder))
    assert sorted(p.name for p in (root / "plots").glob("*.png")) == [
        "contour.png", "history.png", "importance.png", "slice.png"]

    # the exported file is a sweep file whose runs are the best trial's configuration
    from pipeline.reports.report import format_results
    from pipeline.training.sweep import load_sweep

    sweep = load_sweep(best_yaml, seeds=[0, 1, 2])
    best = root / f"trial_{study.best_trial.number:04d}"
    assert [r.name for r in sweep.runs] == ["seed=0", "seed=1", "seed=2"]
    assert {config_id(r.config) for r in sweep.runs} == {config_id(read_config(best))}
    ids = {t.number: config_id(read_config(trial_dir(load_tune(path), t.number))) for t in study.trials}
    assert [n for n, i in ids.items() if i == config_id(sweep.runs[0].config)] == [study.best_trial.number]
    ran = vse("sweep", best_yaml, "--seeds", "0-2", "--dry-run")
    assert ran.exit_code == 0 and ran.output.count("new ") == 3, ran.output
    # vse report states the budget beside the row of a run from that sweep
    row = {"run": "tune-best/seed=0", "checkpoint": str(sweep.root / "seed=0" / "best.pt"), "rsum": 300.0,
           "i2t_r1": 50.0, "config_id": "abc"}
    assert "tune-best/seed=0 (tuned 4×2)" in format_results([row], layout="recall")

    # the study is done: the same command runs nothing; another epoch budget is refused
    again = vse("tune", path)
    assert again.exit_code == 0 and not re.search(r"^trial \d+:", again.output, re.M), again.output
    assert len(_study(tmp_path).trials) == 4
    other = vse("tune", path, "--budget", "4x3")
    assert other.exit_code == 1 and "made with another epochs (2, now 3)" in other.output


def test_pruning_stops_a_trial_after_its_first_validation(tmp_path, tiny_cache, no_test_split):
    """The pruner sees the dev metric after every epoch (the trainer's validation) and stops the
    trial there: its folder keeps that one validation and its checkpoints."""
    tune = load_tune(_tune_file(tmp_path, tiny_cache))
    tune.base["epochs"] = 3
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=1e9))
    run_tune(tune, study, Settings(Budget(1, 3), "rsum", "median", 0), echo=lambda *a: None)
    (trial,) = study.trials
    records = read_validation_log(trial_dir(tune, 0))
    assert trial.state.name == "PRUNED" and len(records) == 1
    assert trial.intermediate_values == {1: pytest.approx(records[0]["rsum"], abs=1e-9)}
    assert (trial_dir(tune, 0) / "best.pt").is_file()
    assert json.loads((trial_dir(tune, 0) / "tune.json").read_text())["state"] == "PRUNED"


# ---------------------------------------------------------------------------- processes
def _start(path, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "cli.main", "tune", str(path), *map(str, args)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow  # processes: `pytest -m "not slow"` skips them
def test_a_killed_tune_resumes_without_counting_a_trial_twice(tmp_path, tiny_cache):
    path = _slow_file(tmp_path, tiny_cache)
    process = _start(path, "--budget", "3x5", "--pruner", "none", "--no-plots")
    marker = tmp_path / "runs" / "tune" / "trial_0001" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.kill()  # SIGKILL in the middle of trial 1 (after its first of 5 epochs)
    output = process.communicate()[0]
    assert marker.exists(), output
    killed = _study(tmp_path).trials[1]
    assert killed.state.name == "RUNNING"

    result = vse("tune", path, "--no-plots")  # the study's budget and settings are recorded
    assert result.exit_code == 0, result.output
    assert "trial 1: its process is gone; marked failed and queued again" in result.output
    trials = _study(tmp_path).trials
    assert [t.state.name for t in trials].count("COMPLETE") == 3
    assert trials[1].state.name == "FAIL"
    (rerun,) = [t for t in trials if t.system_attrs.get("failed_trial") == 1]
    assert rerun.params == killed.params and rerun.state.name == "COMPLETE"
    assert json.loads((trial_dir(load_tune(path), 1) / "tune.json").read_text())["state"] == "FAIL"
    assert len(read_validation_log(trial_dir(load_tune(path), rerun.number))) == 5


@pytest.mark.slow  # processes: `pytest -m "not slow"` skips them
def test_two_processes_share_one_study(tmp_path, tiny_cache):
    path = _slow_file(tmp_path, tiny_cache)
    workers = [_start(path, "--budget", "6x3", "--no-plots") for _ in range(2)]
    outputs = [w.communicate(timeout=300)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    study = _study(tmp_path)
    assert len(study.trials) == 6 and all(s in ("COMPLETE", "PRUNED") for s in _states(study))
    assert {t.user_attrs["pid"] for t in study.trials} == {w.pid for w in workers}, outputs
    folders = sorted(p.name for p in (tmp_path / "runs" / "tune").glob("trial_*"))
    assert folders == [f"trial_{i:04d}" for i in range(6)]


@pytest.mark.parametrize("name", ["..", ".", "a/b"])
def test_a_tune_name_is_one_plain_folder(tmp_path, tiny_cache, name):
    """'..' would put the trials beside the runs dir, '.' into it (sweep's rule, one place)."""
    path = _tune_file(tmp_path, tiny_cache)
    with pytest.raises(VseError, match="one folder name"):
        load_tune(path, name=name)
