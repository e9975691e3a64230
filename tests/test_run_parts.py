"""A run built in typed parts (issue 41): each part's settings are read once from the config
(training.settings), RunParts names real types, and the run folder has one owner (RunFolder:
claim, begin, held)."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.core.config import TrainConfig
from pipeline.core.errors import VseError
from pipeline.training import parts as parts_module
from pipeline.training.run_folder import RunFolder
from pipeline.training.settings import RunSettings, run_settings


def test_each_part_reads_its_settings_from_the_config_once():
    config = TrainConfig(features="x.h5", run_dir="r", loss="mh", margin=0.3, lr=1e-3, batch_size=16,
                         loss_options={"max_violation": False}, seed=7, log_every=3, workers=2)
    settings = run_settings(config)
    assert isinstance(settings, RunSettings)
    assert settings.loss.name == "mh" and settings.loss.options == {"max_violation": False, "margin": 0.3}
    assert settings.loss.loss_options == {"max_violation": False}  # without --margin: what was set by name
    assert (settings.optimizer.lr, settings.loop.batch_size, settings.loop.seed) == (1e-3, 16, 7)
    assert settings.data.workers == 2 and settings.data.dataset_options is None  # a cache: no reader
    assert settings.logging.log_every == 3 and settings.runtime.seed == 7
    assert settings.files["features"] == "x.h5" and "relevance" in settings.files
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.loop.epochs = 99


def test_run_parts_name_real_types():
    groups = [parts_module.RunParts, parts_module.Runtime, parts_module.RunData, parts_module.Objective,
              parts_module.Network, parts_module.Optimization]
    loose = [f"{g.__name__}.{f.name}" for g in groups for f in dataclasses.fields(g)
             if "object" in str(f.type).split(" | ") or str(f.type) == "object"]
    assert loose == []


def _a_run_in(path):
    path.mkdir()
    (path / "last.pt").write_bytes(b"")  # a run: what --resume continues
    return path


def test_the_folder_checks_once_and_lets_go_when_its_last_holder_is_done(tmp_path, monkeypatch):
    run = _a_run_in(tmp_path / "r")
    with pytest.raises(VseError, match="holds a run"), RunFolder(run).claim():
        pass
    folder = RunFolder(run, overwrite=True)
    checks = []
    original = RunFolder.start
    monkeypatch.setattr(RunFolder, "start", lambda self, *a: (checks.append(a), original(self, *a)))
    with folder.claim():
        assert (run / ".lock").exists()
        with folder.held():  # the Trainer's fit, inside the command's claim: asks, checks nothing again
            pass
        assert (run / ".lock").exists()  # the claim still holds it
        folder.begin()
    assert checks == [(False, True)] and not (run / ".lock").exists()


def test_a_new_folder_is_begun_by_the_training_not_by_the_claim(tmp_path):
    folder = RunFolder(tmp_path / "new")
    with folder.claim():
        assert not folder.path.exists()  # a refused or failed build leaves no folder behind
    with folder.held():
        assert (folder.path / ".lock").exists()
    assert folder.path.is_dir() and not (folder.path / ".lock").exists()
    with pytest.raises(VseError, match="no last.pt"):
        RunFolder(tmp_path / "new", resume=True).begin()
