"""A finished run's large objects do not outlive it (issue 49): its data (the preloaded feature
array, the caption side), model and optimizer are gone when the run is, so a loop of runs in one
process (`vse sweep`, `vse tune`) holds one run's memory, not the sum of them. Checked by weak
references with the garbage collector off: what only a later full collection would free counts
as held (a sweep reached 11.9 GB by its fifth run so). The full-size figures are in
bench/run_memory.py's JSON."""

from __future__ import annotations

import gc
import weakref

import pytest
import yaml
from conftest import QUIET, TINY_TRAIN, train_run

import pipeline.training.build as build
from pipeline.core.config import TrainConfig
from pipeline.training.sweep import load_sweep, run_sweep

# A loss whose value is NaN from the first step: the run fails (a sweep), the trial diverges and is
# pruned (a tune); either way the run ends in an exception, whose traceback holds its frames.
NAN_LOSS = '''
import torch
from torch import nn


class NanLoss(nn.Module):
    similarity = "cosine"

    def __init__(self, margin: float = 0.2):
        super().__init__()

    def forward(self, img, cap, image_ids=None, relevance=None):
        return (img * cap).sum() * float("nan")
'''


def _held(parts) -> dict:
    """Weak references to a run's large objects."""
    return {"parts": weakref.ref(parts), "model": weakref.ref(parts.network.model),
            "optimizer": weakref.ref(parts.optimization.optimizer), "source": weakref.ref(parts.data.source),
            "features": weakref.ref(parts.data.source.inputs._array),  # preload: the whole cache
            "captions": weakref.ref(parts.data.captions)}


def _alive(refs: dict) -> list[str]:
    return [name for name, ref in refs.items() if ref() is not None]


@pytest.fixture(scope="module")
def warmed(tiny_cache, tmp_path_factory):
    """One run first, collected as usual: a process's first run imports what torch imports lazily
    (torch._dynamo, at the first optimizer), and those imports' frames form cycles once, holding the
    frames that called them; every later run is measured alone."""
    train_run(tiny_cache, tmp_path_factory.mktemp("warm") / "run", epochs=1, preload=True)


@pytest.fixture
def no_collector(warmed):
    """Only reference counting frees memory: an object kept in a cycle stays (the test sees it)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def recorded_runs(monkeypatch):
    """Each run's weak references as it is built; a run built while an earlier one is still held
    is recorded in ``held_at_build``."""
    runs, held_at_build = [], []
    original = build.build_run

    def recording(*args, **kwargs):
        held_at_build.extend(name for refs in runs for name in _alive(refs))
        parts = original(*args, **kwargs)
        runs.append(_held(parts))
        return parts

    monkeypatch.setattr(build, "build_run", recording)
    return runs, held_at_build


def test_a_finished_run_is_freed_by_reference_counting(tiny_cache, tmp_path, no_collector):
    config = TrainConfig(features=str(tiny_cache), run_dir=str(tmp_path / "run"), epochs=1, preload=True,
                         **{k: v for k, v in TINY_TRAIN.items()})
    parts = build.build_run(config, **QUIET)
    refs = _held(parts)
    trainer = build.Trainer(parts)
    del parts
    trainer.fit()
    del trainer
    assert _alive(refs) == []  # nothing of the run points back at its trainer (a cycle)


def test_a_sweep_frees_each_run_before_the_next_a_failed_one_too(tiny_cache, tmp_path, no_collector,
                                                                   recorded_runs):
    (tmp_path / "nan_loss.py").write_text(NAN_LOSS)
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({
        "runs_dir": str(tmp_path / "runs"),
        "base": {"features": str(tiny_cache), "epochs": 1, "preload": True, "device": "cpu", **TINY_TRAIN},
        "grid": {"loss": ["sh", f"{tmp_path / 'nan_loss.py'}:NanLoss", "mh"]}}))
    sweep = run_sweep(load_sweep(path), echo=lambda *a: None, quiet_runs=True)
    assert [run.status for run in sweep.runs] == ["trained", "failed", "trained"]
    runs, held_at_build = recorded_runs
    assert len(runs) == 3
    assert held_at_build == []  # each run was gone before the next was built
    assert [_alive(refs) for refs in runs] == [[], [], []]


def test_a_tune_frees_each_trial_before_the_next_a_pruned_one_too(tiny_cache, tmp_path, no_collector,
                                                                    recorded_runs):
    pytest.importorskip("optuna")
    from pipeline.training.tune import Budget, Settings, load_tune, open_study, run_tune

    (tmp_path / "nan_loss.py").write_text(NAN_LOSS)
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump({
        "runs_dir": str(tmp_path / "runs"),
        "base": {"features": str(tiny_cache), "preload": True, "device": "cpu",
                 "loss": f"{tmp_path / 'nan_loss.py'}:NanLoss", **TINY_TRAIN},
        "search": {"margin": {"uniform": [0.05, 0.5]}}}))
    tune = load_tune(path)
    study, settings = open_study(tune, None, Budget(3, 1), None, None, "none", None)
    assert isinstance(settings, Settings)
    counted = run_tune(tune, study, settings, echo=lambda *a: None)
    assert counted["PRUNED"] == 3  # each trial diverged: an exception in Optuna's trial loop
    runs, held_at_build = recorded_runs
    assert len(runs) == 3
    assert held_at_build == []
    assert [_alive(refs) for refs in runs] == [[], [], []]
