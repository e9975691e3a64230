"""The run folder has an owner (pipeline.training.run_folder.RunFolder): a finished run is never overwritten
without --overwrite, which keeps the old files until the new run's first checkpoint is
complete; --resume knows a file by its identity, not its path; TensorBoard curves are written
live and continue without duplicate steps after a resume."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import QUIET, TINY_TRAIN, demo_captions, write_feature_cache

from cli.main import cli
from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.config import TrainConfig
from pipeline.core.errors import VseError
from pipeline.training.build import build_trainer
from pipeline.training.run_folder import DONE_MARKER, REPLACING, RunFolder
from pipeline.training.trainer import Trainer


def _config(cache, run_dir, **overrides) -> TrainConfig:
    return TrainConfig(features=str(cache), run_dir=str(run_dir), **{**TINY_TRAIN, **overrides})


def _files(run) -> dict:
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def _scalars(folder, tag) -> list[tuple[int, float]]:
    """(step, value) of ``tag`` as TensorBoard reads the event files (its own reader)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        return []
    return [(e.step, e.value) for e in events.Scalars(tag)]


def _train_cli(cache, run, *extra):
    args = ["train", "--features", cache, "--run-dir", run, "--epochs", 1, "--embed-dim", 16,
            "--word-dim", 8, "--batch-size", 16, "--min-word-count", 1, "--val-every", 0, "--workers", 0,
            "--device", "cpu", *extra]
    return CliRunner().invoke(cli, [str(a) for a in args])


# ---------------------------------------------------------------------------- never overwritten


def test_a_finished_run_survives_a_repeated_train_without_resume(tiny_cache, tmp_path):
    run = tmp_path / "run"
    assert _train_cli(tiny_cache, run, "--loss", "mh").exit_code == 0
    before = _files(run)
    assert "tb" in {name.split("/")[0] for name in before}  # the curves are part of the run
    result = _train_cli(tiny_cache, run, "--loss", "sh")  # even with another loss
    assert result.exit_code == 1
    assert result.output == (f"error: {run}: holds a run (config.json, metrics.jsonl, best.pt, last.pt): "
                             "continue it with --resume, replace it with --overwrite, or give another "
                             "--run-dir\n")
    assert _files(run) == before
    with pytest.raises(VseError, match="holds a run"):  # the library refuses too, not only the CLI
        build_trainer(_config(tiny_cache, run, loss="sh", epochs=1), **QUIET).fit()
    assert _files(run) == before
    both = _train_cli(tiny_cache, run, "--resume", "--overwrite")
    assert both.exit_code == 1 and "give one" in both.output


def test_overwrite_keeps_the_old_run_until_the_new_runs_first_checkpoint(tiny_cache, tmp_path, monkeypatch):
    run = tmp_path / "run"
    assert _train_cli(tiny_cache, run, "--loss", "mh").exit_code == 0
    (run / DONE_MARKER).write_text("{}")  # as a sweep leaves a finished run
    before = _files(run)
    # an --overwrite run stopped before its first checkpoint: every old file as it was
    calls = {"n": 0}
    original = Trainer.step

    def failing_step(self, batch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise VseError("stopped before the first checkpoint")
        return original(self, batch)

    monkeypatch.setattr(Trainer, "step", failing_step)
    result = _train_cli(tiny_cache, run, "--loss", "sh", "--overwrite")
    assert result.exit_code == 1 and "stopped before the first checkpoint" in result.output
    assert _files(run) == before
    monkeypatch.setattr(Trainer, "step", original)
    # a complete --overwrite run replaces them: its own config, log, checkpoints and curves
    result = _train_cli(tiny_cache, run, "--loss", "sh", "--overwrite", "--log-every", "1")
    assert result.exit_code == 0, result.output
    assert json.loads((run / "config.json").read_text())["loss"] == "sh"
    assert load_checkpoint(run / "last.pt")["train_config"]["loss"] == "sh"
    assert load_checkpoint(run / "best.pt")["train_config"]["loss"] == "sh"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [8]  # the new run's one validation, no old record
    assert not (run / DONE_MARKER).exists() and not (run / REPLACING).exists()
    old_events = {name for name in before if name.startswith("tb/")}
    assert old_events and not old_events & set(_files(run))  # the old curves went with the old run
    assert [step for step, _ in _scalars(run / "tb", "train/loss")] == list(range(1, 9))


def test_a_swap_cut_off_half_way_is_named_and_overwrite_mends_it(tiny_cache, tmp_path):
    run = tmp_path / "run"
    assert _train_cli(tiny_cache, run).exit_code == 0
    (run / REPLACING).write_text("replacing\n")  # what a kill during the swap leaves
    for extra in ((), ("--resume", "--epochs", 2)):
        result = _train_cli(tiny_cache, run, *extra)
        assert result.exit_code == 1 and "cut off while it replaced" in result.output
    assert _train_cli(tiny_cache, run, "--overwrite").exit_code == 0
    assert not (run / REPLACING).exists()


def test_an_attempt_without_a_checkpoint_is_not_a_run(tiny_cache, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text('{"iteration": 99, "rsum": 1.0, "epoch": 9}\n{"iter')  # torn
    assert _train_cli(tiny_cache, run).exit_code == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [8]  # the old attempt's log is gone


# ---------------------------------------------------------------------------- --resume by identity


def test_resume_knows_the_cache_by_identity_not_by_its_path(tiny_cache, tmp_path, monkeypatch):
    run = tmp_path / "run"
    build_trainer(_config(tiny_cache, run, loss="sh", epochs=1), **QUIET).fit()
    link = tmp_path / "link.h5"
    link.symlink_to(tiny_cache)
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(tiny_cache, moved / "tiny.h5")  # a copied (or moved) cache: same bytes, shards beside it
    shutil.copytree(tiny_cache.parent / "tiny.h5.shards", moved / "tiny.h5.shards")
    monkeypatch.chdir(tiny_cache.parent)
    said = []
    for epochs, path in enumerate(["tiny.h5", str(link), str(moved / "tiny.h5"), str(tiny_cache)], start=2):
        trainer = build_trainer(_config(path, run, loss="sh", epochs=epochs), resume=True,
                          given={"epochs", "features"}, echo=said.append)
        trainer.fit()
        assert trainer.cfg.features == path
    assert any("the same file as the run's" in line for line in said)
    assert load_checkpoint(run / "last.pt")["epoch"] == 5
    # another cache of the same shape and captions is another cache
    n = 40
    ids, captions = demo_captions(n)
    other = write_feature_cache(tmp_path / "other.h5", np.random.default_rng(5).standard_normal((n, 32)),
                                captions, np.repeat(np.arange(n), 5),
                                {"train": np.arange(24), "dev": np.arange(24, 32), "test": np.arange(32, 40)},
                                image_ids=ids)
    with pytest.raises(VseError, match="may not change features"):
        build_trainer(_config(other, run, loss="sh", epochs=6), resume=True,
                            given={"epochs", "features"}, **QUIET)


# ---------------------------------------------------------------------------- RunFolder's files


def test_run_folder_log_append_trim_torn_line_and_done_marker(tmp_path):
    folder = RunFolder(tmp_path / "r")
    folder.start(resume=False, overwrite=False)
    folder.prepare({"loss": "mh"})
    for iteration in (5, 10, 15):
        folder.append_record({"epoch": 1, "iteration": iteration, "rsum": float(iteration)})
    with open(folder.file("metrics.jsonl"), "a") as fh:
        fh.write('{"epoch": 2, "iteration": 2')  # a line cut short by a killed process
    assert [r["iteration"] for r in folder.records()] == [5, 10, 15]
    folder.trim_records(10)  # what a checkpoint at iteration 10 covers; the torn line goes too
    assert (folder.file("metrics.jsonl").read_text().splitlines()
            == ['{"epoch": 1, "iteration": 5, "rsum": 5.0}', '{"epoch": 1, "iteration": 10, "rsum": 10.0}'])
    assert folder.done() is None
    folder.mark_done({"epoch": 3, "best_rsum": 1.5})
    assert folder.done() == {"epoch": 3, "best_rsum": 1.5}
    assert json.loads(folder.file("config.json").read_text()) == {"loss": "mh"}


# ---------------------------------------------------------------------------- live curves


def test_curves_are_readable_while_the_run_trains(tiny_cache, tmp_path):
    run = tmp_path / "run"
    seen = {}

    def echo(line, *args, **kwargs):
        if line.startswith("[epoch 2"):  # the second validation: the first one's curves are on disk
            seen["val"] = _scalars(run / "tb", "val/rsum")
            seen["loss"] = _scalars(run / "tb", "train/loss")

    build_trainer(_config(tiny_cache, run, loss="sh", epochs=3), echo=echo).fit()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [step for step, _ in seen["val"]] == [8]  # while epoch 3 was still to come
    assert seen["val"][0][1] == pytest.approx(records[0]["rsum"], rel=1e-6)
    assert [step for step, _ in seen["loss"]][:8] == list(range(1, 9))
    assert {tag: len(_scalars(run / "tb", tag)) for tag in ("val/rsum", "val/i2t_r1", "train/loss",
                                                            "train/lr", "train/steps_per_s")} == {
        "val/rsum": 3, "val/i2t_r1": 3, "train/loss": 24, "train/lr": 24, "train/steps_per_s": 24}


def test_a_resumed_run_continues_its_curves_without_duplicate_steps(tiny_cache, tmp_path, monkeypatch):
    opts = dict(loss="sh", epochs=3, val_every=5)
    full = tmp_path / "full"
    build_trainer(_config(tiny_cache, full, **opts), **QUIET).fit()
    cut = tmp_path / "cut"
    original = Trainer.step

    def killed_at_13(self, batch):  # after the checkpoint of iteration 10, before the next
        if self.progress.iteration == 13:
            raise KeyboardInterrupt
        return original(self, batch)

    monkeypatch.setattr(Trainer, "step", killed_at_13)
    with pytest.raises(KeyboardInterrupt):
        build_trainer(_config(tiny_cache, cut, **opts), **QUIET).fit()
    assert max(step for step, _ in _scalars(cut / "tb", "train/loss")) == 13  # logged past the checkpoint
    monkeypatch.setattr(Trainer, "step", original)
    build_trainer(_config(tiny_cache, cut, **opts), resume=True, **QUIET).fit()
    assert len(os.listdir(cut / "tb")) == 2  # one event file per start
    for tag in ("train/loss", "val/rsum", "val/t2i_r5"):
        resumed, uninterrupted = _scalars(cut / "tb", tag), _scalars(full / "tb", tag)
        assert [s for s, _ in resumed] == [s for s, _ in uninterrupted]  # each step once
        np.testing.assert_allclose([v for _, v in resumed], [v for _, v in uninterrupted], rtol=1e-6)
    records = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    assert [v for _, v in _scalars(cut / "tb", "val/rsum")] == pytest.approx([r["rsum"] for r in records])
